"""gather: gather one task's accepted samples into stored columns, compressed and counted.

Per block, in the worker, as its rows fill (``gather_block``, called by
``h5etl.decode.rows``): the fixed array columns compressed and hashed, their statistics. Per
task (``gather``): the other columns' rows (ragged values per row when one value row is a
chunk), the per-block and per-task statistics, the conversions; and ``join_results``, which
joins the raw one-sample results of a task that crash isolation decoded sample by sample.
``h5etl.decode.task`` decodes the samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl.dataflow import BatchResult, BlockTally, EncodedRows, RaggedRows
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.format.codec import BlockEncoder, encode_rows
from h5etl.kinds.base import EncodedValue, Kind
from h5etl.kinds.columns import ArrayColumn, Column, RaggedColumn, ScalarColumn, TextColumn
from h5etl.stats import normalisation as stats

if TYPE_CHECKING:
    from h5etl.decode.recipe import DecodedSample, DecodeRecipe


@dataclass(slots=True)
class ArrayParts:
    """A task's fixed array columns, gathered block by block (``h5etl.decode.rows``): each
    column's compressed chunks and block digests (a raw task's: its rows as they are), and
    per block the statistics of each column that has them."""

    columns: dict[str, EncodedRows | np.ndarray] = field(default_factory=dict)
    stats: list[dict[str, Any]] = field(default_factory=list)


def gather_block(
    recipe: DecodeRecipe,
    block: Sequence[DecodedSample],
    rows: dict[str, np.ndarray],
    parts: ArrayParts,
    *,
    raw: bool,
) -> None:
    """Add one block of accepted samples to ``parts``: each array column's ``rows`` (the
    block's, by column) compressed and hashed (unless ``raw``), and its statistics over
    the samples' windows (their unpadded pixels, views of those rows)."""
    found: dict[str, Any] = {}
    for kind, name, column in recipe.arrays:
        stat = _task_stats(kind, name, column, block, None)
        if stat is not None:
            found[name] = stat
        if raw:
            continue
        encoded = parts.columns.get(name)
        if encoded is None:
            encoded = parts.columns[name] = EncodedRows([], [])
        assert isinstance(encoded, EncodedRows)
        chunks, digests = encode_rows(column.layout, rows[name])
        encoded.blocks.extend(chunks)
        encoded.digests.extend(digests)
    parts.stats.append(found)


def gather(
    result: BatchResult,
    recipe: DecodeRecipe,
    kept: Sequence[DecodedSample],
    arrays: ArrayParts,
) -> None:
    """Fill ``result`` from the accepted samples: columns, keys, lineage, stats, conversions;
    the array columns as ``gather_block`` gathered them."""
    result.accepted = len(kept)
    result.keys = [d.sample.key for d in kept]
    result.lineage = [d.hashes for d in kept]
    result.columns[fileformat.SAMPLE_KEY] = [d.sample.split_name for d in kept]
    result.columns[fileformat.SAMPLE_GROUP] = [d.sample.group for d in kept]
    step = result.task.block or 1
    cuts = range(0, len(kept), step)
    result.blocks = [BlockTally() for _ in cuts]
    for kind, name, column in recipe.columns:
        if isinstance(column, ArrayColumn):
            rows = arrays.columns.get(name)
            result.columns[name] = EncodedRows([], []) if rows is None else rows
            for tally, found in zip(result.blocks, arrays.stats, strict=True):
                if name in found:
                    tally.stats[name] = found[name]
        else:
            result.columns[name] = _rows_of(kind, name, column, kept, raw=result.task.raw)
            stored = result.columns[name]
            for tally, start in zip(result.blocks, cuts, strict=True):
                # per block, so an incremental build can carry a block with its statistics;
                # the sums are exact, so the task's total is the same as over the task at once
                part = (
                    stored[start : start + step] if isinstance(stored, np.ndarray | list) else None
                )
                stat = _task_stats(kind, name, column, kept[start : start + step], part)
                if stat is not None:
                    tally.stats[name] = stat
        parts = [t.stats[name] for t in result.blocks if name in t.stats]
        if parts:
            result.stats[name] = merge_all(parts)
    for tally, start in zip(result.blocks, cuts, strict=True):
        tally.conversions = _conversions(kept[start : start + step])
    result.conversions = _conversions(kept)


def _rows_of(
    kind: Kind, name: str, column: Column, kept: Sequence[DecodedSample], *, raw: bool
) -> Any:
    """The rows of a column other than a fixed array: numbers, ragged values or texts."""
    values = [d.values[name] for d in kept]
    if isinstance(column, ScalarColumn):
        return _scalar_rows(values, column)
    if isinstance(column, RaggedColumn):
        return _ragged_rows(kind, name, values, column, raw=raw)
    return [str(v) for v in values]


def _conversions(kept: Sequence[DecodedSample]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for d in kept:
        for name, code in d.conversions:
            counts.setdefault(name, Counter())[code] += 1
    return {name: dict(count) for name, count in counts.items()}


def _scalar_rows(values: Sequence[Any], column: ScalarColumn) -> np.ndarray:
    return np.array(values, dtype=column.dtype).reshape(len(values), *column.shape)


def _ragged_rows(
    kind: Kind, name: str, values: Sequence[Any], column: RaggedColumn, *, raw: bool
) -> RaggedRows:
    """A task's values of one ragged column and each sample's length.

    With one value row per chunk every sample starts on a chunk boundary, so the worker
    compresses its chunks (and hashes each block) and only compressed bytes travel; else the
    values' place in the chunk grid depends on the samples of earlier tasks, so they travel
    raw, end to end, and the writer cuts them into chunks.
    """
    encoded = any(isinstance(v, EncodedValue) for v in values)
    if encoded and (raw or column.layout.rows != 1):
        raise TypeError(f"{kind.kind} field {kind.name}: an EncodedValue in a raw task")
    arrays = [v if isinstance(v, EncodedValue) else np.asarray(v) for v in values]
    for array in arrays:
        if isinstance(array, EncodedValue):
            continue
        if array.shape[1:] != column.trailing or array.dtype != np.dtype(column.dtype):
            raise TypeError(
                f"{kind.kind} field {kind.name}: column {name} takes (length, "
                f"*{column.trailing}) {column.dtype} values, got {array.shape} {array.dtype}"
            )
    lengths = np.array(
        [a.rows if isinstance(a, EncodedValue) else len(a) for a in arrays], dtype=np.int64
    )
    if column.layout.rows == 1 and not raw:
        return RaggedRows(_encoded_rows(arrays, column), lengths)
    empty = np.empty((0, *column.trailing), dtype=column.dtype)
    return RaggedRows(np.concatenate([empty, *arrays]), lengths)


def _encoded_rows(arrays: Sequence[np.ndarray | EncodedValue], column: RaggedColumn) -> EncodedRows:
    """Every value row of ``arrays`` as its own block of compressed chunks (chunk rows 1);
    a value its kind compressed already (``EncodedValue``) as it is."""
    blocks, digests = [], []
    with BlockEncoder(column.layout) as encoder:
        for array in arrays:
            if isinstance(array, EncodedValue):
                blocks.extend(array.encoded.blocks)
                digests.extend(array.encoded.digests)
                continue
            for index in range(len(array)):
                row = array[index : index + 1]
                digests.append(digest.block_digest(row))
                blocks.append(encoder.encode(row))
    return EncodedRows(blocks, digests)


def _column_stats(column: Column, values: np.ndarray, *, batched: bool = False) -> Any:
    """A column's own statistics (``stats``/``channel_axis``) of one sample's values, or of
    a task's rows (``batched``: a sample axis first)."""
    assert not isinstance(column, TextColumn)
    if column.stats == "histogram":
        return stats.Histogram.of(values)
    axis = column.channel_axis
    if axis is not None and batched and axis >= 0:
        axis += 1  # counted in one sample's value, behind the task's sample axis
    return stats.ChannelStats.of(values, channel_axis=axis)


def _task_stats(
    kind: Kind, name: str, column: Column, kept: Sequence[DecodedSample], rows: Any
) -> Any:
    if not kept:
        return None
    if not isinstance(column, TextColumn) and column.stats is not None:
        if isinstance(column, RaggedColumn):
            return merge_all([_ragged_stats(column, d.values[name]) for d in kept])
        if isinstance(column, ArrayColumn):
            return merge_all([_column_stats(column, d.windows[name]) for d in kept])
        return _column_stats(column, np.asarray(rows), batched=True)
    if name != kind.name or kind.stats is None:
        return None
    if isinstance(column, ArrayColumn):
        return kind.task_stats([d.windows[name] for d in kept])
    values = np.asarray(rows)
    if kind.stats == "histogram":
        return stats.Histogram.of(values)
    return stats.ChannelStats.of(values, channel_axis=None)


def _ragged_stats(column: RaggedColumn, value: Any) -> Any:
    if isinstance(value, EncodedValue):
        return value.stats  # the kind's, slab by slab (exact sums: the same numbers)
    return _column_stats(column, np.asarray(value))


def merge_all(parts: Sequence[Any]) -> Any:
    """One statistic from several (exact sums: the grouping never changes the result)."""
    total = parts[0]
    for part in parts[1:]:
        total = total.merge(part)
    return total


def join_results(into: BatchResult, recipe: DecodeRecipe, parts: Sequence[BatchResult]) -> None:
    """Append the raw results of samples decoded one by one (crash isolation) to ``into``."""
    into.accepted = sum(part.accepted for part in parts)
    step = into.task.block or 1
    into.blocks = [_joined_tally(parts[i : i + step]) for i in range(0, len(parts), step)]
    for part in parts:
        into.keys.extend(part.keys)
        into.lineage.extend(part.lineage)
        for name, codes in part.conversions.items():
            known = into.conversions.setdefault(name, {})
            for code, count in codes.items():
                known[code] = known.get(code, 0) + count
    for name in fileformat.SAMPLE_KEYS:
        into.columns[name] = [text for part in parts for text in part.columns[name]]  # type: ignore[union-attr]
    for _, name, column in recipe.columns:
        pieces = [part.columns[name] for part in parts]
        into.columns[name] = _joined(column, pieces)
        found = [part.stats[name] for part in parts if name in part.stats]
        if found:
            into.stats[name] = merge_all(found)


def _joined(column: Column, pieces: Sequence[Any]) -> Any:
    """One column's rows of several raw results, end to end."""
    if isinstance(column, ArrayColumn):
        empty = np.empty((0, *column.layout.shape), column.layout.dtype)
        return np.concatenate([empty, *pieces])
    if isinstance(column, ScalarColumn):
        return np.concatenate([np.empty((0, *column.shape), column.dtype), *pieces])
    if isinstance(column, RaggedColumn):
        values = np.empty((0, *column.trailing), column.dtype)
        return RaggedRows(
            np.concatenate([values, *(_raw(p) for p in pieces)]),
            np.concatenate([np.empty(0, np.int64), *(p.lengths for p in pieces)]),
        )
    return [text for piece in pieces for text in piece]


def _raw(rows: RaggedRows) -> np.ndarray:
    assert isinstance(rows.values, np.ndarray), "a task isolated after a crash comes back raw"
    return rows.values


def _joined_tally(parts: Sequence[BatchResult]) -> BlockTally:
    """One block's tally from the one-sample results crash isolation joins."""
    tally = BlockTally()
    for part in parts:
        for block in part.blocks:
            for name, stat in block.stats.items():
                known = tally.stats.get(name)
                tally.stats[name] = stat if known is None else known.merge(stat)
            for name, codes in block.conversions.items():
                counts = tally.conversions.setdefault(name, {})
                for code, count in codes.items():
                    counts[code] = counts.get(code, 0) + count
    return tally
