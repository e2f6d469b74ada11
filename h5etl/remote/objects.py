"""objects: list the objects under a Location with their stamps, and read their bytes.

A listing gives plain records (``RemoteObject``): the object, its size and its stamp, which for
object storage is its ETag (and VersionId in a versioned bucket), never a modification time, so
an incremental build sees an object as changed exactly when its bytes are. A read gets the bytes
the listing saw or fails: on S3 the request names the listed version, or carries
``If-Match: <ETag>``, so the server itself refuses a changed object; on other protocols the stamp
is compared before and after the read. A changed object is ``RemoteChanged``, naming the URL.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from h5etl.remote import buckets, direct
from h5etl.remote.errors import RemoteChanged, RemoteError, object_changed
from h5etl.remote.filesystem import (
    FileSystem,
    check_installed,
    client_code,
    filesystem,
    problem,
    run,
)
from h5etl.remote.location import Location

__all__ = [
    "Reading",
    "RemoteObject",
    "list_objects",
    "reachable",
    "read_ahead",
    "read_bytes",
    "read_many",
    "stat_object",
]

_CHANGED_CODES = {"PreconditionFailed", "NoSuchVersion", "NoSuchKey", "412", "404"}
# A server without ListObjectVersions (s3rver, Cloudflare R2) answers a versioned listing so
_NO_VERSIONS = {"MethodNotAllowed", "NotImplemented", "405", "501"}


@dataclass(frozen=True, slots=True)
class RemoteObject:
    """One object as listed: where, how many bytes, and its stamp.

    ``etag`` is the store's ETag (quotes kept off); ``version_id`` its VersionId in a versioned
    S3 bucket, else None; ``mtime_ns`` is set for local files only (their one stamp).
    """

    location: Location
    size: int
    etag: str | None = None
    version_id: str | None = None
    mtime_ns: int | None = None

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def stamp(self) -> str:
        """What an incremental build compares: the ETag and version, else the local mtime."""
        if self.etag is None and self.version_id is None:
            return f"size={self.size};mtime_ns={self.mtime_ns}"
        version = f";version={self.version_id}" if self.version_id else ""
        return f"size={self.size};etag={self.etag}{version}"


def list_objects(folder: Location, pattern: str = "*") -> list[RemoteObject]:
    """The objects under ``folder`` whose key relative to it matches ``pattern``, sorted by key.

    ``pattern`` is an ``fnmatch`` pattern whose ``*`` also crosses ``/`` (``*.png`` matches
    ``a/b.png``). An empty or missing prefix lists nothing; a missing bucket is an error.

    Raises:
        RemoteUsageError: no such bucket, or the credentials are refused (exit code 2).
        RemoteError: the server failed the request.
    """
    if folder.protocol == "s3":  # a missing bucket would list as empty: ask for it first
        _check_bucket(folder)  # the config's load asked a moment ago: answered from there
        quick = _listed_directly(folder)
        if quick is not None:
            return _matching(folder, quick, pattern)
    fs = filesystem(folder)
    try:
        found = _find(fs, folder)
    except Exception as exc:  # OSErrors, and botocore's own (no credentials) that are not
        raise problem(exc, folder, "list") from exc
    objects = [
        _record(folder, info, fs) for info in found.values() if info.get("type", "file") == "file"
    ]
    return _matching(folder, objects, pattern)


def _matching(folder: Location, objects: list[RemoteObject], pattern: str) -> list[RemoteObject]:
    """Those of ``objects`` whose key relative to ``folder`` matches ``pattern``, by key."""
    kept = [o for o in objects if fnmatch.fnmatchcase(folder.relative(o.location), pattern)]
    return sorted(kept, key=lambda o: o.location.key)


def _listed_directly(folder: Location) -> list[RemoteObject] | None:
    """The objects under ``folder`` listed through obstore (``direct.list_keys``), or None:
    s3fs lists them. botocore's parsing of each listing page cost the build's parent 70-85 us
    an object (0.2-0.6 CPU-s for 3,000 objects from s3rver), obstore's 4 us: for a bucket of a
    million objects, a minute before the first decode. Only where it lists exactly what s3fs
    would: a bucket that never had versioning (no VersionIds to pin), and no empty object in
    the listing (obstore drops a folder marker's trailing ``/``, which s3fs leaves out).

    The versioning is asked meanwhile, in a thread: the same wait on the server, and s3fs,
    which asks it, loads there (0.17 s of CPU) while obstore's requests leave the GIL free.
    A bucket that may hold versions stops the listing and throws it away."""
    if not direct.enabled():
        return None
    with ThreadPoolExecutor(1, thread_name_prefix="h5etl-versioning") as helper:
        versions = helper.submit(
            buckets.may_hold_versions, folder.bucket, lambda: _versioned(folder)
        )
        try:  # a versioned bucket of a million objects: stopped after a page or two
            listed = direct.list_keys(
                folder.bucket, folder.key, stop=lambda: versions.done() and versions.result()
            )
        except Exception:  # s3fs lists it again, and words what fails
            return None
        if versions.result() or listed is None or any(size == 0 for _, size, _ in listed):
            return None
    return [
        RemoteObject(Location("s3", folder.bucket, key), size, etag or None, None)
        for key, size, etag in listed
    ]


def _versioned(folder: Location) -> bool:
    """Whether ``folder``'s bucket's versioning is, or was, on (or cannot be asked: as if)."""
    fs = filesystem(folder)
    try:
        answer = run(fs, fs._call_s3, "get_bucket_versioning", Bucket=folder.bucket)
    except Exception:
        return True
    return bool(answer.get("Status"))  # "Enabled" or "Suspended": objects may have versions


def _check_bucket(folder: Location) -> None:
    """That ``folder``'s bucket exists and the credentials may list it, asked once for a
    build's start (``buckets``): an obstore listing of one key, without loading s3fs (0.17 s
    of CPU before a build's first task); s3fs's HeadBucket where obstore is not installed or
    fails, and words what fails.

    Raises:
        RemoteUsageError: no such bucket, refused credentials, the extra missing (exit 2).
        RemoteError: the server failed the request.
    """
    check_installed(folder)  # without s3fs a build fails later: say so now (exit 2)

    def ask() -> None:
        if direct.enabled():
            with contextlib.suppress(Exception):
                if direct.any_key(folder.bucket, folder.key) is not None:
                    return
        filesystem(folder).info(folder.bucket)

    try:
        buckets.check_exists(folder.bucket, ask)
    except Exception as exc:
        raise problem(exc, folder, "list", f"no such bucket {folder.bucket!r}") from exc


def _find(fs: FileSystem, folder: Location) -> dict[str, dict[str, Any]]:
    """fsspec's detailed listing of every object under ``folder``; on S3 with VersionIds, or
    without them where the server lists no versions (the reads then carry If-Match alone)."""
    try:
        found: dict[str, dict[str, Any]] = fs.find(folder.fs_path, detail=True, withdirs=False)
    except Exception as exc:
        if folder.protocol != "s3" or client_code(exc) not in _NO_VERSIONS:
            raise
        fs = filesystem(folder, versioned=False)
        found = fs.find(folder.fs_path, detail=True, withdirs=False)
    return found


def reachable(folder: Location) -> None:
    """Check that ``folder`` can be listed, with one request: its bucket exists and the
    credentials are accepted (S3: the bucket asked for; elsewhere a listing of the folder).

    Raises:
        RemoteUsageError: no such bucket, refused credentials, the extra missing (exit 2).
        RemoteError: the server failed the request.
    """
    if folder.protocol == "s3":
        _check_bucket(folder)  # sources in one bucket: one request
        return
    fs = filesystem(folder)  # a backend not installed: its own one line (exit 2)
    try:
        fs.ls(folder.fs_path, detail=False)
    except Exception as exc:
        raise problem(exc, folder, "list", f"no such bucket {folder.bucket!r}") from exc


def stat_object(location: Location) -> RemoteObject:
    """One object's record, asked of the store now (size, ETag, version)."""
    fs = filesystem(location)
    try:
        # s3fs would answer from its listings cache; ask the store
        refresh = {"refresh": True} if location.protocol == "s3" else {}
        info = fs.info(location.fs_path, **refresh)
    except Exception as exc:
        raise problem(exc, location, "read") from exc
    return _record(location.parent(), info, fs, location)


def read_bytes(obj: RemoteObject, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes ``[start, end)`` of ``obj`` (all of them by default), as listed.

    Raises:
        RemoteChanged: the object was changed, replaced or deleted since it was listed.
        RemoteError: the server failed the request.
    """
    fs = filesystem(obj.location)
    if obj.location.protocol == "s3":
        return _read_s3(fs, obj, start, end)
    try:
        data: bytes = fs.cat_file(obj.location.fs_path, start=start, end=end)
        now = stat_object(obj.location)
    except RemoteError as exc:
        raise _changed(obj, "it is gone") from exc
    except Exception as exc:
        raise problem(exc, obj.location, "read") from exc
    if now.stamp != obj.stamp:
        raise _changed(obj, f"listed as {obj.stamp}, now {now.stamp}")
    return data


def read_many(objects: Sequence[RemoteObject], concurrency: int = 16) -> list[bytes | RemoteError]:
    """All bytes of each of ``objects`` as listed, in order, or the error its read met
    (``RemoteChanged`` among them): ``read_ahead``, waited for."""
    return [reading.wait() for reading in read_ahead(objects, concurrency)]


class Reading:
    """One object's bytes on their way (``read_ahead``): ``wait`` gives them, or the error
    their read met; ``cancel`` drops a read not yet sent."""

    __slots__ = ("_future", "_got", "obj")

    def __init__(
        self,
        obj: RemoteObject,
        got: bytes | RemoteError | None = None,
        future: Future[bytes | RemoteError | None] | None = None,
    ):
        self.obj = obj
        self._got = got
        self._future = future

    def wait(self) -> bytes | RemoteError:
        if self._future is not None:
            self._got, self._future = self._future.result(), None
            if self._got is None:  # obstore found no credentials: s3fs says so in its words
                self._got = _or_error(self.obj)
        assert self._got is not None
        return self._got

    def cancel(self) -> None:
        if self._future is not None:
            self._future.cancel()


def read_ahead(objects: Sequence[RemoteObject], concurrency: int = 16) -> list[Reading]:
    """Start reading each of ``objects`` as listed: on S3 ``concurrency`` requests at a time,
    so a worker waits for one round trip per batch instead of one per object. Through
    obstore (``direct``) the reads go on while the caller takes the first ones (a worker
    decodes the first samples of its task while the rest arrive); through s3fs, and
    elsewhere (one by one), they are all done when this returns."""
    if not objects:
        return []
    if any(obj.location.protocol != "s3" for obj in objects):
        return [Reading(obj, _or_error(obj)) for obj in objects]
    if direct.enabled():  # obstore: a ninth of s3fs's CPU per GET, on the decoding cores
        futures = direct.get_each(objects, concurrency)
        return [Reading(obj, future=future) for obj, future in zip(objects, futures, strict=True)]
    fs = filesystem(objects[0].location)
    found: list[bytes | RemoteError] = run(fs, _get_all, fs, objects, concurrency)
    return [Reading(obj, got) for obj, got in zip(objects, found, strict=True)]


def _or_error(obj: RemoteObject) -> bytes | RemoteError:
    try:
        return read_bytes(obj)
    except RemoteError as exc:
        return exc


async def _get_all(
    fs: FileSystem, objects: Sequence[RemoteObject], concurrency: int
) -> list[bytes | RemoteError]:
    import asyncio  # here: 15-30 ms of imports every local build's processes would pay

    gate = asyncio.Semaphore(concurrency)

    async def one(obj: RemoteObject) -> bytes | RemoteError:
        async with gate:
            try:
                where = obj.location
                return await _get_object(fs, where.bucket, where.key, _ask(obj, None, None))
            except Exception as exc:
                return _read_error(obj, exc)

    return list(await asyncio.gather(*(one(obj) for obj in objects)))


def _read_error(obj: RemoteObject, exc: Exception) -> RemoteError:
    if client_code(exc) in _CHANGED_CODES:
        return _changed(obj, "its ETag or version is no longer the listed one")
    return problem(exc, obj.location, "read")


def _ask(obj: RemoteObject, start: int | None, end: int | None) -> dict[str, str]:
    """The GetObject parameters that read ``obj`` as listed (its version, or If-Match)."""
    ask: dict[str, str] = {}
    if obj.version_id:
        ask["VersionId"] = obj.version_id  # that version's bytes, whatever came after
    if obj.etag:
        ask["IfMatch"] = f'"{obj.etag}"'
    if start is not None or end is not None:
        first = start or 0
        last = obj.size if end is None else min(end, obj.size)
        # an empty range: no request (S3 has no empty Range)
        ask["Range"] = f"bytes={first}-{last - 1}" if last > first else ""
    return ask


def _read_s3(fs: FileSystem, obj: RemoteObject, start: int | None, end: int | None) -> bytes:
    ask = _ask(obj, start, end)
    if ask.get("Range") == "":
        return b""
    try:
        return run(fs, _get_object, fs, obj.location.bucket, obj.location.key, ask)
    except Exception as exc:
        raise _read_error(obj, exc) from exc


async def _get_object(fs: FileSystem, bucket: str, key: str, ask: dict[str, str]) -> bytes:
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ask)
    body = response["Body"]
    try:
        data: bytes = await body.read()
    finally:
        body.close()
    return data


def _changed(obj: RemoteObject, how: str) -> RemoteChanged:
    return object_changed(obj.url, how)


def _record(
    folder: Location, info: dict[str, Any], fs: FileSystem, at: Location | None = None
) -> RemoteObject:
    """A listing entry (fsspec's info dict) as a RemoteObject."""
    if at is None:
        at = _location_of(folder, str(info["name"]), fs)
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    version = info.get("VersionId") or info.get("generation")
    if at.is_local:
        return RemoteObject(at, int(info["size"]), mtime_ns=int(info["mtime"] * 1e9))
    return RemoteObject(
        at,
        int(info["size"]),
        etag=str(etag).strip('"') if etag else None,
        version_id=str(version) if version and version != "null" else None,
    )


def _location_of(folder: Location, name: str, fs: FileSystem) -> Location:
    """The Location of a listed ``name`` (fsspec's path: bucket/key, or a local path)."""
    if folder.is_local:
        return Location("file", "", name)
    if folder.protocol in ("https", "http"):
        return Location(folder.protocol, folder.bucket, name.split("://", 1)[-1].split("/", 1)[1])
    path = fs._strip_protocol(name)
    bucket, _, key = path.partition("/")
    return Location(folder.protocol, bucket, key)
