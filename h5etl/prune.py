"""prune: delete old releases of every name in a folder, keeping the newest and the linked one.

``prune(folder, keep=N)`` plans: per release name, the N newest versions stay, and so does the
version the link points at, however old; the other releases go, each with the files beside
it (rejects report, build facts; such files left without their release go too). A dry run
by default; with ``apply`` it takes each name's build lock (a running build is never pruned
under), plans again under it and deletes through ``release.py``, the only module that
deletes release files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from h5etl import release
from h5etl.errors import ReleaseUsageError

__all__ = ["PrunePlan", "Pruned", "prune"]


@dataclass(frozen=True, slots=True)
class Pruned:
    """One version of one name: kept (and why) or deleted, with its files and their bytes."""

    name: str
    version: int
    files: tuple[Path, ...]
    size: int
    kept: str = ""  # why it stays: "newest 3", "linked"; empty when it goes


@dataclass(slots=True)
class PrunePlan:
    folder: Path
    keep: int
    applied: bool
    entries: list[Pruned] = field(default_factory=list)

    @property
    def removed(self) -> list[Pruned]:
        return [e for e in self.entries if not e.kept]

    @property
    def freed(self) -> int:
        return sum(e.size for e in self.removed)


def _size(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _plan_name(output: release.OutputFolder, keep: int) -> list[Pruned]:
    existing = release.versions(output.folder, output.name)
    linked = release.current_version(output.link)
    newest = set(sorted(existing)[-keep:])
    out = []
    for version, path in existing.items():
        files = [path, *release.companions(output.folder, output.name, version)]
        why = ", ".join(
            reason
            for reason, holds in (
                (f"newest {keep}", version in newest),
                (f"{output.link.name} points at it", version == linked),
            )
            if holds
        )
        out.append(Pruned(output.name, version, tuple(files), _size(files), why))
    for version, left in release.orphans(output.folder, output.name).items():
        out.append(Pruned(output.name, version, tuple(left), _size(left)))
    return sorted(out, key=lambda e: e.version)


def prune(folder: Path, *, keep: int, apply: bool = False) -> PrunePlan:
    """Plan (and with ``apply``, carry out) the pruning of ``folder``.

    Raises:
        ReleaseUsageError: ``folder`` is not a folder, or ``keep`` is below 1 (exit code 2).
        LockHeld: a build of one of the names is running (exit code 1; nothing of that name,
            nor of the names after it, was deleted).
        ReleaseError: a file could not be deleted.
    """
    if keep < 1:
        raise ReleaseUsageError(f"--keep must be at least 1, got {keep}", path=folder)
    release.list_releases(folder)  # the folder's own checks: a usage error when it is none
    plan = PrunePlan(folder, keep, apply)
    for name in release.release_names(folder):
        output = release.OutputFolder(folder, name)
        if not apply:
            plan.entries.extend(_plan_name(output, keep))
            continue
        with output.locked():  # planned again under the lock: a build may just have ended
            entries = _plan_name(output, keep)
            for entry in entries:
                if not entry.kept:
                    output.remove_release(entry.version)
        plan.entries.extend(entries)
    return plan
