"""naming: what the files of a release are called, and finding them in a folder
(read only: nothing here writes, renames or deletes a file; ``h5etl.release.listing`` re-exports it
all).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUTPUT = "releases"  # a config's output folder when it names none (``Spec.output``)

_VERSION = re.compile(r"^(?P<name>.+)-v(?P<version>\d{4,})\.h5$")
# The files beside a release: its rejects report, its build facts
_BESIDE = re.compile(
    r"^\.?(?P<name>.+)-v(?P<version>\d{4,})\."
    r"(rejects\.jsonl|build\.json|h5\.carry\.json|part-\d{4,}\.h5)$"
)
PARTIAL_MARK = ".partial-"


@dataclass(frozen=True, slots=True)
class ReleaseInfo:
    name: str
    version: int
    path: Path
    size: int
    modified: str
    current: bool
    rejects: Path | None


def is_release_name(filename: str) -> bool:
    """Whether ``filename`` is a release's own name (``<name>-vNNNN.h5``)."""
    return _VERSION.match(filename) is not None


def link_filename(name: str) -> str:
    """The link training code opens: it points at the newest release (or the rolled-back one)."""
    return f"{name}.h5"


def release_filename(name: str, version: int) -> str:
    return f"{name}-v{version:04d}.h5"


def part_filename(name: str, version: int, index: int) -> str:
    """A part of a virtual release (its shards): the release's datasets map onto these."""
    return f"{name}-v{version:04d}.part-{index:04d}.h5"


def rejects_filename(name: str, version: int) -> str:
    return f"{name}-v{version:04d}.rejects.jsonl"


def facts_filename(name: str, version: int) -> str:
    """The build facts beside a release: timings, workers, host (``clock``)."""
    return f"{name}-v{version:04d}.build.json"


def versions(folder: Path, name: str) -> dict[int, Path]:
    """The published releases of ``name`` in ``folder``, by version."""
    found = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            match = _VERSION.match(entry.name)
            if match and match["name"] == name and not entry.is_symlink():
                found[int(match["version"])] = entry
    return dict(sorted(found.items()))


def companions(folder: Path, name: str, version: int) -> list[Path]:
    """The files beside release ``version`` that are there: rejects report, build facts,
    carry record, and a virtual release's part files (its data)."""
    carry = f".{release_filename(name, version)}.carry.json"  # OutputFolder.carry_path
    beside = (rejects_filename(name, version), facts_filename(name, version), carry)
    parts = sorted(folder.glob(f"{glob.escape(name)}-v{version:04d}.part-*.h5"))
    return [folder / n for n in beside if (folder / n).is_file()] + parts


def orphans(folder: Path, name: str) -> dict[int, list[Path]]:
    """Files beside a release that is gone (a prune stopped half-way), by version."""
    found: dict[int, list[Path]] = {}
    releases = versions(folder, name)
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            match = _BESIDE.match(entry.name)
            if match and match["name"] == name and int(match["version"]) not in releases:
                found.setdefault(int(match["version"]), []).append(entry)
    return dict(sorted(found.items()))


def release_names(folder: Path) -> list[str]:
    """The names of the releases in ``folder``, sorted."""
    return sorted({m["name"] for e in folder.iterdir() if (m := _VERSION.match(e.name))})


def current_version(link: Path) -> int | None:
    if not link.is_symlink():
        return None
    match = _VERSION.match(os.readlink(link).rsplit("/", 1)[-1])
    return int(match["version"]) if match else None


def has_link(config: Path) -> bool:
    """Whether the release ``config`` builds has a link already, read cheaply from its YAML
    (no config loading, no pydantic, no numpy: the CLI asks before it imports the pipeline).
    Then the build may publish nothing (``h5etl.incremental.uptodate``) and starts the workers
    itself once it knows it decodes: started early, a build that turns out up to date would wait at
    exit for workers it never used (1.2 s here). Any doubt (unreadable, unusual) says False:
    the workers start at once, as for a first build.
    """
    import yaml

    from h5etl.format import yaml_load

    try:
        data = yaml_load.safe_load(config.read_text(encoding="utf-8"))
        name, output = data["name"], data.get("output", DEFAULT_OUTPUT)
        folder = Path(output) if Path(output).is_absolute() else config.parent / output
        return (folder / link_filename(str(name))).is_symlink()
    except (
        OSError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        RecursionError,
        yaml.YAMLError,
    ):
        return False
