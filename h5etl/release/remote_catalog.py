"""remote_catalog: what ``releases``, ``rollback``, ``prune``, ``status``, ``check`` and ``diff``
do when given an ``s3://`` URL instead of a folder, a link or a file.

- ``releases s3://bucket/releases``: every uploaded version of every name, the pointed-at one
  marked (``h5etl.remote.catalog``);
- ``rollback s3://bucket/releases/cells.h5 [--to N]``: the pointer ``cells.h5.json`` moved to
  another uploaded version (default: the one before the current);
- ``prune s3://bucket/releases --keep N [--yes]``: the older versions deleted with their rejects
  report, build facts and carry record, never the pointed-at one, under the build lock;
- ``status s3://bucket/releases``: the builds into that URL run on this host (their status
  files are in its local work folder, ``h5etl.release.remote_folder.work_folder``);
- ``check`` / ``diff`` of ``s3://.../cells.h5`` (the pointer resolved) or
  ``s3://.../cells-v0003.h5``: the release downloaded once into the work folder, checked
  against the SHA-256 it was published with, and read there (``local_copy``). Both read most
  of the file (``check`` hashes every dataset), so a download costs no more than range reads.
"""

from __future__ import annotations

import re
from pathlib import Path

from h5etl.errors import ReleaseError, ReleaseUsageError
from h5etl.release import naming
from h5etl.release.remote_folder import cached, download, work_folder
from h5etl.remote import catalog, s3
from h5etl.remote.catalog import RemoteRelease
from h5etl.remote.location import Location
from h5etl.remote.objects import RemoteObject, list_objects
from h5etl.remote.publish import POINTER_SUFFIX, Pointer, read_pointer, rollback, versions

__all__ = ["companions", "link_of", "local_copy", "prune", "releases", "roll_back", "status_folder"]

_VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d{4,})\.h5$")


def names(output: Location) -> list[str]:
    """The release names with versions (or a pointer) in the folder ``output``."""
    found = set()
    for obj in list_objects(output, "*.h5*"):
        filename = output.relative(obj.location)
        match = _VERSIONED.match(filename)
        if match:
            found.add(match["name"])
        elif filename.endswith(POINTER_SUFFIX):
            found.add(filename.removesuffix(POINTER_SUFFIX))
    return sorted(found)


def releases(output: Location) -> list[RemoteRelease]:
    """Every uploaded version of every name in ``output``, by name, oldest first."""
    return [entry for name in names(output) for entry in catalog.releases(output, name)]


def link_of(link: Location) -> tuple[Location, str]:
    """``s3://b/releases/cells.h5`` (or ``cells.h5.json``) -> (``s3://b/releases``, ``cells``).

    Raises:
        ReleaseUsageError: not a release link's URL (exit code 2).
    """
    filename = link.name.removesuffix(".json")
    if not filename.endswith(".h5") or _VERSIONED.match(filename):
        raise ReleaseUsageError(
            "give the release's link URL, such as s3://bucket/releases/cells.h5", path=link.url
        )
    return link.parent(), filename.removesuffix(".h5")


def roll_back(link: Location, to: int | None) -> Pointer:
    """Point ``link`` at version ``to`` (default: the version before the current one).

    Raises:
        ReleaseUsageError: nothing to roll back to (exit code 2).
    """
    output, name = link_of(link)
    if to is None:
        pointer = read_pointer(output, name)
        older = [v for v in versions(output, name) if pointer is None or v < pointer.version]
        if not older:
            raise ReleaseUsageError(f"no version of {name!r} before the current", path=link.url)
        to = older[-1]
    return rollback(output, name, to)


def companions(name: str, version: int) -> list[str]:
    """The files a build uploads beside release ``version`` (what ``prune`` deletes with it)."""
    release = naming.release_filename(name, version)
    return [
        naming.rejects_filename(name, version),
        naming.facts_filename(name, version),
        f".{release}.carry.json",  # OutputFolder.carry_path
    ]


def prune(output: Location, *, keep: int, apply: bool) -> list[RemoteRelease]:
    """Each name's versions in ``output`` and whether each stays (``catalog.prune``)."""
    return [
        entry
        for name in names(output)
        for entry in catalog.prune(output, name, keep=keep, apply=apply, companions=companions)
    ]


def status_folder(target: Location) -> Path:
    """Where the builds of this host into ``target`` (a folder or a link URL) keep their
    status files."""
    if target.name.endswith((".h5", POINTER_SUFFIX)):
        output, name = link_of(target)
        return work_folder(output) / f"{name}.h5"
    return work_folder(target)


def local_copy(url: Location) -> Path:
    """A checked local copy of the release ``url`` names (a link or a versioned file).

    Raises:
        ReleaseUsageError: no such release (exit code 2).
        ReleaseError: it is not an h5etl upload, or its bytes are not the published ones.
    """
    match = _VERSIONED.match(url.name)
    if match is None:
        output, name = link_of(url)
        pointer = read_pointer(output, name)
        if pointer is None:
            raise ReleaseUsageError(f"no release of {name!r} is published there", path=url.url)
        obj = RemoteObject(
            pointer.location(output), pointer.size, etag=pointer.etag, version_id=pointer.version_id
        )
        sha256 = pointer.sha256
    else:
        stored = s3.head(url)
        if stored is None:
            raise ReleaseUsageError("no such release", path=url.url)
        if "sha256" not in stored.metadata:
            raise ReleaseError("not an h5etl release upload (no sha256 metadata)", path=url.url)
        obj = RemoteObject(url, stored.size, etag=stored.etag, version_id=stored.version_id)
        sha256 = stored.metadata["sha256"]
    local = work_folder(obj.location.parent()) / "copies" / obj.location.name
    if not cached(local, obj.size, sha256):
        download(obj, sha256, local)
    return local
