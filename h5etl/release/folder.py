"""folder: ``OutputFolder``, one release name in one output folder: the lock, temp
files, publishing (link, no clobbering), the symlink swap, deleting a release (prune).

``h5etl.release.listing`` re-exports it; only these release modules rename or delete release files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5etl.errors import ClusterLost, H5EtlError, ReleaseError, ReleaseUsageError, io_problem
from h5etl.release import durable
from h5etl.release.lock import BuildLock
from h5etl.release.naming import (
    PARTIAL_MARK,
    ReleaseInfo,
    current_version,
    facts_filename,
    is_release_name,
    link_filename,
    part_filename,
    rejects_filename,
    release_filename,
    versions,
)

if TYPE_CHECKING:  # records only: numpy loads with the build, not with `h5etl status`
    from h5etl.dataflow import Reject

logger = logging.getLogger("h5etl.release.listing")  # its name from before the split


class OutputFolder:
    """One release name in one output folder: lock, staging, publishing, the link."""

    STATUS_SUFFIX = ".status.json"

    def __init__(self, folder: Path, name: str):
        self.folder = folder
        self.name = name
        self.link = folder / link_filename(name)
        self.lock_path = folder / f".{name}.lock"
        self.status_path = folder / f"{name}{self.STATUS_SUFFIX}"

    def write_status(self, data: Mapping[str, Any]) -> None:
        """Replace the build status file atomically (``h5etl.pipeline.status``); no fsync: it is
        rewritten a few times a second, and a reader only needs never to see half of it.

        Raises:
            OSError: it could not be written (the temp file is removed).
        """
        temp = self.folder / f".{self.status_path.name}.tmp-{os.getpid()}"
        try:
            # ASCII JSON: a file name's undecodable bytes (lone surrogates) become escapes
            temp.write_text(json.dumps(data) + "\n", encoding="ascii")
            os.replace(temp, self.status_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the build lock of this name in this folder (``h5etl.release.lock``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with BuildLock(self.lock_path, self.name).held():
            yield

    def stale_partials(self) -> list[Path]:
        """Temp files of builds that died; call only while holding the lock."""
        return sorted(self.folder.glob(f".{self.name}{PARTIAL_MARK}*"))

    def remove_stale_partials(self, keep: Iterable[Path] = ()) -> list[Path]:
        """Delete the temp files and journals of dead builds, except ``keep``."""
        kept = set(keep)
        removed = [path for path in self.stale_partials() if path not in kept]
        for path in removed:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return removed

    def partial_path(self) -> Path:
        token = secrets.token_hex(3)  # a reused pid must not meet a dead build's files
        return self.folder / f".{self.name}{PARTIAL_MARK}{os.getpid()}-{token}.h5"

    @staticmethod
    def journal_of(partial: Path) -> Path:
        return partial.with_suffix(".journal")

    def shard_path(self, ident: str, index: int) -> Path:
        """Shard ``index`` of the sharded build ``ident``: a temp file until the stitch (a
        plain build removes it with the other leftovers; ``--resume`` reuses it)."""
        return self.folder / f".{self.name}{PARTIAL_MARK}shard-{ident}-{index:04d}.h5"

    @staticmethod
    def manifest_of(shard: Path) -> Path:
        """Where a shard's manifest goes: its commit (it exists only for a complete shard)."""
        return shard.with_suffix(".manifest")

    def resumables(self) -> list[tuple[Path, Path]]:
        """Temp files killed builds left with their journals, newest journal first; call
        under the lock."""
        candidates = [
            (p, self.journal_of(p))
            for p in self.stale_partials()
            if p.suffix == ".h5" and self.journal_of(p).is_file()
        ]
        return sorted(candidates, key=lambda pair: pair[1].stat().st_mtime_ns, reverse=True)

    @contextlib.contextmanager
    def staged(self) -> Iterator[Path]:
        """A temp path for the new file (its journal beside it); both removed at the end,
        unless the build stopped on an error that leaves it resumable (a lost Dask scheduler)
        after a checkpoint: then they stay for ``--resume``, as a killed build's do.

        Removing them never raises over the error that ended the build.
        """
        path = self.partial_path()
        keep = False
        try:
            yield path
        except H5EtlError as exc:
            from h5etl.format.journal import holds_checkpoint  # numpy: only when a build failed

            keep = exc.resumable and holds_checkpoint(self.journal_of(path))
            if isinstance(exc, ClusterLost):
                exc.kept(keep)  # say the truth: no checkpoint yet, no --resume to promise
            raise
        finally:
            for leftover in () if keep else (path, self.journal_of(path)):
                try:
                    leftover.unlink()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    logger.warning("%s: cannot remove this temp file: %s", leftover, exc)

    def current_release(self) -> tuple[int, Path] | None:
        """The release the link points at (version, path): a new build's parent; None when
        there is no link, or it points at no release of this name."""
        version = current_version(self.link)
        if version is None:
            return None
        path = self.folder / release_filename(self.name, version)
        return (version, path) if path.is_file() and not path.is_symlink() else None

    def carry_path(self, version: int) -> Path:
        """The carry record a build leaves beside its release (``h5etl.incremental.reuse``): hidden,
        a cache only (without it the next build decodes everything)."""
        return self.folder / f".{release_filename(self.name, version)}.carry.json"

    def write_carry(self, version: int, record: dict[str, object]) -> None:
        """Write a release's carry record atomically; a failure only costs the next build."""
        path = self.carry_path(version)
        temp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        try:
            with open(temp, "w", encoding="utf-8", errors="backslashreplace") as handle:
                # dumps, not dump: json.dump always takes the pure-Python encoder (5x slower)
                handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except OSError as exc:
            logger.warning("%s: cannot write the carry record: %s", path, exc)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    def read_carry(self, version: int) -> dict[str, object] | None:
        """A release's carry record, or None when it is missing or unreadable."""
        try:
            with open(self.carry_path(version), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def remove_release(self, version: int, beside: Iterable[Path] = ()) -> list[tuple[Path, int]]:
        """Delete release ``version`` (when it is there), then the files ``beside`` it that
        the caller found (its report, facts, carry record, parts: ``prune``); call under the
        lock. Returns each file deleted with the bytes that freed (0 for a file that has
        other hard links: its data stays).

        Raises:
            ReleaseUsageError: the link points at that version, or a file ``beside`` is not
                in this folder or is a release itself (exit code 2).
            ReleaseError: a file could not be deleted.
        """
        if current_version(self.link) == version:
            raise ReleaseUsageError(
                f"v{version:04d} is the release {self.link.name} points at; it is never deleted",
                path=self.folder,
            )
        files = [self.folder / release_filename(self.name, version)]
        for path in beside:
            if path == files[0]:
                continue
            if path.parent != self.folder or is_release_name(path.name) or path == self.link:
                raise ReleaseUsageError(
                    "not a file beside a release of this folder; never deleted", path=path
                )
            files.append(path)
        removed = []
        # the release first: a prune stopped half-way leaves a report, never a release
        # whose report (or part) is gone
        for path in dict.fromkeys(files):
            try:
                info = path.lstat()
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ReleaseError(f"cannot delete it: {io_problem(exc)}", path=path) from exc
            removed.append((path, info.st_size if info.st_nlink <= 1 else 0))
        durable.fsync_dir(self.folder)
        return removed

    def published_url(self, version: int) -> str:
        """The URL release ``version`` is published at: none for a local folder."""
        return ""

    def next_version(self) -> int:
        existing = versions(self.folder, self.name)
        return max(existing, default=0) + 1

    def publish(
        self,
        staged: Path,
        rejects: Iterable[Reject],
        *,
        version: int,
        facts: Mapping[str, Any] | None = None,
        parts: Sequence[Path] = (),
    ) -> ReleaseInfo:
        """Name ``staged`` as release ``version``, then its rejects report and build facts,
        then move the link.

        ``parts`` (a virtual release's shard files) are named ``part_filename`` first, so the
        release never names a part that is not there.
        """
        final = self.folder / release_filename(self.name, version)
        report = self.folder / rejects_filename(self.name, version)
        facts_path = self.folder / facts_filename(self.name, version)
        report_temp = self.folder / f".{report.name}.tmp-{os.getpid()}"
        facts_temp = self.folder / f".{facts_path.name}.tmp-{os.getpid()}"
        before = os.readlink(self.link) if self.link.is_symlink() else None
        named: list[Path] = []  # the release names this call gave, taken back on a failure
        try:
            for index, part in enumerate(parts):
                durable.fsync_file(part)
                os.link(part, self.folder / part_filename(self.name, version, index))
                named.append(self.folder / part_filename(self.name, version, index))
            durable.fsync_file(staged)
            self._write_report(report_temp, rejects)
            durable.write_json(facts_temp, facts or {})
            os.link(staged, final)  # unlike rename, refuses to replace an existing release
            named.append(final)
            os.replace(report_temp, report)
            named.append(report)
            os.replace(facts_temp, facts_path)
            named.append(facts_path)
            os.unlink(staged)
            for part in parts:
                os.unlink(part)
            durable.fsync_dir(self.folder)
            self.point_link(version)
        except FileExistsError as exc:
            self._unpublish(named, before, final.name)  # only the parts this call named
            raise ReleaseError(
                f"{Path(exc.filename2 or exc.filename or final).name} appeared while building; "
                f"it was left as it is",
                path=self.folder,
            ) from exc
        except OSError as exc:
            self._unpublish(named, before, final.name)
            raise ReleaseError(f"publishing failed: {io_problem(exc)}", path=self.folder) from exc
        finally:
            for temp in (report_temp, facts_temp):
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()
        return self.info(version)

    def _unpublish(self, named: list[Path], before: str | None, target: str) -> None:
        """After a failed publish: the link back where it was, the new names gone.

        A failed build never leaves a file under a release name (a full disk can stop the
        publish after the link, before the report, or between the link and its fsync).
        """
        temp = self.folder / f".{self.name}.h5.link-{os.getpid()}"  # point_link's temp name
        try:
            if self.link.is_symlink() and os.readlink(self.link) == target:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()
                if before is None:
                    self.link.unlink()
                else:
                    os.symlink(before, temp)
                    os.replace(temp, self.link)
            for path in named:  # only once the link is back: it never points at nothing
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            durable.fsync_dir(self.folder)
        except OSError as exc:
            logger.warning("%s: cannot undo the failed publish: %s", self.folder, exc)
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()

    def failed_rejects_path(self) -> Path:
        """Where a failed build leaves its per-file rejects (the newest failure wins)."""
        return self.folder / f"{self.name}.failed.rejects.jsonl"

    def write_failed_rejects(self, rejects: Iterable[Reject]) -> Path:
        """Write a failed build's rejects report beside the releases, atomically."""
        report = self.failed_rejects_path()
        temp = self.folder / f".{report.name}.tmp-{os.getpid()}"
        try:
            self._write_report(temp, rejects)
            os.replace(temp, report)
        except OSError as exc:
            raise ReleaseError(
                f"cannot write the rejects report: {io_problem(exc)}", path=report
            ) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        return report

    @staticmethod
    def _write_report(path: Path, rejects: Iterable[Reject]) -> None:
        # Undecodable bytes of a file name (lone surrogates) become JSON escapes, which read
        # back as the very string Python's file APIs give for that name.
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as handle:
            for reject in rejects:
                handle.write(json.dumps(reject.as_json(), ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def point_link(self, version: int) -> None:
        """Atomically point ``<name>.h5`` at a version (relative link, so the folder can move)."""
        target = release_filename(self.name, version)
        if not (self.folder / target).is_file():
            raise ReleaseError(f"no release v{version:04d} of {self.name!r}", path=self.folder)
        temp = self.folder / f".{self.name}.h5.link-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        os.symlink(target, temp)
        os.replace(temp, self.link)
        durable.fsync_dir(self.folder)

    def info(self, version: int) -> ReleaseInfo:
        path = self.folder / release_filename(self.name, version)
        stat = path.stat()
        report = self.folder / rejects_filename(self.name, version)
        return ReleaseInfo(
            self.name,
            version,
            path,
            stat.st_size,
            datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(timespec="seconds"),
            current_version(self.link) == version,
            report if report.exists() else None,
        )
