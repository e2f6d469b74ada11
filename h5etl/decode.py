"""decode: in a worker, turn one task's files into validated, stacked, compressed columns.

Per sample: read the bytes once (hashing them for lineage), then each field's kind decodes,
fits and validates its value (``h5etl.kinds``); a sample is kept only when every field
accepts it. Per task: keep whole chunks of accepted samples (reserves replace rejects; what
cannot fill a chunk is deferred), compress the array columns and hash each block, gather the
statistics, so the single writer only writes. Scheduling the tasks is ``h5etl.schedule``'s job.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from h5etl import digest, fileformat, inputs, stats
from h5etl.chunkcodec import BlockEncoder, encode_rows
from h5etl.errors import RejectError
from h5etl.kinds.base import (
    ArrayColumn,
    Column,
    EncodedValue,
    Kind,
    RaggedColumn,
    SampleContext,
    ScalarColumn,
    TextColumn,
)
from h5etl.records import (
    BatchResult,
    BlockTally,
    DecodeTask,
    EncodedRows,
    RaggedRows,
    Sample,
    sample_rejects,
)

STAGE = "decode"


@dataclass(frozen=True, slots=True)
class DecodeRecipe:
    """Everything a worker needs, frozen and picklable: the fields' kinds, in decode order."""

    kinds: tuple[Kind, ...]
    order: tuple[int, ...]  # positions in ``kinds``: each field after those it depends on
    plan_fields: tuple[str, ...] = ()  # fields whose values travel in ``Sample.extras``
    # every storage column: (its kind, its dataset name, the column), in field order
    columns: tuple[tuple[Kind, str, Column], ...] = ()
    arrays: tuple[tuple[Kind, str, ArrayColumn], ...] = ()  # the fixed array columns
    multi: frozenset[str] = frozenset()  # kinds whose decode returns a dict by column
    self_read: frozenset[int] = frozenset()  # sources their kinds read themselves

    @classmethod
    def of(cls, kinds: Sequence[Kind], order: Sequence[int]) -> DecodeRecipe:
        planned = tuple(kind.name for kind in kinds if kind.plan_side)
        columns = tuple(
            (kind, name, column) for kind in kinds for name, column in kind.columns.items()
        )
        arrays = tuple(
            (kind, name, column)
            for kind, name, column in columns
            if isinstance(column, ArrayColumn)
        )
        multi = frozenset(kind.name for kind in kinds if kind.multi_column)
        self_read = frozenset(
            kind.source_index
            for kind in kinds
            if kind.reads_own_files and kind.source_index is not None
        )
        return cls(tuple(kinds), tuple(order), planned, columns, arrays, multi, self_read)


@dataclass(slots=True)
class _Decoded:
    """One accepted sample: each field's value, its files' digests, its own statistics."""

    position: int
    sample: Sample
    values: dict[str, Any]
    hashes: tuple[str, ...]
    conversions: list[tuple[str, str]] = field(default_factory=list)
    windows: dict[str, np.ndarray] = field(default_factory=dict)  # unpadded, as stored


def _decode_sample(
    sample: Sample, recipe: DecodeRecipe, position: int, *, raw: bool = False
) -> _Decoded:
    """Decode one sample through every field's kind; rejects raise ``RejectError``."""
    files = sample.paths
    # never a plain open(): a file swapped for a FIFO since it was listed would block it;
    # a source its kind reads itself (a case folder, a volume streamed) is not read here
    contents = [
        b"" if index in recipe.self_read else inputs.read_file(path)
        for index, path in enumerate(files)
    ]
    extras = dict(zip(recipe.plan_fields, sample.extras, strict=True))
    context = SampleContext(sample, contents, extras, files, raw=raw)
    values: dict[str, Any] = {}
    for index in recipe.order:
        kind = recipe.kinds[index]
        if kind.name in recipe.multi:
            values.update(_column_values(kind, kind.decode(context)))
        else:
            values[kind.name] = kind.decode(context)
    decoded = _Decoded(
        position,
        sample,
        values,
        tuple(
            context.digests.get(index) or hashlib.sha256(data).hexdigest()
            for index, data in enumerate(contents)
        ),
        context.conversions,
    )
    return decoded


def _column_values(kind: Kind, found: Any) -> dict[str, Any]:
    """A multi-column kind's value per column (its contract: a dict of exactly them)."""
    if not isinstance(found, dict) or set(found) != set(kind.columns):
        got = sorted(found) if isinstance(found, dict) else type(found).__name__
        raise TypeError(
            f"{kind.kind} field {kind.name}: decode must return a dict of its "
            f"columns {sorted(kind.columns)}, got {got}"
        )
    return found


def capacity_of(task: DecodeTask) -> int:
    """How many accepted samples a task keeps at most: its rows, or all for a final task."""
    return len(task.samples) if task.final else task.rows


def done_decoding(task: DecodeTask, accepted: int, position: int) -> bool:
    """Whether a task stops before ``task.samples[position]``, deferring the rest undecoded.

    It stops once it holds its rows, and (unless final) before starting a block that the
    samples left cannot fill even if none is rejected: decoding them would only be redone.
    """
    if accepted == capacity_of(task):
        return True
    left = len(task.samples) - position
    return not task.final and accepted % task.block == 0 and left < task.block


def keep_whole_blocks(task: DecodeTask, accepted: int) -> int:
    """How many of ``accepted`` samples a task stores: all in a final task, else whole blocks.

    A task that met more rejects than it had reserves keeps only whole chunks of every
    field, so the writer never re-cuts chunks; the rest of its samples are queued again.
    """
    if task.final or accepted >= task.rows:
        return min(accepted, capacity_of(task))
    return accepted // task.block * task.block


def decode_batch(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """Decode one task. Runs in a worker process; only plain data goes in and out.

    Samples are decoded in order until the task's rows are accepted; the reserves after
    that are not decoded and come back deferred (see ``DecodeTask``).
    """
    started = time.perf_counter()
    capacity = capacity_of(task)
    out = {name: _batch_buffer(name, column, capacity) for _, name, column in recipe.arrays}
    result = BatchResult(task, 0)
    kept: list[_Decoded] = []
    for position, sample in enumerate(task.samples):
        if done_decoding(task, len(kept), position):
            result.deferred.extend(range(position, len(task.samples)))
            break
        try:
            decoded = _decode_sample(sample, recipe, position, raw=task.raw)
        except RejectError as exc:
            result.rejects.extend(
                sample_rejects(sample, STAGE, exc.reason, exc.message, str(exc.path or ""))
            )
            continue
        except MemoryError:
            result.rejects.extend(
                sample_rejects(sample, STAGE, "memory_error", "ran out of memory decoding")
            )
            continue
        # Only a sample that passed every check touches its row: a rejected one must not
        # leave pixels in the padding of the sample that takes the row next.
        for kind, name, _ in recipe.arrays:
            row = out[name][len(kept)]
            window = (
                kind.place(decoded.values[name], row)
                if name == kind.name
                else _copy_into(kind, name, decoded.values[name], row)
            )
            decoded.windows[name] = window  # statistics once per task, over these
        kept.append(decoded)
    keep = keep_whole_blocks(task, len(kept))
    result.deferred = sorted([*result.deferred, *(d.position for d in kept[keep:])])
    del kept[keep:]
    gather(result, recipe, kept, {name: rows[:keep] for name, rows in out.items()})
    if task.raw:  # the rows leave with the result: the next task needs new buffers
        drop_buffers()
    # A CT case's thousands of compressed chunks are small heap blocks: freed once the
    # result is sent, the heap would keep them and an idle worker its peak (4 workers held
    # 4 cases' worth at a window of 2). Trim when the result is gone.
    trim_when_gone(result)
    result.seconds = time.perf_counter() - started
    return result


BIG_RESULT = 32 * 2**20  # compressed bytes of a result past which its worker trims its heap


def _encoded_nbytes(result: BatchResult) -> int:
    total = 0
    for rows in result.columns.values():
        encoded = rows.values if isinstance(rows, RaggedRows) else rows
        if isinstance(encoded, EncodedRows):
            total += sum(len(chunk.data) for block in encoded.blocks for chunk in block)
    return total


def trim_when_gone(result: BatchResult) -> None:
    """Trim this process's heap once ``result`` is freed, if it carries a big case."""
    if _encoded_nbytes(result) > BIG_RESULT:
        weakref.finalize(result, _give_back_memory)


def _give_back_memory() -> None:
    """Trim the heap once the result is gone: a finalizer runs as the result starts being
    freed (its chunks still alive), so the trim runs on a thread, after the worker has let
    go of the GIL (waiting for its next task)."""
    from h5etl.schedule import release_free_memory  # schedule imports this module

    def trim() -> None:
        time.sleep(0.05)
        release_free_memory()

    threading.Thread(target=trim, name="h5etl-trim", daemon=True).start()


def gather(
    result: BatchResult,
    recipe: DecodeRecipe,
    kept: Sequence[_Decoded],
    arrays: dict[str, np.ndarray],
) -> None:
    """Fill ``result`` from the accepted samples: columns, keys, lineage, stats, conversions."""
    result.accepted = len(kept)
    result.keys = [d.sample.key for d in kept]
    result.lineage = [d.hashes for d in kept]
    result.columns[fileformat.SAMPLE_KEY] = [d.sample.split_name for d in kept]
    result.columns[fileformat.SAMPLE_GROUP] = [d.sample.group for d in kept]
    step = result.task.block or 1
    cuts = range(0, len(kept), step)
    result.blocks = [BlockTally() for _ in cuts]
    for kind, name, column in recipe.columns:
        values = [d.values[name] for d in kept]
        if isinstance(column, ArrayColumn):
            rows = arrays[name]
            result.columns[name] = rows if result.task.raw else _encoded(rows, column)
        elif isinstance(column, ScalarColumn):
            result.columns[name] = _scalar_rows(values, column)
        elif isinstance(column, RaggedColumn):
            result.columns[name] = _ragged_rows(kind, name, values, column, raw=result.task.raw)
        else:
            result.columns[name] = [str(v) for v in values]
        stored = result.columns[name]
        for tally, start in zip(result.blocks, cuts, strict=True):
            # per block, so an incremental build can carry a block with its statistics;
            # the sums are exact, so the task's total is the same as over the task at once
            part = stored[start : start + step] if isinstance(stored, np.ndarray | list) else None
            found = _task_stats(kind, name, column, kept[start : start + step], part)
            if found is not None:
                tally.stats[name] = found
        parts = [t.stats[name] for t in result.blocks if name in t.stats]
        if parts:
            result.stats[name] = merge_all(parts)
    for tally, start in zip(result.blocks, cuts, strict=True):
        tally.conversions = _conversions(kept[start : start + step])
    result.conversions = _conversions(kept)


def _conversions(kept: Sequence[_Decoded]) -> dict[str, dict[str, int]]:
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


def _copy_into(kind: Kind, name: str, value: Any, row: np.ndarray) -> np.ndarray:
    """A fixed column other than a kind's main one takes its value as is, or shorter along
    its first axis (a recording padded to a fixed duration): copied to the start of the
    row, whose rest keeps the column's fill. Returns the window it fills (its statistics)."""
    array = np.asarray(value)
    if array.shape[1:] != row.shape[1:] or not 0 <= len(array) <= len(row):
        raise TypeError(
            f"{kind.kind} field {kind.name}: column {name} takes {row.shape} values (or "
            f"fewer rows), got {array.shape}"
        )
    window = row[: len(array)]
    window[...] = array
    return window


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


def _task_stats(kind: Kind, name: str, column: Column, kept: Sequence[_Decoded], rows: Any) -> Any:
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
    for name in fileformat.SAMPLE_RECORD:
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


def _encoded(rows: np.ndarray, column: ArrayColumn) -> EncodedRows:
    """Compress and hash the rows block by block (``chunkcodec.encode_rows``)."""
    return EncodedRows(*encode_rows(column.layout, rows))


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
