"""sink_datasets: the datasets of one split of a release, created empty (part of the sink).

Each storage column becomes its dataset(s) at the layout's path: a fixed array or a ragged
column's values chunked as their layout says, written whole chunks at a time
(``ImageWriter``), a ragged column's offsets beside its values (their first row, 0, written
now; the rest appended with the small rows' runs), scalars and texts appended in runs
(``sink_rows``); then the split's lineage. A column's ``attrs``
go on its dataset at once. A fixed array's dataset may start as a copy of another file's
(``seed``: an incremental build's first carried rows, ``sink_carry.seed_dataset``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl import fileformat
from h5etl.chunkcodec import ChunkLayout
from h5etl.chunkpool import ChunkPool
from h5etl.kinds.base import ArrayColumn, RaggedColumn, ScalarColumn
from h5etl.sink_chunks import DatasetStats, ImageWriter, StoredChunks
from h5etl.sink_rows import SinkLayout


@dataclass(slots=True)
class CreatedSplit:
    """The writers of one split's chunked datasets, and every dataset's digest state."""

    writers: dict[tuple[str, str], ImageWriter] = field(default_factory=dict)
    stats: dict[str, DatasetStats] = field(default_factory=dict)


def _create(file: h5py.File, path: str, **kwargs: Any) -> h5py.Dataset:
    # No object timestamps (track_times): the same inputs make the same bytes.
    parent = path.rsplit("/", 1)[0]
    if parent and parent not in file:
        file.create_group(parent, track_order=True, track_times=False)
    return file.create_dataset(path, track_times=False, **kwargs)


def _offsets(file: h5py.File, path: str, rows: int) -> DatasetStats:
    """A ragged column's offsets dataset, holding its first row (0) and hashed from it."""
    dataset = _create(file, path, shape=(1,), maxshape=(None,), chunks=(rows,), dtype="int64")
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
    rows = layout.rows_per_chunk
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
            out.writers[(split, name)] = ImageWriter(dataset, chunked, stats, stored, pool)
            if isinstance(column, RaggedColumn):
                offsets = _offsets(file, fileformat.offsets_path(path), rows)
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
                chunks=(rows, *shape),
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
        chunks=(rows, width),
        dtype="S64",
    )
    lineage.attrs[fileformat.LINEAGE_COLUMNS_ATTR] = list(layout.sources)
    out.stats[lineage.name] = DatasetStats(lineage.name, stream=hashlib.sha256())
    return out
