"""fileinfo: what a file is, in h5etl's words. Opens it or says why not; names its filters
and which tools can read them.

Checked with Debian's HDF5 1.10.8 tools: gzip and shuffle are built into every HDF5; lzf is
h5py's own filter (hdf5plugin has none); Blosc and Zstd come from hdf5plugin. Without the
filter, h5dump prints ``DATA { }`` (exit code 0 for a subset) and h5ls "Unable to print data".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import h5py
import hdf5plugin

from h5etl.errors import CheckFailed, UsageError
from h5etl.format import contract as fileformat

BUILT_IN = {1: "gzip", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset"}
HDF5PLUGIN = {number: name for name, number in hdf5plugin.FILTERS.items()}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at 0, 512, 1024, 2048, ... (after a user block)
PLUGIN_NAMES = {
    "blosc": "Blosc",
    "blosc2": "Blosc2",
    "zstd": "Zstd",
    "lz4": "LZ4",
    "bshuf": "Bitshuffle",
}


def files_open() -> int:
    """How many HDF5 files, datasets, groups and attributes this process holds open (through
    any h5py handle). Not files alone: a file whose handle is gone stays open in HDF5 while a
    dataset of it is (HDF5's default weak close), unflushed."""
    h5f = h5py.h5f
    kinds = h5f.OBJ_FILE | h5f.OBJ_DATASET | h5f.OBJ_GROUP | h5f.OBJ_ATTR
    count: int = h5f.get_obj_count(h5f.OBJ_ALL, kinds)
    return count


def filter_ids(dataset: h5py.Dataset) -> list[int]:
    """The dataset's filter ids, in pipeline order (empty for contiguous datasets); a virtual
    dataset's are those of its first part (a sharded release's parts all share them)."""
    if dataset.is_virtual:
        sources = dataset.virtual_sources()
        if not sources:
            return []
        folder = os.path.dirname(dataset.file.filename)
        try:
            with h5py.File(os.path.join(folder, sources[0].file_name), "r") as part:
                return filter_ids(part[sources[0].dset_name])
        except (OSError, KeyError):
            return []  # a part that is not there: check --deep reports its rows
    plist = dataset.id.get_create_plist()
    return [int(plist.get_filter(index)[0]) for index in range(plist.get_nfilters())]


def filter_name(number: int) -> str:
    if number == fileformat.FILTER_LZF:
        return "lzf"
    return BUILT_IN.get(number) or HDF5PLUGIN.get(number) or f"filter {number}"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def readers(numbers: Iterable[int]) -> str:
    """Which tools can read data stored through these filters: one line, for ``check``."""
    used = sorted(set(numbers))
    if all(n in BUILT_IN for n in used):
        names = [BUILT_IN[n] for n in used]
        why = (
            f"{_and(names)} {'is' if len(names) == 1 else 'are'} built into HDF5"
            if names
            else "no filters"
        )
        return f"readable by: every HDF5 tool and library ({why})"
    pip = [PLUGIN_NAMES.get(HDF5PLUGIN[n], HDF5PLUGIN[n]) for n in used if n in HDF5PLUGIN]
    other = [
        f"filter {n}"
        for n in used
        if n not in BUILT_IN and n not in HDF5PLUGIN and n != fileformat.FILTER_LZF
    ]
    h5py_reads = 'h5py after "import hdf5plugin"' if pip else "h5py"
    if other:
        h5py_reads += f" with the plugin for {_and(other)} in HDF5_PLUGIN_PATH"
    if fileformat.FILTER_LZF in used:
        h5py_reads += " (lzf is h5py's own filter)"
    plugins = ["LZF"] * (fileformat.FILTER_LZF in used) + pip + other
    many = len(plugins) > 1
    where = ""
    if pip:
        where = (
            f" (hdf5plugin.PLUGIN_PATH holds {'it' if plugins == pip and not many else _and(pip)})"
        )
    return (
        f"readable by: {h5py_reads}; h5dump, h5ls and other HDF5 tools need the "
        f"{_and(plugins)} plugin{'s' if many else ''} in HDF5_PLUGIN_PATH{where}, "
        f"without {'them' if many else 'it'} they print no data"
    )


def open_file(path: Path) -> h5py.File:
    """Open the release file ``path`` read-only.

    Raises:
        UsageError: ``path`` is no file: missing, a folder, a link to nothing, a FIFO.
        CheckFailed: the file is not HDF5, or HDF5 cannot open it (truncated, overwritten).
    """
    if path.is_symlink() and not path.exists():
        raise UsageError(
            f"a link to {os.readlink(path)}, which does not exist; "
            "point it at a release with h5etl rollback",
            path=path,
        )
    if not path.exists():
        raise UsageError("no such file; give a release file or its link", path=path)
    if path.is_dir():
        raise UsageError(
            "a folder, not a release file; h5etl releases lists the releases in it", path=path
        )
    if not path.is_file():  # a FIFO would block the open
        raise UsageError("not a regular file (a FIFO, socket or device)", path=path)
    try:
        return h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise CheckFailed(_why_not_hdf5(path, exc), path=path) from exc


def _why_not_hdf5(path: Path, exc: Exception) -> str:
    """Why HDF5 could not open ``path``, in our words, without HDF5's."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as raw:
            offset, signed = 0, False
            while offset + len(HDF5_SIGNATURE) <= size and not signed:
                raw.seek(offset)
                signed = raw.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
                offset = max(512, offset * 2)
    except OSError as error:
        return f"cannot read it: {error.strerror or error}"
    if not size:
        return "an empty file, not an HDF5 file (h5etl releases are HDF5)"
    if not signed:
        return "not an HDF5 file (h5etl releases are HDF5)"
    if "truncated file" in str(exc):
        return (
            f"a truncated HDF5 file: HDF5 cannot open it ({size:,} bytes are left of it); "
            "copy it again from where it came from"
        )
    return "a damaged HDF5 file: HDF5 cannot open it; copy it again from where it came from"


def sample_counts(handle: h5py.File) -> dict[str, int]:
    """Samples per split, as the layout record says where they are: the longest field.

    Raises:
        ValueError: the layout record is damaged or newer than this version reads.
    """
    record = fileformat.read_layout(handle)
    counts = {}
    for split in record.splits:
        rows = [0]
        for name, column in record.storage.items():
            ragged = column.column == "ragged"  # (N+1,) offsets beside the values
            path = record.path(split, name)
            path = fileformat.offsets_path(path) if ragged else path
            node = handle.get(path)
            if isinstance(node, h5py.Dataset) and node.shape:
                rows.append(int(node.shape[0]) - ragged)
        counts[split] = max(rows)
    return counts


def why_not_readable(path: Path, exc: Exception) -> str:
    """Why ``path`` could not be read as a release, in one line."""
    return _why_not_hdf5(path, exc) if isinstance(exc, OSError) else str(exc)


def field_kinds(path: Path) -> dict[str, str]:
    """Each field's kind, as the release's layout record says; {} where it cannot be read."""
    try:
        with h5py.File(path, "r") as handle:
            record = fileformat.read_layout(handle)
    except (OSError, ValueError, KeyError):
        return {}
    return {name: field.kind for name, field in record.fields.items()}


def contents(path: Path) -> str:
    """What a release holds, as its layout record says: samples per split and the fields
    with their kinds (``train 34, valid 6; image (image), mask (mask)``), or why not."""
    try:
        with h5py.File(path, "r") as handle:
            record = fileformat.read_layout(handle)
            counts = sample_counts(handle)
    except (OSError, ValueError, KeyError) as exc:
        return f"unreadable: {why_not_readable(path, exc)}"
    fields = ", ".join(f"{name} ({field.kind})" for name, field in record.fields.items())
    shown = ", ".join(f"{split} {n}" for split, n in counts.items())
    return f"{shown}; {fields}"
