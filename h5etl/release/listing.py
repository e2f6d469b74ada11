"""listing: with ``folder`` and ``naming`` (re-exported here), the only modules
that name files, rename them and touch symlinks; here: listing releases and rolling back.

A build writes ``.<name>.partial-<pid>.h5`` in the output folder under a lock file, fsyncs it,
links it to ``<name>-vNNNN.h5`` (no clobbering: ``link`` fails if the name exists), then swaps
the relative symlink ``<name>.h5`` atomically (new link under a temp name, then rename). A build
that fails or is killed never leaves a file under a release name, and never moves the link.
"""

from __future__ import annotations

import os
from pathlib import Path

from h5etl.errors import ReleaseError, ReleaseUsageError
from h5etl.release.folder import OutputFolder
from h5etl.release.naming import (
    ReleaseInfo,
    current_version,
    release_names,
    versions,
)

__all__ = ["list_releases", "rollback"]


def list_releases(folder: Path) -> list[ReleaseInfo]:
    """Every published release in ``folder``, grouped by name, oldest first.

    Raises:
        ReleaseUsageError: ``folder`` is not a folder (exit code 2).
    """
    if not folder.is_dir():
        why = "" if folder.exists() else " (nothing is there)"
        raise ReleaseUsageError(
            f"not a folder{why}; give the output folder of a build, such as releases",
            path=folder,
        )
    out: list[ReleaseInfo] = []
    for name in release_names(folder):
        output = OutputFolder(folder, name)
        out.extend(output.info(v) for v in versions(folder, name))
    return out


def rollback(link: Path, to: int | None = None) -> ReleaseInfo:
    """Point a release link at version ``to``, or at the version before the current one.

    Raises:
        ReleaseUsageError: ``link`` is not a link, or there is no such version (exit code 2).
        ReleaseError: the link could not be moved.
    """
    if not link.is_symlink():
        why = "" if link.exists() else " (nothing is there)"
        raise ReleaseUsageError(
            f"not a release link{why}; give the symlink a build makes, such as releases/cells.h5",
            path=link,
        )
    name = link.name.removesuffix(".h5")
    output = OutputFolder(link.parent, name)
    existing = versions(link.parent, name)
    current = current_version(link)
    if to is None:
        older = [v for v in existing if current is None or v < current]
        if not older:
            if current is None:  # the link points at a file that is not <name>-vNNNN.h5
                raise ReleaseUsageError(
                    f"no {name}-vNNNN.h5 release to roll back to (the link points at "
                    f"{os.readlink(link)})",
                    path=link,
                )
            raise ReleaseUsageError(
                f"no release older than v{current:04d} to roll back to", path=link
            )
        to = older[-1]
    if to not in existing:
        shown = ", ".join(f"v{v}" for v in existing) or "none"
        raise ReleaseUsageError(f"no release v{to:04d}; have {shown}", path=link)
    try:
        output.point_link(to)
    except OSError as exc:
        raise ReleaseError(f"cannot move the link: {exc.strerror or exc}", path=link) from exc
    return output.info(to)
