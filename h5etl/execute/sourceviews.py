"""sourceviews: what one process sees of a source folder, cheaply, to compare across hosts.

A Dask worker on a host where the source share did not mount sees an empty folder (the mount
point) at the same path: every file it was given became an ``unreadable`` reject, and a third
of the samples went missing from a published release. Before anything is decoded each worker
compares its view of every source folder with the build's: the folder's first level (one
listing, names only) must hold the build's probe entries, spread over its sorted names, with
their sizes (at most ``PROBES`` stats). An empty mount, another copy of the data or a stale
one fails; files added since the build looked do not (a folder being filled is not another
folder). Standard library only: workers import it.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

PROBES = 64  # entries of a folder's first level whose name and size a worker must see alike
FOLDER = -1  # the size a probe records for a folder (a folder's own size differs by host)


class View(NamedTuple):
    """What a process sees of one source folder: how many non-hidden entries its first
    level holds (-1: no such folder), and probe entries (name, size) spread over them."""

    entries: int
    probes: tuple[tuple[str, int], ...]


def visible(folder: str) -> bool:
    """Whether this process sees ``folder`` (a test hides one from a worker here)."""
    return os.path.isdir(folder)


def _names(folder: str) -> list[str] | None:
    if not visible(folder):
        return None
    try:
        with os.scandir(folder) as listing:
            return sorted(entry.name for entry in listing if not entry.name.startswith("."))
    except OSError:
        return None


def _size(folder: str, name: str) -> int | None:
    try:
        found = os.stat(os.path.join(folder, name))
    except OSError:
        return None
    return FOLDER if stat.S_ISDIR(found.st_mode) else found.st_size


def view_of(folder: str) -> View:
    """This process's ``View`` of ``folder``: one listing and at most ``PROBES`` stats."""
    names = _names(folder)
    if names is None:
        return View(-1, ())
    last = len(names) - 1
    picked = sorted({names[i * last // (PROBES - 1)] for i in range(PROBES)}) if names else []
    probes = ((name, _size(folder, name)) for name in picked)
    return View(len(names), tuple((name, size) for name, size in probes if size is not None))


def difference(folder: str, expected: View) -> str | None:
    """How this process's view of ``folder`` differs from ``expected`` (the build's): a
    clause naming the folder; None when it holds every probe alike (or when the build does
    not see the folder either: discovery says so)."""
    if expected.entries < 0:
        return None
    names = _names(folder)
    if names is None:
        return f"cannot see the source folder {folder}"
    if not names and expected.entries:
        return (
            f"sees the source folder {folder} empty where this build sees {expected.entries} "
            f"entries (a share that did not mount on that host?)"
        )
    present = set(names)
    for name, size in expected.probes:
        if name not in present:
            return (
                f"sees {len(names)} entries in the source folder {folder} where this build "
                f"sees {expected.entries}, and not {name} (another copy of the data?)"
            )
        there = _size(folder, name)
        if there != size:
            return (
                f"sees {os.path.join(folder, name)} as {_described(there)} where this build "
                f"sees {_described(size)} (another copy of the data?)"
            )
    return None


def _described(size: int | None) -> str:
    return "a folder" if size == FOLDER else "nothing" if size is None else f"{size} bytes"
