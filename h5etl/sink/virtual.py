"""virtual: a release's array datasets as HDF5 virtual datasets over its part files.

Part of the sink (the only code that writes HDF5). A virtual release stores no array chunks
itself: each array dataset maps its rows, in write order, onto the same dataset of each part
(a shard file, published beside the release under ``release.part_filename``). Part names are
relative, so HDF5 looks for them in the release's own folder: the parts must travel with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h5py

from h5etl.format.codec import ChunkLayout
from h5etl.kinds.columns import ArrayColumn
from h5etl.sink.array_writer import DatasetStats
from h5etl.sink.datasets import CreatedSplit
from h5etl.sink.small_columns import SinkLayout

__all__ = ["VirtualColumn", "add_part", "create_virtual", "map_arrays"]


@dataclass(slots=True)
class VirtualColumn:
    """One array dataset of a virtual release: its parts, in write order."""

    layout: ChunkLayout
    fill: float
    sources: list[tuple[str, int]] = field(default_factory=list)  # (part file name, rows)
    stored_bytes: int = 0  # what its parts store for it

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.sources)


def create_virtual(file: h5py.File, path: str, column: VirtualColumn) -> h5py.Dataset:
    """Create ``path`` in ``file`` as a virtual dataset over the column's parts."""
    layout = column.layout
    virtual = h5py.VirtualLayout(shape=(column.rows, *layout.shape), dtype=layout.dtype)
    start = 0
    for name, rows in column.sources:
        if rows:
            source = h5py.VirtualSource(name, path, shape=(rows, *layout.shape))
            virtual[start : start + rows] = source
            start += rows
    parent = path.rsplit("/", 1)[0]
    if parent and parent not in file:
        file.create_group(parent, track_order=True)
    dataset: h5py.Dataset = file.create_virtual_dataset(path, virtual, fillvalue=column.fill)
    return dataset


def map_arrays(
    file: h5py.File,
    layout: SinkLayout,
    created: CreatedSplit,
    virtual: dict[tuple[str, str], VirtualColumn],
) -> None:
    """A virtual release's split: its fixed arrays become virtual datasets over the parts at
    the finish, so the empty ones just created go again, and their writers with them."""
    for key, writer in list(created.writers.items()):
        column = layout.columns[key[1]]
        if isinstance(column, ArrayColumn):
            del file[writer.dataset.name]
            virtual[key] = VirtualColumn(column.layout, column.fill)
            del created.writers[key]


def add_part(
    column: VirtualColumn,
    stats: DatasetStats,
    part: str,
    rows: int,
    blocks: list[bytes],
    stored: int,
) -> None:
    """Map the next ``rows`` rows of a column onto the part file ``part`` (a name in the
    release's folder), with their block digests and the bytes the part stores for them."""
    column.sources.append((part, rows))
    column.stored_bytes += stored
    stats.blocks.extend(blocks)
    stats.raw_bytes += rows * column.layout.block_nbytes // column.layout.rows
