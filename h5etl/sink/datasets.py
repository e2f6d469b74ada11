"""datasets: the datasets of one split of a release, created empty (part of the sink).

Each storage column becomes its dataset(s) at the layout's path: a fixed array or a ragged
column's values chunked as their layout says, written whole chunks at a time
(``ArrayWriter``), a ragged column's offsets beside its values (their first row, 0, written
now; the rest appended with the small rows' runs), scalars and texts appended in runs
(``small_columns``); then the split's lineage; those small columns chunked by bytes
(``small_chunk_rows``). A column's ``attrs``
go on its dataset at once. A fixed array's dataset may start as a copy of another file's
(``seed``: an incremental build's first carried rows, ``parent_rows.seed_dataset``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl.format import contract as fileformat
from h5etl.format.codec import ChunkLayout
from h5etl.kinds.columns import ArrayColumn, RaggedColumn, ScalarColumn
from h5etl.sink.array_writer import ArrayWriter, DatasetStats, StoredChunks
from h5etl.sink.compress_threads import ChunkPool
from h5etl.sink.small_columns import SinkLayout


@dataclass(slots=True)
class CreatedSplit:
    """The writers of one split's chunked datasets, and every dataset's digest state."""

    writers: dict[tuple[str, str], ArrayWriter] = field(default_factory=dict)
    stats: dict[str, DatasetStats] = field(default_factory=dict)


def _create(file: h5py.File, path: str, **kwargs: Any) -> h5py.Dataset:
    # No object timestamps (track_times): the same inputs make the same bytes.
    parent = path.rsplit("/", 1)[0]
    if parent and parent not in file:
        file.create_group(parent, track_order=True, track_times=False)
    return file.create_dataset(path, track_times=False, **kwargs)


# The small columns (offsets, scalars, texts, the lineage) are chunked by bytes, never by
# samples: one row per chunk (a volume or series release has no array field whose chunk rows
# they followed) made 100k offsets 4.5 MB on disk instead of 0.8 MB and a whole read 0.86 s
# instead of 1 ms, paid by every loader worker that opens the file. 64 KiB: a whole column
# reads in a few chunks. HDF5 stores a partly filled chunk whole, so no chunk holds many
# more rows than the split is planned to have: a tiny release stays tiny.
SMALL_CHUNK_BYTES = 64 * 1024
MIN_SMALL_ROWS = 64  # never fewer rows a chunk (a row wider than 1 KiB, a tiny split)
VLEN_BYTES = 16  # a variable-length string's element in the file: length + global heap id


def small_chunk_rows(row_bytes: int, planned: int | None = None) -> int:
    """Rows per chunk of a small column whose rows take ``row_bytes`` each: the largest power
    of two that fits ``SMALL_CHUNK_BYTES``, but no more than the power of two that holds the
    ``planned`` rows, and at least ``MIN_SMALL_ROWS``. A function of the row size and the
    plan alone, so a resume, the shards and their stitch chunk a column alike (reproducible
    bytes); carried and stitched rows are appended as values, never as chunks."""
    fits = max(1, SMALL_CHUNK_BYTES // max(1, row_bytes))
    rows = 1 << (fits.bit_length() - 1)
    if planned is not None:
        rows = min(rows, 1 << max(0, planned - 1).bit_length())
    return max(MIN_SMALL_ROWS, rows)


def _small_chunks(dtype: Any, shape: tuple[int, ...], planned: int | None) -> tuple[int, ...]:
    """The chunk shape of a small column of ``dtype`` with per-row ``shape``."""
    vlen = h5py.check_vlen_dtype(np.dtype(dtype)) is not None
    itemsize = VLEN_BYTES if vlen else np.dtype(dtype).itemsize
    return (small_chunk_rows(itemsize * math.prod(shape), planned), *shape)


def _offsets(file: h5py.File, path: str, planned: int | None) -> DatasetStats:
    """A ragged column's offsets dataset, holding its first row (0) and hashed from it."""
    chunks = _small_chunks("int64", (), None if planned is None else planned + 1)  # N + 1 rows
    dataset = _create(file, path, shape=(1,), maxshape=(None,), chunks=chunks, dtype="int64")
    first = np.zeros(1, dtype=np.int64)
    dataset[0] = 0
    stats = DatasetStats(dataset.name, stream=hashlib.sha256())
    stats.stream.update(first.tobytes())
    stats.raw_bytes = first.nbytes
    return stats


# Given a fixed array's name, path and chunk layout: its dataset created as a copy, or None
Seeder = Callable[[str, str, ChunkLayout], h5py.Dataset | None]


def create_split(
    file: h5py.File,
    layout: SinkLayout,
    split: str,
    stored: StoredChunks,
    pool: ChunkPool,
    seed: Seeder | None = None,
) -> CreatedSplit:
    """Create every dataset of ``split``, empty and extendable along the first axis (a fixed
    array's as ``seed`` copies it, if it does); the chunk writers note what they store in
    ``stored`` and compress on ``pool`` (the sink's, shared)."""
    out = CreatedSplit()
    planned = layout.planned.get(split)
    for name, column in layout.columns.items():
        path = layout.path(split, name)
        if isinstance(column, ArrayColumn | RaggedColumn):
            chunked = column.layout
            seeded = None
            if seed is not None and isinstance(column, ArrayColumn):
                seeded = seed(name, path, chunked)
            dataset = seeded or _create(
                file,
                path,
                shape=(0, *chunked.shape),
                maxshape=(None, *chunked.shape),
                dtype=chunked.dtype,
                chunks=chunked.chunks,
                **chunked.filter_kwargs(),
            )
            stats = DatasetStats(dataset.name, block_rows=chunked.rows)
            out.writers[(split, name)] = ArrayWriter(dataset, chunked, stats, stored, pool)
            if isinstance(column, RaggedColumn):
                offsets = _offsets(file, fileformat.offsets_path(path), planned)
                out.stats[offsets.path] = offsets
        else:
            dtype: Any = h5py.string_dtype("utf-8")
            shape: tuple[int, ...] = ()
            if isinstance(column, ScalarColumn):
                dtype, shape = column.dtype, column.shape
            dataset = _create(
                file,
                path,
                shape=(0, *shape),
                maxshape=(None, *shape),
                chunks=_small_chunks(dtype, shape, planned),
                dtype=dtype,
            )
            stats = DatasetStats(dataset.name, stream=hashlib.sha256())
        dataset.attrs.update(column.attrs)
        out.stats[dataset.name] = stats
    width = len(layout.sources)
    lineage = _create(
        file,
        layout.path(split, fileformat.LINEAGE),
        shape=(0, width),
        maxshape=(None, width),
        chunks=_small_chunks("S64", (width,), planned),
        dtype="S64",
    )
    lineage.attrs[fileformat.LINEAGE_COLUMNS_ATTR] = list(layout.sources)
    out.stats[lineage.name] = DatasetStats(lineage.name, stream=hashlib.sha256())
    return out
