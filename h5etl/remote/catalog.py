"""catalog: the releases of a name in an object-storage folder, and pruning the old ones.

``releases(output, name)`` lists every uploaded version with the one the pointer names marked;
``prune(output, name, keep=N)`` plans like the local ``h5etl prune``: the N newest versions
stay, and so does the pointed-at one, however old; with ``apply`` it takes the build lock,
plans again under it and deletes the others (each with ``If-Match`` on its listed ETag, so an
object replaced meanwhile stays). A dry run by default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from h5etl.errors import ReleaseUsageError
from h5etl.remote import s3
from h5etl.remote.location import Location, parse_location
from h5etl.remote.lock import RemoteLock
from h5etl.remote.publish import read_pointer, versions

__all__ = ["RemoteRelease", "prune", "releases"]


@dataclass(frozen=True, slots=True)
class RemoteRelease:
    """One uploaded version of a release; ``current``: the pointer names it; ``kept``: why
    prune leaves it (``"newest 3"``, ``"current"``), empty when it goes."""

    name: str
    version: int
    url: str
    size: int
    etag: str | None
    current: bool
    kept: str = ""


def releases(output: Location, name: str) -> list[RemoteRelease]:
    """Every uploaded version of ``name`` in ``output``, oldest first."""
    pointer = read_pointer(output, name)
    return [
        RemoteRelease(
            name,
            version,
            obj.url,
            obj.size,
            obj.etag,
            pointer is not None and pointer.version == version,
        )
        for version, obj in versions(output, name).items()
    ]


def prune(
    output: Location,
    name: str,
    *,
    keep: int,
    apply: bool = False,
    companions: Callable[[str, int], Sequence[str]] = lambda name, version: (),
) -> list[RemoteRelease]:
    """The versions of ``name`` and whether each stays; with ``apply``, the others deleted,
    each with the files beside it that ``companions(name, version)`` names (after the
    release: a prune stopped half-way leaves a report, never a release without one).

    Raises:
        ReleaseUsageError: ``keep`` is below 1 (exit code 2).
        LockHeld: with ``apply``, a build of ``name`` is running.
    """
    if keep < 1:
        raise ReleaseUsageError(f"--keep must be at least 1, got {keep}", path=output.url)
    if not apply:
        return _plan(output, name, keep)
    with RemoteLock(output, name).held():
        planned = _plan(output, name, keep)
        for entry in planned:
            if not entry.kept:
                with contextlib.suppress(s3.Precondition):  # replaced meanwhile: it stays
                    s3.delete(parse_location(entry.url), if_match=entry.etag)
                    for filename in companions(name, entry.version):
                        s3.delete(output.child(filename))
    return planned


def _plan(output: Location, name: str, keep: int) -> list[RemoteRelease]:
    listed = releases(output, name)
    newest = {r.version for r in listed[-keep:]}
    planned = []
    for entry in listed:
        why = [
            w
            for w, yes in ((f"newest {keep}", entry.version in newest), ("current", entry.current))
            if yes
        ]
        planned.append(
            RemoteRelease(
                entry.name,
                entry.version,
                entry.url,
                entry.size,
                entry.etag,
                entry.current,
                ", ".join(why),
            )
        )
    return planned
