"""rows: where a task's accepted samples are placed, a block of rows at a time.

A task's fixed array columns fill one block (``DecodeTask.block`` rows: a whole chunk of every
such column) in a reused per-thread buffer; the moment a block is full it is compressed, hashed
and counted (``h5etl.decode.gather.gather_block``) and the buffer takes the next block. Every
block a task fills is one it keeps (``task.keep_whole_blocks``), so no block is gathered in
vain; a final task's last, partial block is gathered at the end. The bytes are those of
compressing the task's rows at once: the same cuts into chunks, the same digests.

Why a block and not the task: a task of 128 image pairs is 25 MB of rows, and by the time
the last sample was placed the first block's rows had left the caches, so filling, placing,
compressing and hashing each went to memory again (blosc-lz4 and SHA-256 cost 55 us a sample
more than on a block just filled). A raw task (crash isolation) keeps its rows whole: they
leave with the result.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from h5etl.dataflow import DecodeTask
from h5etl.decode.gather import ArrayParts, gather_block
from h5etl.kinds.columns import ArrayColumn

if TYPE_CHECKING:
    from h5etl.decode.recipe import DecodedSample, DecodeRecipe


class TaskRows:
    """The rows a task's accepted samples go to, gathered block by block as they fill.

    ``row(name, index)`` is accepted sample ``index``'s row of column ``name``; call
    ``added(kept)`` after each accepted sample and ``finish(kept, keep)`` at the end.
    """

    def __init__(self, task: DecodeTask, recipe: DecodeRecipe, capacity: int):
        self.recipe = recipe
        self.raw = task.raw
        self.block = max(task.block, 1)
        # a raw task's rows leave with its result: all of them, in buffers of its own
        count = capacity if self.raw else min(self.block, capacity)
        self.out = {name: _batch_buffer(name, column, count) for _, name, column in recipe.arrays}
        self.gathered = 0  # accepted samples whose block is gathered
        self.parts = ArrayParts()
        self._used = False  # the buffers hold a gathered block (filled again when next used)

    def row(self, name: str, index: int) -> np.ndarray:
        if self._used:  # the first sample of the next block: its rows take the fill again
            self._used = False
            for _, column_name, column in self.recipe.arrays:
                self.out[column_name].fill(column.fill)
        row: np.ndarray = self.out[name][index if self.raw else index - self.gathered]
        return row

    def added(self, kept: Sequence[DecodedSample]) -> None:
        """After each accepted sample: a full block is gathered now, while its rows are hot."""
        if self.out and len(kept) - self.gathered == self.block:
            self._gather(kept[self.gathered :])

    def finish(self, kept: Sequence[DecodedSample], keep: int) -> ArrayParts:
        """The task's array columns for its first ``keep`` accepted samples (a final task's
        last block may be partial); a raw task's rows as they are."""
        if not self.out:
            return self.parts  # no fixed array column: nothing to gather here
        if keep > self.gathered:
            self._gather(kept[self.gathered : keep])
        assert keep == self.gathered, "a task keeps whole blocks, and all it gathered"
        if self.raw:
            self.parts.columns = {name: rows[:keep] for name, rows in self.out.items()}
            drop_buffers()  # the rows leave with the result: the next task needs new buffers
        return self.parts

    def _gather(self, block: Sequence[DecodedSample]) -> None:
        start = self.gathered if self.raw else 0
        rows = {name: out[start : start + len(block)] for name, out in self.out.items()}
        gather_block(self.recipe, block, rows, self.parts, raw=self.raw)
        self.gathered += len(block)
        if not self.raw:
            for decoded in block:  # their rows take the next block's samples now
                decoded.windows.clear()
            self._used = True


class _Buffers(threading.local):
    """Per-thread batch buffers, reused while tasks end as encoded bytes: a fresh multi-megabyte
    array per task costs page faults on every first touch, a reused one only the fill. Per
    thread, because a Dask worker may run several tasks at once in one process."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}


_BUFFERS = _Buffers()


def drop_buffers() -> None:
    """Forget this thread's batch buffers (their rows left with a result, or the build ended)."""
    _BUFFERS.arrays.clear()


def _batch_buffer(name: str, column: ArrayColumn, count: int) -> np.ndarray:
    layout = column.layout
    shape = (count, *layout.shape)
    buffer = _BUFFERS.arrays.get(name)
    if (
        buffer is None
        or buffer.dtype != np.dtype(layout.dtype)
        or buffer.shape[1:] != shape[1:]
        or buffer.shape[0] < count
    ):
        buffer = np.empty(shape, dtype=layout.dtype)
        _BUFFERS.arrays[name] = buffer
    rows = buffer[:count]
    rows.fill(column.fill)
    return rows
