"""check, for ragged columns: their offsets datasets, and how many rows each dataset holds.

A ragged column is two datasets: its values (sum of lengths rows) and its (N+1,) int64
offsets beside them (``fileformat.offsets_path``). ``check`` lists both; their row counts
follow from the split's sample count N and from the offsets, which must start at 0, never
decrease and end at the values' length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import h5py
import numpy as np

from h5etl.format import contract as fileformat
from h5etl.format.contract import LayoutRecord

OFFSETS_ROWS = 1 << 20  # offsets read this many at a time: bounded memory
Problem = Callable[[str], None]


def ragged_columns(record: LayoutRecord) -> list[str]:
    return [name for name, column in record.storage.items() if column.column == "ragged"]


def offsets_paths(record: LayoutRecord, split: str) -> dict[str, str]:
    """``<column>_offsets`` -> its dataset path, for each ragged column of ``split``."""
    return {
        name + fileformat.OFFSETS_SUFFIX: fileformat.offsets_path(record.path(split, name))
        for name in ragged_columns(record)
    }


def expected_rows(
    record: LayoutRecord, datasets: Mapping[str, h5py.Dataset]
) -> tuple[int, dict[str, int]]:
    """The split's sample count, and the rows each of its datasets must hold.

    The count is that of the row-aligned datasets (one row per sample); without any, the
    offsets' length minus one. A ragged column's values hold its last offset rows.
    """
    ragged = set(ragged_columns(record))
    offsets = {name + fileformat.OFFSETS_SUFFIX: name for name in ragged}
    aligned = [_rows(ds) for n, ds in datasets.items() if n not in ragged and n not in offsets]
    from_offsets = [max(_rows(ds) - 1, 0) for n, ds in datasets.items() if n in offsets]
    count = max(aligned or from_offsets or [0])
    rows: dict[str, int] = {}
    for name, dataset in datasets.items():
        if name in offsets:
            rows[name] = count + 1
        elif name in ragged:
            rows[name] = _last_offset(datasets.get(name + fileformat.OFFSETS_SUFFIX), dataset)
        else:
            rows[name] = count
    return count, rows


def _rows(dataset: h5py.Dataset) -> int:
    return int(dataset.shape[0]) if dataset.shape else 0  # a scalar or empty dataspace: none


def _last_offset(offsets: h5py.Dataset | None, values: h5py.Dataset) -> int:
    """The rows the values must hold; their own count when the offsets cannot say (the
    offsets' problem is reported on its own)."""
    if offsets is None or offsets.ndim != 1 or not _rows(offsets):
        return _rows(values)
    try:
        return int(offsets[-1])
    except (OSError, TypeError, ValueError):
        return _rows(values)


def check_offsets(values: h5py.Dataset, offsets: h5py.Dataset, problem: Problem) -> None:
    """Offsets start at 0, never decrease and end at the values' rows; else a problem."""
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or not values.shape:
        problem(f"{offsets.name}: {offsets.dtype} {offsets.shape}, not (N+1,) int64 offsets")
        return
    total = len(offsets)
    if not total:
        problem(f"{offsets.name}: empty; a ragged column's offsets start with 0")
        return
    previous = None
    for start in range(0, total, OFFSETS_ROWS):
        try:
            block = np.asarray(offsets[start : start + OFFSETS_ROWS], dtype=np.int64)
        except OSError as exc:
            problem(f"{offsets.name}: rows from {start} unreadable: {exc}")
            return
        if start == 0 and block[0] != 0:
            problem(f"{offsets.name}: starts at {int(block[0])}, not 0")
        joined = block if previous is None else np.concatenate([[previous], block])
        down = np.flatnonzero(np.diff(joined) < 0)
        if len(down):
            at = int(down[0]) + start - (previous is not None)
            problem(f"{offsets.name}: decreases after sample {at} (a negative length)")
            return
        previous = int(block[-1])
    if previous != values.shape[0]:
        problem(f"{offsets.name}: ends at {previous}, but {values.name} holds {len(values)} rows")
