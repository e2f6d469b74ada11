"""s3: the S3 requests that fsspec has no method for, each one call with its conditions.

Conditional writes are what make publishing safe on a store without renames or locks:
``If-None-Match: *`` creates an object only if the key is free (a release version, a lock),
``If-Match: <ETag>`` replaces or deletes an object only if it is still the one read (the
pointer, a stale lock). A refused condition is ``Precondition``; the callers say what it means.
Uploads go in parts (multipart) from a local file; one that fails midway is aborted, so the key
never shows a partial object (a killed process leaves an incomplete multipart upload, invisible
to readers, which a bucket lifecycle rule removes).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5etl.remote.errors import RemoteError
from h5etl.remote.filesystem import FileSystem, client_code, filesystem, problem, run
from h5etl.remote.location import Location

__all__ = [
    "DEFAULT_PART_SIZE",
    "Digests",
    "Precondition",
    "Stored",
    "delete",
    "digests",
    "get",
    "head",
    "put",
    "upload_file",
]

DEFAULT_PART_SIZE = 64 * 2**20  # S3 takes 5 MiB to 5 GiB per part, at most 10,000 parts
PART_CONCURRENCY = 4  # parts in flight at once (and in memory: 4 x 64 MiB)
_REFUSED = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING = {"NoSuchKey", "404", "NotFound", "NoSuchVersion"}


class Precondition(Exception):
    """The store refused a conditional request: the key is taken, or no longer as read."""


@dataclass(frozen=True, slots=True)
class Stored:
    """An object as the store holds it: its ETag (no quotes), version, size and metadata."""

    etag: str
    version_id: str | None
    size: int
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Digests:
    """A local file's size, SHA-256, and the ETag S3 gives it when uploaded in ``part_size``
    parts (the MD5 of its bytes in one part; else the MD5 of its parts' MD5s, ``-<parts>``)."""

    size: int
    sha256: str
    etag: str
    part_size: int


def digests(path: Path, part_size: int = DEFAULT_PART_SIZE) -> Digests:
    """Hash ``path`` once: its SHA-256 and the ETag its upload will have."""
    sha = hashlib.sha256()
    parts = []
    size = 0
    for chunk in _parts(path, part_size):
        sha.update(chunk)
        parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
        size += len(chunk)
    if len(parts) <= 1:  # one PUT: the MD5 of the bytes
        etag = (parts[0] if parts else hashlib.md5(b"", usedforsecurity=False).digest()).hex()
    else:
        etag = f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
    return Digests(size, sha.hexdigest(), etag, part_size)


def _parts(path: Path, part_size: int) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(part_size):
            yield chunk


def head(location: Location, version_id: str | None = None) -> Stored | None:
    """The object at ``location`` as stored now, or None if there is none."""
    fs = filesystem(location)
    ask = {"VersionId": version_id} if version_id else {}
    try:
        out = _call(fs, "head_object", location, **ask)
    except Exception as exc:
        if client_code(exc) in _MISSING or isinstance(exc, FileNotFoundError):
            return None
        raise problem(exc, location, "read") from exc
    return _stored(out, int(out.get("ContentLength", 0)))


def get(location: Location) -> tuple[bytes, Stored] | None:
    """A small object's bytes and how it is stored (read in one request), or None."""
    fs = filesystem(location)
    try:
        return run(fs, _get, fs, location)
    except Exception as exc:
        if client_code(exc) in _MISSING or isinstance(exc, FileNotFoundError):
            return None
        raise problem(exc, location, "read") from exc


async def _get(fs: FileSystem, location: Location) -> tuple[bytes, Stored]:
    out = await fs._call_s3("get_object", Bucket=location.bucket, Key=location.key)
    body = out["Body"]
    try:
        data: bytes = await body.read()
    finally:
        body.close()
    return data, _stored(out, len(data))


def put(
    location: Location,
    data: bytes,
    *,
    if_none_match: bool = False,
    if_match: str | None = None,
    content_type: str = "application/json",
) -> Stored:
    """Write the small object ``data`` at ``location`` in one request: only if the key is free
    (``if_none_match``), or only if it still has the ETag ``if_match``.

    Raises:
        Precondition: the condition failed; nothing was written.
    """
    ask: dict[str, Any] = {"ContentType": content_type}
    if if_none_match:
        ask["IfNoneMatch"] = "*"
    if if_match:
        ask["IfMatch"] = f'"{if_match}"'
    out = _conditional(location, "put", "put_object", Body=data, **ask)
    return _stored(out, len(data))


def delete(location: Location, *, if_match: str | None = None) -> None:
    """Delete the object at ``location`` (only if it still has the ETag ``if_match``); a key
    already gone is fine.

    Raises:
        Precondition: the object is no longer the one read; nothing was deleted.
    """
    ask = {"IfMatch": f'"{if_match}"'} if if_match else {}
    try:
        _conditional(location, "delete", "delete_object", **ask)
    except RemoteError as exc:
        if client_code(exc) not in _MISSING:
            raise


def upload_file(
    local: Path, location: Location, *, part_size: int, metadata: dict[str, str]
) -> Stored:
    """Upload ``local`` to the free key ``location`` (``If-None-Match: *``), in parts of
    ``part_size`` when it is larger, with ``metadata``. A failure midway aborts the upload.

    Raises:
        Precondition: the key is taken; nothing was written.
        RemoteError: the store failed the upload; nothing was written.
    """
    size = local.stat().st_size
    if size <= part_size:
        out = _conditional(
            location,
            "upload",
            "put_object",
            Body=local.read_bytes(),
            IfNoneMatch="*",
            Metadata=metadata,
            ContentType="application/x-hdf5",
        )
        return _stored(out, size, metadata)
    started = _conditional(
        location,
        "upload",
        "create_multipart_upload",
        Metadata=metadata,
        ContentType="application/x-hdf5",
    )
    upload_id = started["UploadId"]
    try:
        parts = _send_parts(local, location, upload_id, part_size)
        out = _conditional(
            location,
            "upload",
            "complete_multipart_upload",
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            IfNoneMatch="*",
        )
    except BaseException:  # a KeyboardInterrupt too: leave no upload behind
        with contextlib.suppress(Exception):
            _call(filesystem(location), "abort_multipart_upload", location, UploadId=upload_id)
        raise
    return _stored(out, size, metadata)


def _send_parts(local: Path, location: Location, upload_id: str, part_size: int) -> list[Any]:
    """Send the parts of ``local``, ``PART_CONCURRENCY`` at a time (one request's round trip
    would otherwise bound the throughput); at most that many parts are held in memory."""
    etags: dict[int, str] = {}
    with ThreadPoolExecutor(PART_CONCURRENCY, thread_name_prefix="h5etl-upload") as pool:
        pending: set[Future[str]] = set()
        numbers: dict[Future[str], int] = {}
        for number, chunk in enumerate(_parts(local, part_size), start=1):
            if len(pending) >= PART_CONCURRENCY:
                _collect(wait(pending, return_when=FIRST_COMPLETED).done, pending, numbers, etags)
            future = pool.submit(send_part, location, upload_id, number, chunk)
            pending.add(future)
            numbers[future] = number
        _collect(wait(pending).done, pending, numbers, etags)
    return [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]


def _collect(
    done: set[Future[str]],
    pending: set[Future[str]],
    numbers: dict[Future[str], int],
    etags: dict[int, str],
) -> None:
    for future in done:
        pending.discard(future)
        etags[numbers.pop(future)] = future.result()  # a failed part raises here


def send_part(location: Location, upload_id: str, number: int, chunk: bytes) -> str:
    """Upload part ``number`` of a multipart upload; its ETag."""
    out = _conditional(
        location, "upload", "upload_part", UploadId=upload_id, PartNumber=number, Body=chunk
    )
    return str(out["ETag"])


def _conditional(location: Location, doing: str, method: str, **kw: Any) -> dict[str, Any]:
    try:
        return _call(filesystem(location), method, location, **kw)
    except Exception as exc:
        code = client_code(exc)
        if code in _REFUSED or isinstance(exc, FileExistsError):
            raise Precondition(location.url) from exc
        if method == "put_object" and "IfMatch" in kw and code in _MISSING:
            raise Precondition(location.url) from exc  # AWS: If-Match on a deleted key is 404
        if isinstance(exc, RemoteError):
            raise
        raise problem(exc, location, doing) from exc


def _call(fs: FileSystem, method: str, location: Location, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = fs.call_s3(method, Bucket=location.bucket, Key=location.key, **kw)
    return out


def _stored(out: dict[str, Any], size: int, metadata: dict[str, str] | None = None) -> Stored:
    version = out.get("VersionId")
    return Stored(
        etag=str(out.get("ETag", "")).strip('"'),
        version_id=str(version) if version and version != "null" else None,
        size=size,
        metadata=dict(out.get("Metadata") or metadata or {}),
    )
