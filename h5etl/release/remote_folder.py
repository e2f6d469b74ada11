"""remote_folder: one release name in an ``s3://`` output, as the build sees an output folder.

A build into ``output: s3://bucket/releases`` runs exactly as a local one, in a local work
folder (``work_folder``: ``$H5ETL_WORK_DIR``, else ``$XDG_CACHE_HOME/h5etl/outputs/...``, else
``~/.cache/h5etl/outputs/...``): the temp file, its journal, shards, the status file and a
local build lock live there. What differs is where a release goes and where the parent comes
from:

- ``locked``: the lock object ``<output>/.<name>.lock`` (``h5etl.remote.lock``) is held for the
  whole build, then the local lock of the work folder (two builds on this host share it);
- ``publish``: the finished file is uploaded as ``<name>-vNNNN.h5`` (verified against its
  digests), its rejects report and build facts beside it, then the pointer ``<name>.h5.json``
  is replaced (``h5etl.remote.publish``): a reader never sees a half-uploaded release;
- ``current_release``: the release the pointer names, downloaded once into the work folder
  (checked against the pointer's SHA-256) and kept there, so the next build on this host
  carries chunks from a local file; the release just published is kept there too (a hard link
  to the temp file), so a build after a build downloads nothing;
- the carry record goes beside the release in the bucket (``.<release>.carry.json``), so an
  incremental build on another host finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5etl.errors import ReleaseError, ReleaseUsageError, io_problem
from h5etl.release.folder import OutputFolder
from h5etl.release.lock import BuildLock
from h5etl.release.naming import (
    ReleaseInfo,
    facts_filename,
    rejects_filename,
    release_filename,
)
from h5etl.remote import s3
from h5etl.remote.errors import RemoteError
from h5etl.remote.location import Location, is_url, parse_location
from h5etl.remote.lock import RemoteLock
from h5etl.remote.objects import RemoteObject, read_bytes
from h5etl.remote.publish import Pointer, publish, read_pointer, versions

if TYPE_CHECKING:
    from h5etl.dataflow import Reject

__all__ = ["RemoteOutputFolder", "cached", "download", "output_folder", "work_folder"]

logger = logging.getLogger(__name__)

_STEP = 64 * 2**20  # a download's range read


def work_folder(output: Location) -> Path:
    """The local folder a build into ``output`` works in (temp file, status, cached parent)."""
    base = os.environ.get("H5ETL_WORK_DIR")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = str(Path(cache, "h5etl", "outputs"))
    return Path(base, output.protocol, output.bucket, *output.key.split("/"))


def output_folder(output: Path | str, name: str) -> OutputFolder:
    """The output folder of release ``name``: local, or an ``s3://`` URL's."""
    if isinstance(output, str) and is_url(output):
        return RemoteOutputFolder(parse_location(output), name)
    return OutputFolder(Path(output), name)


class RemoteOutputFolder(OutputFolder):
    """One release name in an ``s3://`` output; see the module docstring."""

    part_size = s3.DEFAULT_PART_SIZE  # the upload's parts (the tests' server takes small ones)

    def __init__(self, location: Location, name: str, work: Path | None = None):
        super().__init__(work or work_folder(location), name)
        self.location = location

    @property
    def url(self) -> str:
        return self.location.url

    def published_url(self, version: int) -> str:
        return self.release_url(version)

    def release_url(self, version: int) -> str:
        return self.location.child(release_filename(self.name, version)).url

    def pointer_url(self) -> str:
        return self.location.child(f"{self.name}.h5.json").url

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (
            RemoteLock(self.location, self.name).held(),
            BuildLock(self.lock_path, self.name).held(),
        ):
            yield

    def next_version(self) -> int:
        return max(versions(self.location, self.name), default=0) + 1

    def current_release(self) -> tuple[int, Path] | None:
        """The release the pointer names, as a local file (downloaded once, then kept)."""
        pointer = read_pointer(self.location, self.name)
        if pointer is None:
            return None
        local = self.folder / pointer.file
        if _sha_mark(local, pointer.size) != pointer.sha256:
            self._download(pointer, local)
        return pointer.version, local

    def _download(self, pointer: Pointer, local: Path) -> None:
        """Fetch the release ``pointer`` names into ``local``, pinned by its ETag (or
        version); earlier cached releases of this name go."""
        obj = RemoteObject(
            pointer.location(self.location),
            pointer.size,
            etag=pointer.etag,
            version_id=pointer.version_id,
        )
        download(obj, pointer.sha256, local, before=self._forget_cached)

    def _forget_cached(self) -> None:
        for old in self.folder.glob(f"{self.name}-v*.h5"):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
            with contextlib.suppress(FileNotFoundError):
                _mark_path(old).unlink()

    def publish(
        self,
        staged: Path,
        rejects: Iterable[Reject],
        *,
        version: int,
        facts: Mapping[str, Any] | None = None,
        parts: Sequence[Path] = (),
    ) -> ReleaseInfo:
        """Upload ``staged`` as release ``version``, its rejects report and build facts beside
        it, then replace the pointer; keep the file here as the next build's parent."""
        if parts:
            raise ReleaseUsageError(
                "a virtual release (--virtual) cannot be published to object storage",
                path=self.url,
            )
        report = self.folder / rejects_filename(self.name, version)
        facts_path = self.folder / facts_filename(self.name, version)
        try:
            self._write_report(report, rejects)
            facts_path.write_text(json.dumps(facts or {}, indent=2, ensure_ascii=False) + "\n")
        except OSError as exc:
            raise ReleaseError(f"publishing failed: {io_problem(exc)}", path=self.folder) from exc
        companions = {report.name: report, facts_path.name: facts_path}
        pointer = publish(
            staged,
            self.location,
            self.name,
            version=version,
            companions=companions,
            part_size=self.part_size,
        )
        local = self.folder / pointer.file
        with contextlib.suppress(OSError):  # only a cache: the next build downloads it
            self._forget_cached()
            os.link(staged, local)
            _mark(local, pointer.sha256)
        return self._info(pointer, report)

    def _info(self, pointer: Pointer, report: Path) -> ReleaseInfo:
        local = self.folder / pointer.file
        return ReleaseInfo(
            self.name,
            pointer.version,
            local,
            pointer.size,
            pointer.published or datetime.now(UTC).isoformat(timespec="seconds"),
            True,
            report if report.exists() else None,
        )

    def info(self, version: int) -> ReleaseInfo:
        """The current release (an up-to-date build's); ``version`` must be the pointer's."""
        pointer = read_pointer(self.location, self.name)
        if pointer is None or pointer.version != version:
            raise ReleaseError(f"v{version:04d} is not the current release", path=self.url)
        return self._info(pointer, self.folder / rejects_filename(self.name, version))

    def write_carry(self, version: int, record: dict[str, object]) -> None:
        """Write the carry record here, then beside the release in the bucket."""
        super().write_carry(version, record)
        path = self.carry_path(version)
        try:
            s3.put(self.location.child(path.name), path.read_bytes())
        except (OSError, RemoteError) as exc:  # a cache: the next build decodes everything
            logger.warning("%s: cannot upload the carry record: %s", self.url, exc)

    def read_carry(self, version: int) -> dict[str, object] | None:
        """The carry record from the bucket (a build on another host wrote it), or None."""
        path = self.carry_path(version)
        got = s3.get(self.location.child(path.name))
        if got is None:
            return None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(got[0])
        except OSError:
            return None
        return super().read_carry(version)

    def remove_release(self, version: int, beside: Iterable[Path] = ()) -> list[tuple[Path, int]]:
        raise ReleaseUsageError("prune an s3:// output with h5etl prune URL", path=self.url)

    def point_link(self, version: int) -> None:
        raise ReleaseUsageError("roll back an s3:// output with h5etl rollback", path=self.url)


def download(
    obj: RemoteObject, sha256: str, local: Path, *, before: Callable[[], None] = lambda: None
) -> None:
    """Fetch ``obj`` into ``local`` (range reads pinned by its ETag or version), checked
    against ``sha256``, then marked so it is not fetched again; ``before`` runs just before the
    file takes its name.

    Raises:
        ReleaseError: the bytes are not the release (sha256), or the local disk failed.
        RemoteError: the store failed (the object changed: ``RemoteChanged``).
    """
    local.parent.mkdir(parents=True, exist_ok=True)
    temp = local.with_name(f".{local.name}.download-{os.getpid()}")
    sha = hashlib.sha256()
    try:
        with open(temp, "wb") as handle:
            for start in range(0, obj.size, _STEP):
                block = read_bytes(obj, start, min(start + _STEP, obj.size))
                sha.update(block)
                handle.write(block)
        if sha.hexdigest() != sha256:
            raise ReleaseError(
                "the release downloaded is not the one published (its sha256 differs)",
                path=obj.url,
            )
        before()
        os.replace(temp, local)
        _mark(local, sha256)
    except OSError as exc:
        raise ReleaseError(f"cannot keep a copy here: {io_problem(exc)}", path=local) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def cached(local: Path, size: int, sha256: str) -> bool:
    """Whether ``local`` is a checked copy of the release of that size and SHA-256."""
    return _sha_mark(local, size) == sha256


def _mark_path(local: Path) -> Path:
    return local.with_name(f".{local.name}.sha256")


def _mark(local: Path, sha256: str) -> None:
    """Remember the checked SHA-256 of a cached release (so it is not downloaded again)."""
    _mark_path(local).write_text(sha256 + "\n", encoding="ascii")


def _sha_mark(local: Path, size: int) -> str | None:
    try:
        if local.stat().st_size != size:
            return None
        return _mark_path(local).read_text(encoding="ascii").strip()
    except OSError:
        return None
