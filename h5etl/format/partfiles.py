"""partfiles: the part files a virtual release (``build --shards K --vds``) maps its rows onto,
and what is wrong with them. Read only.

HDF5 reads the rows of a missing part as the fill value, without a word: a release whose part
is gone reads as zeros. So the release records each part in its root attribute ``parts``
(``fileformat.PARTS_ATTR``: file name, size in bytes, the shard identity and index the part
carries in its own attributes), and whoever opens it asks here first: the readers (is every
part there, of its size: a ``stat`` each), ``check`` (does each open, is it the part the
release was built with, does it hold the datasets mapped onto it), ``prune`` (which files a
release needs). Releases made before the record name their parts only in their mappings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py

from h5etl.format import contract as fileformat

__all__ = ["Part", "mapped_files", "part_of_row", "part_problems", "read_parts", "record"]


@dataclass(frozen=True, slots=True)
class Part:
    """One part as the release recorded it when it was built."""

    file: str  # its name, in the release's folder (the mapping's relative name)
    size: int  # bytes
    shard: str  # the build identity the part carries (``fileformat.SHARD_ATTR``)
    index: int  # its place among the parts (``fileformat.SHARD_INDEX_ATTR``)

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.size, "shard": self.shard, "index": self.index}


def record(parts: Sequence[tuple[str, Path, Mapping[str, Any]]]) -> str:
    """The ``parts`` attribute of a release over ``parts``: (the name it is published under,
    its file now, its shard manifest), in write order. The files are final by then: a
    published part is a hard link of the same file."""
    return json.dumps(
        [
            Part(
                name, path.stat().st_size, str(manifest["shard"]), int(manifest["index"])
            ).as_json()
            for name, path, manifest in parts
        ]
    )


def read_parts(handle: h5py.File) -> list[Part] | None:
    """The parts the release recorded; None when it records none (not a virtual release, or
    one made before the record).

    Raises:
        ValueError: the attribute is not the record this version writes.
    """
    text = handle.attrs.get(fileformat.PARTS_ATTR)
    if text is None:
        return None
    try:
        entries = json.loads(text.decode() if isinstance(text, bytes) else str(text))
        return [
            Part(str(e["file"]), int(e["bytes"]), str(e["shard"]), int(e["index"])) for e in entries
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"root attr {fileformat.PARTS_ATTR!r} is damaged: {exc}") from exc


def _virtual(handle: h5py.File) -> Iterator[h5py.Dataset]:
    """Every virtual dataset among the splits' datasets: at the root or one group down
    (``/train/image``, ``/x_train``), never in ``/diagnostics`` (a walk of the whole file
    took a reader's open from 2.3 to 9 ms)."""
    for name, node in handle.items():
        if name == fileformat.DIAGNOSTICS:
            continue
        children = node.values() if isinstance(node, h5py.Group) else [node]
        for child in children:
            if isinstance(child, h5py.Dataset) and child.is_virtual:
                yield child


def mapped_files(handle: h5py.File, datasets: Iterable[h5py.Dataset] | None = None) -> list[str]:
    """The names of the files the release's virtual datasets (of ``datasets`` only, when
    given) map onto, in their order."""
    found = _virtual(handle) if datasets is None else (d for d in datasets if d.is_virtual)
    names = [s.file_name for d in found for s in d.virtual_sources()]
    return list(dict.fromkeys(names))


def part_of_row(dataset: h5py.Dataset, row: int) -> str | None:
    """The part file that holds ``row`` of a virtual dataset (None: not virtual, unmapped)."""
    if not dataset.is_virtual:
        return None
    for source in dataset.virtual_sources():
        low, high = source.vspace.get_select_bounds()
        if low[0] <= row <= high[0]:
            return str(source.file_name)
    return None


def folder_of(handle: h5py.File) -> Path:
    """Where HDF5 looks for the parts: the release's own folder (links followed)."""
    return Path(os.path.realpath(handle.filename)).parent


def part_problems(
    handle: h5py.File,
    *,
    datasets: Iterable[h5py.Dataset] | None = None,
    thorough: bool = False,
) -> list[str]:
    """What is wrong with the parts of the open release, one line per part (none: all is well,
    or the release has no parts). ``datasets``: only the parts these map (a reader's fields).

    Always: each part is there and of the size recorded (a ``stat`` each). With ``thorough``
    (``check``): each opens, carries the identity recorded, and holds every dataset mapped
    onto it, of the rows, shape and dtype mapped.

    Raises:
        ValueError: the release's ``parts`` attribute is damaged.
    """
    folder = folder_of(handle)
    mapped = mapped_files(handle, datasets)  # a part that holds no rows: mapped by none
    recorded = {part.file: part for part in read_parts(handle) or []}
    # an older virtual release records nothing: its mapping names its parts, with no sizes
    parts = [recorded.get(name, Part(name, -1, "", -1)) for name in mapped]
    out = []
    for part in parts:
        problem = _problem(folder / part.file, part)
        if problem is None and thorough:
            problem = _opened_problem(handle, folder / part.file, part)
        if problem is not None:
            out.append(f"part {part.file}: {problem}")
    return out


def _problem(path: Path, part: Part) -> str | None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return (
            "missing: the release maps rows onto it (HDF5 would read them as zeros); "
            "copy it back beside the release, or build the release again"
        )
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if part.size >= 0 and size != part.size:
        return (
            f"{size:,} bytes, the release recorded {part.size:,}: truncated or replaced; "
            "build the release again"
        )
    return None


def _opened_problem(handle: h5py.File, path: Path, part: Part) -> str | None:
    """A part that is there and of its size: does it open, is it the one the release was
    built with, does it hold what is mapped onto it."""
    try:
        with h5py.File(path, "r") as opened:
            if part.index >= 0:
                shard = opened.attrs.get(fileformat.SHARD_ATTR)
                index = opened.attrs.get(fileformat.SHARD_INDEX_ATTR)
                if shard != part.shard or index != part.index:
                    return (
                        f"another build's part (shard {shard} #{index}, the release was built "
                        f"with {part.shard} #{part.index}); build the release again"
                    )
            return _mapping_problem(handle, opened, path.name)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        return f"not readable as HDF5 ({type(exc).__name__}: {exc}); build the release again"


def _mapping_problem(handle: h5py.File, opened: h5py.File, name: str) -> str | None:
    for dataset in _virtual(handle):
        for source in dataset.virtual_sources():
            if source.file_name != name:
                continue
            node = opened.get(source.dset_name)
            if not isinstance(node, h5py.Dataset):
                return f"has no {source.dset_name}, which {dataset.name} maps onto"
            # the rows mapped, from the release's side (the source's selection is stored as
            # "all", whatever its extent)
            low, high = source.vspace.get_select_bounds()
            rows = high[0] - low[0] + 1
            if (
                node.dtype != dataset.dtype
                or node.shape[1:] != dataset.shape[1:]
                or not node.shape
                or node.shape[0] < rows
            ):
                return (
                    f"{source.dset_name} is {node.shape} {node.dtype}; {dataset.name} maps "
                    f"{rows} rows of {dataset.shape[1:]} {dataset.dtype} onto it"
                )
    return None
