"""prune: delete old releases of every name in a folder, keeping the newest and the linked one.

``prune(folder, keep=N)`` plans: per release name, the N newest versions stay, and so does the
version the link points at, however old; the other releases go, each with the files beside
it (rejects report, build facts, carry record, a virtual release's part files; such files
left without their release go too). A part goes with its release, but never while a release
that stays still maps it (``partfiles``: its record and its virtual datasets). A dry run
by default; with ``apply`` it takes each name's build lock (a running build is never pruned
under), plans again under it and deletes through ``release.py``, the only module that
deletes release files.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import h5py

from h5etl.errors import ReleaseUsageError
from h5etl.format import partfiles
from h5etl.release import listing as release
from h5etl.release import naming
from h5etl.release.folder import OutputFolder

__all__ = ["PrunePlan", "Pruned", "prune"]


@dataclass(frozen=True, slots=True)
class Pruned:
    """One version of one name: kept (and why) or deleted, with its files and their bytes
    (planned; once applied, the files deleted and the bytes that freed)."""

    name: str
    version: int
    files: tuple[Path, ...]
    size: int
    kept: str = ""  # why it stays: "newest 3", "linked"; empty when it goes
    held: tuple[Path, ...] = ()  # its files that stay: a release that stays maps them


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


def _size(paths: Iterable[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _mapped(path: Path) -> list[Path]:
    """The part files the release at ``path`` maps or records, that are in its folder (a
    release that cannot be read maps none: its own parts are still found by name)."""
    try:
        with h5py.File(path, "r") as handle:
            names = partfiles.mapped_files(handle)
            names += [part.file for part in partfiles.read_parts(handle) or []]
    except (OSError, ValueError):
        return []
    found = (path.parent / name for name in dict.fromkeys(names))
    return [p for p in found if p.parent == path.parent and p.is_file()]


def _plan_name(output: OutputFolder, keep: int) -> list[Pruned]:
    existing = naming.versions(output.folder, output.name)
    linked = naming.current_version(output.link)
    newest = set(sorted(existing)[-keep:])
    out = []
    for version, path in existing.items():
        beside = naming.companions(output.folder, output.name, version)
        files = list(dict.fromkeys([path, *beside, *_mapped(path)]))
        why = ", ".join(
            reason
            for reason, holds in (
                (f"newest {keep}", version in newest),
                (f"{output.link.name} points at it", version == linked),
            )
            if holds
        )
        out.append(Pruned(output.name, version, tuple(files), _size(files), why))
    for version, left in naming.orphans(output.folder, output.name).items():
        out.append(Pruned(output.name, version, tuple(left), _size(left)))
    needed = {path for entry in out if entry.kept for path in entry.files}
    out = [_without(entry, needed) for entry in out]
    return sorted((e for e in out if e.files), key=lambda e: e.version)


def _without(entry: Pruned, needed: set[Path]) -> Pruned:
    """A release that goes, without the files a release that stays needs (its parts)."""
    if entry.kept:
        return entry
    own = entry.files[0].name == naming.release_filename(entry.name, entry.version)
    if own and entry.files[0] in needed:  # a release that stays maps this one's file itself
        return Pruned(entry.name, entry.version, entry.files, entry.size, "a kept release maps it")
    files = tuple(p for p in entry.files if p not in needed)
    held = tuple(p for p in entry.files if p in needed)
    return Pruned(entry.name, entry.version, files, _size(files), held=held)


def _apply(output: OutputFolder, entries: list[Pruned]) -> list[Pruned]:
    """Delete what ``entries`` plan; each entry then lists what was deleted and freed."""
    out = []
    for entry in entries:
        if entry.kept:
            out.append(entry)
            continue
        removed = output.remove_release(entry.version, entry.files)
        files = tuple(path for path, _ in removed)
        out.append(
            Pruned(entry.name, entry.version, files, sum(n for _, n in removed), "", entry.held)
        )
    return out


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
    for name in naming.release_names(folder):
        output = OutputFolder(folder, name)
        if not apply:
            plan.entries.extend(_plan_name(output, keep))
            continue
        with output.locked():  # planned again under the lock: a build may just have ended
            plan.entries.extend(_apply(output, _plan_name(output, keep)))
    return plan
