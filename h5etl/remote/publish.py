"""publish: put a finished release on object storage and point readers at it.

A bucket has no rename and no symlink, so a release is published in two steps:

1. the finished local file is uploaded under its versioned name (``cells-v0007.h5``) with
   ``If-None-Match: *`` (a version is never overwritten), multipart when large, its SHA-256 in
   the object's metadata (``x-amz-meta-sha256``); then checked: the size, and the ETag the
   store computed against the one computed here from the same parts (MD5s of the bytes);
2. the pointer ``cells.h5.json`` is replaced, with ``If-Match`` on the pointer read before
   (``If-None-Match: *`` for the first), by a small JSON object naming that file, its SHA-256,
   size, ETag and VersionId (``Pointer``).

A reader resolves ``cells.h5`` with one GET of the pointer and pins the file's ETag (or
VersionId) for its life. A build killed before step 2 publishes nothing: the pointer still names
the previous release (the uploaded version is listed, never pointed at, and pruned like any
other). The caller holds the build lock (``h5etl.remote.lock``) around it all. Only ``s3://``
outputs for now; the pure functions here are what the CLI's ``releases``, ``rollback`` and
``prune`` call for a URL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

from h5etl.errors import ReleaseError, ReleaseUsageError
from h5etl.remote import s3
from h5etl.remote.errors import RemoteUsageError
from h5etl.remote.filesystem import filesystem, problem
from h5etl.remote.location import Location
from h5etl.remote.objects import RemoteObject, list_objects, read_bytes, stat_object

__all__ = [
    "POINTER_SUFFIX",
    "Pointer",
    "pin",
    "pointer_location",
    "publish",
    "read_pointer",
    "release_filename",
    "resolve",
    "rollback",
    "upload_release",
    "versions",
]

logger = logging.getLogger(__name__)

POINTER_SUFFIX = ".h5.json"  # cells.h5.json points at cells-v0007.h5
POINTER_FORMAT = 1
# The same names as a local release folder (h5etl.release.naming; a test pins them alike:
# this module sits below the release folder in the layers and cannot import it)
_VERSION = re.compile(r"^(?P<name>.+)-v(?P<version>\d{4,})\.h5$")


@dataclass(frozen=True, slots=True)
class Pointer:
    """What ``<name>.h5.json`` holds: the release that ``<name>.h5`` means now."""

    name: str
    version: int
    file: str  # the versioned object's name, beside the pointer
    size: int
    sha256: str
    etag: str
    version_id: str | None
    published: str  # ISO 8601, UTC

    def to_json(self) -> bytes:
        record = {"h5etl": "release-pointer", "format": POINTER_FORMAT, **asdict(self)}
        return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: Location) -> Pointer:
        """The pointer in ``data``, read from ``where``.

        Raises:
            ReleaseError: not an h5etl pointer, or one of a newer format.
        """
        try:
            record = json.loads(data)
            if record.get("h5etl") != "release-pointer":
                raise ValueError("not an h5etl release pointer")
            if record.get("format") != POINTER_FORMAT:
                raise ValueError(f"pointer format {record.get('format')} (this h5etl reads 1)")
            return cls(**{f.name: record[f.name] for f in fields(cls)})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReleaseError(f"not a readable release pointer: {exc}", path=where.url) from exc

    def location(self, output: Location) -> Location:
        """The versioned object this pointer names, in the folder ``output``."""
        return output.child(self.file)


def release_filename(name: str, version: int) -> str:
    return f"{name}-v{version:04d}.h5"


def pointer_location(output: Location, name: str) -> Location:
    """Where the pointer of the release ``name`` is kept: ``<output>/<name>.h5.json``."""
    return output.child(name + POINTER_SUFFIX)


def versions(output: Location, name: str) -> dict[int, RemoteObject]:
    """The uploaded releases of ``name`` in ``output`` (pointed at or not), by version."""
    found = {}
    for obj in list_objects(output, f"{name}-v*.h5"):
        match = _VERSION.match(output.relative(obj.location))
        if match and match["name"] == name:
            found[int(match["version"])] = obj
    return dict(sorted(found.items()))


def read_pointer(output: Location, name: str) -> Pointer | None:
    """The release ``<name>.h5`` means now, or None before the first is published."""
    found = _read_pointer(output, name)
    return found[0] if found else None


def _read_pointer(output: Location, name: str) -> tuple[Pointer, str] | None:
    where = pointer_location(output, name)
    got = s3.get(where)
    if got is None:
        return None
    return Pointer.from_json(got[0], where), got[1].etag


def resolve(location: Location) -> RemoteObject:
    """The release a reader opens for ``location``, pinned: for ``.../cells.h5``, the file its
    pointer ``cells.h5.json`` names (one GET), with the size, ETag and version it was published
    with; a versioned name (``cells-v0007.h5``) as it is now.

    Raises:
        ReleaseUsageError: no pointer and no such release (exit code 2).
        ReleaseError: the pointer is not readable.
    """
    if _VERSION.match(location.name):
        return stat_object(location)
    got = s3.get(location.parent().child(location.name + ".json"))
    if got is None:
        raise ReleaseUsageError(
            f"no release published there (no pointer {location.name}.json)", path=location.url
        )
    pointer = Pointer.from_json(got[0], location)
    return RemoteObject(
        pointer.location(location.parent()),
        pointer.size,
        etag=pointer.etag,
        version_id=pointer.version_id,
    )


def pin(location: Location) -> tuple[RemoteObject, str | None]:
    """What ``resolve`` gives, with the SHA-256 of the file's bytes when known (the pointer's,
    or the upload's ``sha256`` metadata for a versioned name): the name of a disk cache.

    Raises:
        ReleaseUsageError: no pointer and no such release (exit code 2).
        RemoteUsageError: no such bucket or object, or the credentials are refused.
        ReleaseError: the pointer is not readable.
    """
    if location.protocol != "s3":
        return stat_object(location), None
    if not _VERSION.match(location.name):
        got = s3.get(location.parent().child(location.name + ".json"))
        if got is None:
            _require_bucket(location)  # s3fs answers a missing bucket as a missing key
            raise ReleaseUsageError(
                f"no release published there (no pointer {location.name}.json)",
                path=location.url,
            )
        pointer = Pointer.from_json(got[0], location)
        obj = RemoteObject(
            pointer.location(location.parent()),
            pointer.size,
            etag=pointer.etag,
            version_id=pointer.version_id,
        )
        return obj, pointer.sha256
    stored = s3.head(location)
    if stored is None:
        stat_object(location)  # the one-line error: no such bucket, or no such object
        raise ReleaseUsageError("no such release", path=location.url)  # pragma: no cover
    obj = RemoteObject(location, stored.size, etag=stored.etag, version_id=stored.version_id)
    return obj, stored.metadata.get("sha256")


def _require_bucket(location: Location) -> None:
    """Raise the one-line error for a bucket that is not there (or not ours to read)."""
    fs = filesystem(location)
    try:
        fs.info(location.bucket)
    except Exception as exc:
        raise problem(exc, location, "read", f"no such bucket {location.bucket!r}") from exc


def upload_release(
    local: Path, target: Location, *, part_size: int = s3.DEFAULT_PART_SIZE
) -> tuple[s3.Stored, s3.Digests]:
    """Upload the finished release ``local`` to the free key ``target`` and check it arrived
    whole; the object as stored, and the local file's digests.

    Raises:
        ReleaseError: the key is taken, or the stored object is not the local file (it is
            deleted again); nothing was published.
    """
    digests = s3.digests(local, part_size)
    try:
        stored = s3.upload_file(
            local, target, part_size=part_size, metadata={"sha256": digests.sha256}
        )
    except s3.Precondition as exc:
        raise ReleaseError(
            "that release version is already uploaded (another build?); nothing was published",
            path=target.url,
        ) from exc
    _verify(target, digests)
    return stored, digests


def _verify(target: Location, digests: s3.Digests) -> None:
    """Check the stored object is the local file; delete it and fail if not."""
    stored = s3.head(target)
    problem = ""
    if stored is None:
        problem = "it is not there after the upload"
    elif stored.size != digests.size:
        problem = f"{stored.size} bytes stored, {digests.size} sent"
    elif stored.metadata.get("sha256") != digests.sha256:
        problem = "its sha256 metadata is not the file's"
    elif stored.etag != digests.etag and _sha256_of(target, stored) != digests.sha256:
        # an ETag that is not the MD5 (SSE-KMS) makes us read the object back once
        problem = "its bytes differ from the local file's"
    if problem:
        if stored is not None:
            s3.delete(target, if_match=stored.etag)
        raise ReleaseError(
            f"the upload is not the release ({problem}); nothing was published", path=target.url
        )


def _sha256_of(target: Location, stored: s3.Stored) -> str:
    obj = RemoteObject(target, stored.size, etag=stored.etag, version_id=stored.version_id)
    sha = hashlib.sha256()
    step = s3.DEFAULT_PART_SIZE
    for start in range(0, stored.size, step):
        sha.update(read_bytes(obj, start, start + step))
    return sha.hexdigest()


def publish(
    local: Path,
    output: Location,
    name: str,
    *,
    version: int | None = None,
    companions: Mapping[str, Path] | None = None,
    part_size: int = s3.DEFAULT_PART_SIZE,
) -> Pointer:
    """Upload the finished release ``local`` as ``version`` (by default the next) of ``name``
    in ``output``, then the ``companions`` (file name -> local file: its rejects report, build
    facts) beside it, then point ``<name>.h5`` at it: a published release always has its
    companions. The caller holds the build lock of ``name``.

    Raises:
        RemoteUsageError: ``output`` is not an ``s3://`` folder (exit code 2).
        ReleaseError: the upload or the pointer failed; the pointer names what it named.
    """
    _check_output(output)
    before = _read_pointer(output, name)
    if version is None:
        version = max(versions(output, name), default=0) + 1
    target = output.child(release_filename(name, version))
    stored, digests = upload_release(local, target, part_size=part_size)
    for filename, path in (companions or {}).items():
        s3.put(output.child(filename), path.read_bytes())
    pointer = _pointer(name, version, target, stored, digests.sha256)
    write_pointer(output, pointer, replaces=before[1] if before else None)
    logger.info("published %s as %s", target.url, pointer_location(output, name).url)
    return pointer


def write_pointer(output: Location, pointer: Pointer, *, replaces: str | None) -> None:
    """Point ``<name>.h5`` at ``pointer``: replace the pointer whose ETag is ``replaces`` (or
    create the first one when None), and only that one.

    Raises:
        ReleaseError: the pointer changed since it was read (a rollback meanwhile).
    """
    where = pointer_location(output, pointer.name)
    try:
        s3.put(where, pointer.to_json(), if_match=replaces, if_none_match=replaces is None)
    except s3.Precondition as exc:
        raise ReleaseError(
            f"the pointer changed while version {pointer.version} was being published (a "
            f"rollback or another build?); it was left as it is: see `h5etl releases`",
            path=where.url,
        ) from exc


def rollback(output: Location, name: str, version: int) -> Pointer:
    """Point ``<name>.h5`` at the uploaded ``version`` (older or newer than the current).

    Raises:
        ReleaseUsageError: there is no such version (exit code 2).
        ReleaseError: the version's object was not uploaded by h5etl (no sha256 metadata).
    """
    _check_output(output)
    existing = versions(output, name)
    if version not in existing:
        have = ", ".join(str(v) for v in existing) or "none"
        raise ReleaseUsageError(
            f"no version {version} of {name!r} to roll back to (versions: {have})",
            path=output.url,
        )
    target = existing[version].location
    stored = s3.head(target)
    if stored is None or "sha256" not in stored.metadata:
        raise ReleaseError("not an h5etl release upload (no sha256 metadata)", path=target.url)
    before = _read_pointer(output, name)
    pointer = _pointer(name, version, target, stored, stored.metadata["sha256"])
    write_pointer(output, pointer, replaces=before[1] if before else None)
    return pointer


def _pointer(name: str, version: int, target: Location, stored: s3.Stored, sha256: str) -> Pointer:
    return Pointer(
        name=name,
        version=version,
        file=target.name,
        size=stored.size,
        sha256=sha256,
        etag=stored.etag,
        version_id=stored.version_id,
        published=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _check_output(output: Location) -> None:
    if output.protocol != "s3":
        raise RemoteUsageError(
            f"releases can be published to s3:// (or a local folder), not {output.protocol}://",
            path=output.url,
        )
