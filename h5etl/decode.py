"""decode: in a worker, turn one task's files into validated, stacked, compressed columns.

Per sample: read the bytes once (hashing them for lineage), then each field's kind decodes,
fits and validates its value (``h5etl.kinds``); a sample is kept only when every field
accepts it. Per task: keep whole chunks of accepted samples (reserves replace rejects; what
cannot fill a chunk is deferred), compress the array columns and hash each block, gather the
statistics, so the single writer only writes. Scheduling the tasks is ``h5etl.schedule``'s job.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from h5etl import fileformat, inputs, stats
from h5etl.chunkcodec import encode_rows
from h5etl.errors import RejectError
from h5etl.kinds.base import ArrayColumn, Kind, SampleContext, ScalarColumn
from h5etl.records import BatchResult, DecodeTask, EncodedRows, Sample, sample_rejects

STAGE = "decode"


@dataclass(frozen=True, slots=True)
class DecodeRecipe:
    """Everything a worker needs, frozen and picklable: the fields' kinds, in decode order."""

    kinds: tuple[Kind, ...]
    order: tuple[int, ...]  # positions in ``kinds``: each field after those it depends on
    plan_fields: tuple[str, ...] = ()  # fields whose values travel in ``Sample.extras``
    arrays: tuple[tuple[Kind, ArrayColumn], ...] = ()  # the array fields and their columns

    @classmethod
    def of(cls, kinds: Sequence[Kind], order: Sequence[int]) -> DecodeRecipe:
        planned = tuple(kind.name for kind in kinds if kind.plan_side)
        arrays = tuple(
            (kind, column) for kind in kinds if isinstance(column := kind.column, ArrayColumn)
        )
        return cls(tuple(kinds), tuple(order), planned, arrays)


@dataclass(slots=True)
class _Decoded:
    """One accepted sample: each field's value, its files' digests, its own statistics."""

    position: int
    sample: Sample
    values: dict[str, Any]
    hashes: tuple[str, ...]
    conversions: list[tuple[str, str]] = field(default_factory=list)
    windows: dict[str, np.ndarray] = field(default_factory=dict)  # unpadded, as stored


def _decode_sample(sample: Sample, recipe: DecodeRecipe, position: int) -> _Decoded:
    """Decode one sample through every field's kind; rejects raise ``RejectError``."""
    files = sample.paths
    # never a plain open(): a file swapped for a FIFO since it was listed would block it
    contents = [inputs.read_file(path) for path in files]
    extras = dict(zip(recipe.plan_fields, sample.extras, strict=True))
    context = SampleContext(sample, contents, extras, files)
    values = {}
    for index in recipe.order:
        kind = recipe.kinds[index]
        values[kind.name] = kind.decode(context)
    decoded = _Decoded(
        position,
        sample,
        values,
        tuple(hashlib.sha256(data).hexdigest() for data in contents),
        context.conversions,
    )
    return decoded


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
    out = {kind.name: _batch_buffer(kind.name, column, capacity) for kind, column in recipe.arrays}
    result = BatchResult(task, 0)
    kept: list[_Decoded] = []
    for position, sample in enumerate(task.samples):
        if done_decoding(task, len(kept), position):
            result.deferred.extend(range(position, len(task.samples)))
            break
        try:
            decoded = _decode_sample(sample, recipe, position)
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
        for kind, _ in recipe.arrays:
            window = kind.place(decoded.values[kind.name], out[kind.name][len(kept)])
            decoded.windows[kind.name] = window  # statistics once per task, over these
        kept.append(decoded)
    keep = keep_whole_blocks(task, len(kept))
    result.deferred = sorted([*result.deferred, *(d.position for d in kept[keep:])])
    del kept[keep:]
    gather(result, recipe, kept, {name: rows[:keep] for name, rows in out.items()})
    if task.raw:  # the rows leave with the result: the next task needs new buffers
        drop_buffers()
    result.seconds = time.perf_counter() - started
    return result


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
    for kind in recipe.kinds:
        column = kind.column
        values = [d.values[kind.name] for d in kept]
        if isinstance(column, ArrayColumn):
            rows = arrays[kind.name]
            result.columns[kind.name] = rows if result.task.raw else _encoded(rows, column)
        elif isinstance(column, ScalarColumn):
            result.columns[kind.name] = np.array(values, dtype=column.dtype)
        else:
            result.columns[kind.name] = [str(v) for v in values]
        result.stats.update(_task_stats(kind, kept, result.columns[kind.name]))
    counts: dict[str, Counter[str]] = {}
    for d in kept:
        for name, code in d.conversions:
            counts.setdefault(name, Counter())[code] += 1
    result.conversions = {name: dict(count) for name, count in counts.items()}


def _task_stats(kind: Kind, kept: Sequence[_Decoded], rows: Any) -> dict[str, Any]:
    if kind.stats is None:
        return {}
    if not kept:
        return {}
    if isinstance(kind.column, ArrayColumn):
        found = kind.task_stats([d.windows[kind.name] for d in kept])
        return {} if found is None else {kind.name: found}
    column = np.asarray(rows)
    if kind.stats == "histogram":
        return {kind.name: stats.Histogram.of(column)}
    return {kind.name: stats.ChannelStats.of(column, channel_axis=None)}


def merge_all(parts: Sequence[Any]) -> Any:
    """One statistic from several (exact sums: the grouping never changes the result)."""
    total = parts[0]
    for part in parts[1:]:
        total = total.merge(part)
    return total


def join_results(into: BatchResult, recipe: DecodeRecipe, parts: Sequence[BatchResult]) -> None:
    """Append the raw results of samples decoded one by one (crash isolation) to ``into``."""
    into.accepted = sum(part.accepted for part in parts)
    for part in parts:
        into.keys.extend(part.keys)
        into.lineage.extend(part.lineage)
        for name, codes in part.conversions.items():
            known = into.conversions.setdefault(name, {})
            for code, count in codes.items():
                known[code] = known.get(code, 0) + count
    for name in fileformat.SAMPLE_RECORD:
        into.columns[name] = [text for part in parts for text in part.columns[name]]  # type: ignore[union-attr]
    for kind in recipe.kinds:
        column = kind.column
        pieces = [part.columns[kind.name] for part in parts]
        if isinstance(column, ArrayColumn):
            empty = np.empty((0, *column.layout.shape), column.layout.dtype)
            into.columns[kind.name] = np.concatenate([empty, *pieces])
        elif isinstance(column, ScalarColumn):
            empty = np.empty((0,), column.dtype)
            into.columns[kind.name] = np.concatenate([empty, *pieces])
        else:
            into.columns[kind.name] = [text for piece in pieces for text in piece]  # type: ignore[union-attr]
        found = [part.stats[kind.name] for part in parts if kind.name in part.stats]
        if found:
            into.stats[kind.name] = merge_all(found)


def _encoded(rows: np.ndarray, column: ArrayColumn) -> EncodedRows:
    """Compress and hash the rows block by block (``chunkcodec.encode_rows``)."""
    return EncodedRows(*encode_rows(column.layout, rows))


# Per-process batch buffers, reused while tasks end as encoded bytes: a fresh multi-megabyte
# array per task costs page faults on every first touch, a reused one only the fill.
_BUFFERS: dict[str, np.ndarray] = {}


def drop_buffers() -> None:
    """Forget this process's batch buffers (their rows left with a result, or the build ended)."""
    _BUFFERS.clear()


def _batch_buffer(name: str, column: ArrayColumn, count: int) -> np.ndarray:
    layout = column.layout
    shape = (count, *layout.shape)
    buffer = _BUFFERS.get(name)
    if (
        buffer is None
        or buffer.dtype != np.dtype(layout.dtype)
        or buffer.shape[1:] != shape[1:]
        or buffer.shape[0] < count
    ):
        buffer = np.empty(shape, dtype=layout.dtype)
        _BUFFERS[name] = buffer
    rows = buffer[:count]
    rows.fill(column.fill)
    return rows
