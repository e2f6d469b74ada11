"""The storage columns a field kind declares: what each of its datasets holds and how.

A kind names its columns (``Kind.columns``); the sink creates one dataset per column (a ragged
column two: values and offsets) and the layout record describes each (``column_record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from h5etl.format.codec import ChunkLayout, CompressionLike
from h5etl.format.contract import FieldRecord

__all__ = [
    "ArrayColumn",
    "Attrs",
    "Column",
    "RaggedColumn",
    "ScalarColumn",
    "StatsKind",
    "TextColumn",
    "column_record",
]


StatsKind = Literal["channels", "histogram"] | None


Attrs = Mapping[str, Any]
"""Attributes a column writes on its dataset (and records in the layout): ``rate_hz``, ``units``."""


@dataclass(frozen=True, slots=True)
class ArrayColumn:
    """A fixed-shape (N, *shape) array: workers compress whole chunks, the sink stores them.

    ``stats``/``channel_axis``: statistics of this column computed from each sample's value
    (axis of its value holding the channels; None: one channel). Unset, the main column
    (named like its field) takes the kind's ``stats`` over its unpadded window, as ever.
    """

    layout: ChunkLayout
    fill: float  # the value around a smaller input (pad.fill, or pad.mask_fill for a mask)
    attrs: Attrs = field(default_factory=dict)
    stats: StatsKind = None
    channel_axis: int | None = None


@dataclass(frozen=True, slots=True)
class ScalarColumn:
    """One number (or a small fixed-shape array, ``shape``) per sample, (N, *shape): small,
    so the sink buffers and appends its rows."""

    dtype: str
    shape: tuple[int, ...] = ()
    attrs: Attrs = field(default_factory=dict)
    stats: StatsKind = None
    channel_axis: int | None = None


@dataclass(frozen=True, slots=True)
class TextColumn:
    """One UTF-8 string per sample, (N,)."""

    attrs: Attrs = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RaggedColumn:
    """A (length, *trailing) array per sample, lengths differing: stored as one flat values
    dataset (sum of lengths, *trailing) chunked ``layout.chunks`` (rows of values first, then
    tiles of the trailing axes) plus (N+1,) int64 offsets beside it (``OFFSETS_SUFFIX``).
    Sample i is ``values[offsets[i]:offsets[i + 1]]``; a length of 0 is allowed.

    ``layout.shape`` is the trailing shape (``()`` for a 1-D series); ``layout.rows`` the
    value rows per chunk. ``stats``: "channels" (``channel_axis`` -1: per last axis; None:
    one channel over every value) or "histogram", over the values of every sample.
    """

    layout: ChunkLayout
    attrs: Attrs = field(default_factory=dict)
    stats: StatsKind = None
    channel_axis: int | None = None

    @property
    def trailing(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def dtype(self) -> str:
        return self.layout.dtype

    @classmethod
    def of(
        cls,
        dtype: str,
        trailing: tuple[int, ...],
        chunk_rows: int,
        *,
        compression: CompressionLike,
        shuffle: bool = True,
        tile: tuple[int, ...] | None = None,
        attrs: Attrs | None = None,
        stats: StatsKind = None,
        channel_axis: int | None = None,
    ) -> RaggedColumn:
        """A ragged column of ``chunk_rows`` value rows per chunk, each chunk ``tile`` of the
        trailing axes (default: all of them)."""
        chunks = (chunk_rows, *(tile if tile is not None else trailing))
        layout = ChunkLayout(tuple(trailing), dtype, chunks, compression, shuffle)
        return cls(layout, dict(attrs or {}), stats, channel_axis)


Column = ArrayColumn | ScalarColumn | TextColumn | RaggedColumn


def column_record(kind: str, column: Column) -> FieldRecord:
    """How the layout record describes one storage column of a field of ``kind``."""
    extra = dict(column.attrs)
    if isinstance(column, ArrayColumn):
        return FieldRecord(kind, "fixed", column.layout.dtype, column.layout.shape, extra)
    if isinstance(column, ScalarColumn):
        return FieldRecord(kind, "fixed", column.dtype, column.shape, extra)
    if isinstance(column, RaggedColumn):
        return FieldRecord(kind, "ragged", column.layout.dtype, column.layout.shape, extra)
    return FieldRecord(kind, "text", "str", (), extra)
