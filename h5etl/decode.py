"""decode: in parallel workers, turn each task's files into stacked, validated, encoded rows.

Per sample: read the bytes once (hashing them for lineage), decode, convert the mode, fit
(crop/resize/pad), validate masks. Per task: stack into one array per field and, when no sample
was rejected, compress whole chunks and hash each block, so the single writer only writes.
Tasks run on joblib's loky workers through an ordered, bounded window; ``jobs=1`` runs inline.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from joblib.externals.loky.process_executor import BrokenProcessPool

from h5etl import digest, geometry, images, validate, workers
from h5etl.chunkcodec import ChunkLayout, encode_block
from h5etl.errors import RejectError
from h5etl.records import BatchResult, DecodeTask, Reject, Sample

if TYPE_CHECKING:  # workers import this module; pydantic stays out of them
    from h5etl.spec import Spec

STAGE = "decode"
PROBE_STAGE = "clean"  # header probes belong to cleaning (clean.STAGE); stages do not import stages
In = TypeVar("In")
Out = TypeVar("Out")
Got = TypeVar("Got")


@dataclass(frozen=True, slots=True)
class FieldRecipe:
    name: str
    source_index: int
    mode: images.Mode
    values: tuple[int, ...] | None
    layout: ChunkLayout
    fill: int  # pad.fill for images; pad.mask_fill for masks, so padding is a valid label


@dataclass(frozen=True, slots=True)
class DecodeRecipe:
    """Everything a worker needs, frozen and picklable: no handles, no paths to configs."""

    image_fields: tuple[FieldRecipe, ...]
    text_fields: tuple[tuple[str, int], ...]  # (field name, source index)
    oversize: str

    @classmethod
    def from_spec(cls, spec: Spec, layouts: dict[str, ChunkLayout]) -> DecodeRecipe:
        sources = list(spec.sources)
        fields = []
        for name in spec.image_fields:
            field = spec.fields[name]
            assert field.mode is not None
            fields.append(
                FieldRecipe(
                    name,
                    sources.index(spec.source_of(name)),
                    field.mode,
                    field.values,
                    layouts[name],
                    spec.pad.fill if field.values is None else spec.pad.mask_fill,
                )
            )
        texts = tuple((name, sources.index(spec.source_of(name))) for name in spec.text_fields)
        return cls(tuple(fields), texts, spec.pad.oversize)


def _fit(array: np.ndarray, field: FieldRecipe, oversize: str) -> np.ndarray:
    target = (field.layout.shape[1], field.layout.shape[2])
    size = (array.shape[0], array.shape[1])
    if not geometry.is_oversize(size, target):
        return array
    if oversize == "resize":
        return images.resize(
            array, geometry.fit_within(size, target), is_mask=field.values is not None
        )
    if oversize == "crop":
        return geometry.center_crop(array, target)
    raise RejectError("oversize", f"{size[0]}x{size[1]} is larger than {target[0]}x{target[1]}")


def _decode_sample(
    sample: Sample, recipe: DecodeRecipe, out: dict[str, np.ndarray], row: int
) -> tuple[str, ...]:
    """Decode one sample into row ``row`` of ``out``; return each file's hex SHA-256."""
    files = sample.files
    contents = []
    for source_file in files:
        try:
            with open(source_file.path, "rb") as handle:
                contents.append(handle.read())
        except OSError as exc:
            raise RejectError(
                "unreadable", f"cannot read: {exc.strerror or exc}", path=source_file.path
            ) from exc
    decoded = []
    for field in recipe.image_fields:
        path = files[field.source_index].path
        labels = frozenset(field.values) if field.values is not None else None
        array = images.decode(
            contents[field.source_index], field.mode, path=path, mask_labels=labels
        )
        if field.values is not None:
            array = validate.check_mask(array, field.values, path=path)
        decoded.append((field, path, array))
    sizes = {array.shape[:2] for _, _, array in decoded}
    if len(sizes) > 1:  # the header probe cannot see an orientation stored after the pixels
        shown = ", ".join(f"{f.name} {a.shape[0]}x{a.shape[1]}" for f, _, a in decoded)
        raise RejectError(
            "size_mismatch", f"sizes differ after decoding (HxW): {shown}", path=decoded[0][1]
        )
    fitted = []
    for field, path, array in decoded:
        try:
            fitted.append((field, _fit(array, field, recipe.oversize)))
        except RejectError as exc:
            exc.path = path
            raise
    # Only a sample that passed every check touches its row: a rejected one must not leave
    # pixels in the padding of the sample that takes the row next.
    for field, array in fitted:
        geometry.place(array, out[field.name][row])
    return tuple(hashlib.sha256(data).hexdigest() for data in contents)


def decode_batch(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """Decode one task. Runs in a worker process; only plain data goes in and out."""
    started = time.perf_counter()
    count = len(task.samples)
    out = {f.name: _batch_buffer(f, count) for f in recipe.image_fields}
    result = BatchResult(task, 0)
    kept = []
    for sample in task.samples:
        try:
            hashes = _decode_sample(sample, recipe, out, result.accepted)
        except RejectError as exc:
            culprit = str(exc.path or "")
            result.rejects.extend(
                Reject(
                    f.path,
                    STAGE,
                    exc.reason,
                    exc.message if f.path == culprit else f"{exc.message} (in {culprit})",
                    sample.key,
                )
                for f in sample.files
            )
            continue
        except MemoryError:
            result.rejects.extend(
                Reject(f.path, STAGE, "memory_error", "ran out of memory decoding", sample.key)
                for f in sample.files
            )
            continue
        result.accepted += 1
        result.lineage.append(hashes)
        result.keys.append(sample.key)
        kept.append(sample)
    for name, index in recipe.text_fields:
        result.texts[name] = [s.relpaths[index] for s in kept]
    _finish_arrays(result, recipe, {name: rows[: result.accepted] for name, rows in out.items()})
    if result.raw:  # the rows leave with the result: the next task needs new buffers
        _BUFFERS.clear()
    result.seconds = time.perf_counter() - started
    return result


# Per-process batch buffers, reused while tasks end as encoded bytes: a fresh multi-megabyte
# array per task costs page faults on every first touch, a reused one only the fill.
_BUFFERS: dict[str, np.ndarray] = {}


def _batch_buffer(field: FieldRecipe, count: int) -> np.ndarray:
    shape = (count, *field.layout.shape)
    buffer = _BUFFERS.get(field.name)
    if (
        buffer is None
        or buffer.dtype != np.dtype(field.layout.dtype)
        or buffer.shape[1:] != shape[1:]
        or buffer.shape[0] < count
    ):
        buffer = np.empty(shape, dtype=field.layout.dtype)
        _BUFFERS[field.name] = buffer
    rows = buffer[:count]
    rows.fill(field.fill)
    return rows


def _finish_arrays(
    result: BatchResult, recipe: DecodeRecipe, arrays: dict[str, np.ndarray]
) -> None:
    full = result.accepted == result.task.full_batch == len(result.task.samples)
    for field in recipe.image_fields:
        rows = arrays[field.name]
        if not full:
            result.raw[field.name] = rows
            continue
        step = field.layout.rows
        blocks = [rows[i : i + step] for i in range(0, len(rows), step)]
        result.encoded[field.name] = [encode_block(field.layout, block) for block in blocks]
        result.block_sha256[field.name] = [digest.block_digest(block) for block in blocks]


Worker = Callable[[DecodeTask, DecodeRecipe], BatchResult]


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``).

    Every batch brings megabytes of arrays or encoded chunks. glibc serves such blocks from the
    heap once its dynamic mmap threshold has grown, and the freed holes kept the parent's RSS
    growing with the dataset (10x corpus: 1.24x the 1x peak). Trimming now and then releases
    them; fixing the threshold instead made every large block a fresh mapping (10% slower).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def run_tasks(
    tasks: Iterable[DecodeTask],
    recipe: DecodeRecipe,
    *,
    jobs: int,
    window: int | None = None,
    worker: Worker = decode_batch,
) -> Iterator[BatchResult]:
    """Decode tasks on ``jobs`` processes; yield results in task order.

    At most ``window`` tasks (default ``2 * jobs + 1``) are submitted and not yet consumed, so
    memory stays bounded whatever the dataset size or the speed of the consumer. A worker that
    dies (segfault, killed) costs only the samples that kill it: they are rejected with reason
    ``worker_crashed`` and the rest is decoded one by one in fresh workers.
    """
    if jobs <= 1:
        try:
            for task in tasks:
                yield worker(task, recipe)
        finally:
            _BUFFERS.clear()  # inline, the buffers would outlive the build in this process
        return
    pool = _Pool(jobs, worker, recipe)
    yield from _in_order(tasks, pool.submit, pool.result, window or 2 * jobs + 1)


def _in_order(
    items: Iterable[In],
    submit: Callable[[In], Future[Got]],
    result: Callable[[In, Future[Got]], Out],
    limit: int,
) -> Iterator[Out]:
    """Submit ``items`` with at most ``limit`` not yet consumed; yield their results in order.

    ``result(item, future)`` collects one (and recovers from a dead worker); what is still
    pending when the consumer stops is cancelled.
    """
    pending: deque[tuple[In, Future[Got]]] = deque()
    try:
        for item in items:
            pending.append((item, submit(item)))
            if len(pending) >= limit:
                yield result(*pending.popleft())
        while pending:
            yield result(*pending.popleft())
    finally:
        for _, future in pending:
            future.cancel()


def _crash_rejects(sample: Sample, stage: str, exc: BaseException) -> list[Reject]:
    detail = f"the worker process died on this sample ({exc})"
    return [Reject(f.path, stage, "worker_crashed", detail, sample.key) for f in sample.files]


def map_in_workers(
    fn: Callable[[Sequence[Sample]], list[Out]],
    batches: Iterable[Sequence[Sample]],
    *,
    jobs: int,
    window: int | None = None,
    stage: str = PROBE_STAGE,
) -> Iterator[list[Out | list[Reject]]]:
    """``fn`` over batches of samples on the decode workers, one outcome per sample, in order.

    For light, pure work such as header probes: at most ``window`` batches in flight. A batch
    whose worker died runs once more, then each of its samples alone in a fresh worker; a
    sample that still kills its worker gets ``worker_crashed`` rejects (of ``stage``) as its
    outcome. Nothing runs in this process, so a crash costs only the samples that cause it.
    """
    if jobs <= 1:
        for batch in batches:
            yield list(fn(batch))
        return

    def submit(batch: Sequence[Sample]) -> Future[list[Out]]:
        return workers.pool(jobs).submit(fn, batch)

    def alone(sample: Sample) -> Out | list[Reject]:
        try:
            return submit((sample,)).result()[0]
        except BrokenProcessPool as exc:
            return _crash_rejects(sample, stage, exc)

    def result(batch: Sequence[Sample], future: Future[list[Out]]) -> list[Out | list[Reject]]:
        try:
            return list(future.result())
        except BrokenProcessPool:
            pass
        try:  # the batch may only have shared a pool with the crash: run it again alone
            return list(submit(batch).result())
        except BrokenProcessPool:
            return [alone(sample) for sample in batch]

    yield from _in_order(batches, submit, result, window or 2 * jobs + 1)


class _Pool:
    """joblib's reusable loky executor, re-created after a worker dies."""

    def __init__(self, jobs: int, worker: Worker, recipe: DecodeRecipe):
        self.jobs = jobs
        self.worker = worker
        self.recipe = recipe

    def submit(self, task: DecodeTask) -> Future[BatchResult]:
        return workers.pool(self.jobs).submit(self.worker, task, self.recipe)

    def result(self, task: DecodeTask, future: Future[BatchResult]) -> BatchResult:
        try:
            return future.result()
        except BrokenProcessPool:
            pass
        try:  # the task may only have shared a pool with the crash: run it again alone
            return self.submit(task).result()
        except BrokenProcessPool:
            return self._isolate(task)

    def _isolate(self, task: DecodeTask) -> BatchResult:
        """Decode each sample of ``task`` alone in a fresh worker and join the results here.

        A sample whose worker dies is rejected with ``worker_crashed``; every other sample
        keeps the result of its own run. Nothing is decoded twice, and no rerun of the
        survivors can crash again (a flaky native crash, an OOM kill that needed the whole
        batch). ``full_batch=0`` has the rows come back raw, ready to be joined.
        """
        result = BatchResult(task, 0)
        rows: dict[str, list[np.ndarray]] = {
            f.name: [np.empty((0, *f.layout.shape), f.layout.dtype)]
            for f in self.recipe.image_fields
        }
        texts: dict[str, list[str]] = {name: [] for name, _ in self.recipe.text_fields}
        for sample in task.samples:
            try:
                part = self.submit(replace(task, samples=(sample,), full_batch=0)).result()
            except BrokenProcessPool as exc:
                result.rejects.extend(_crash_rejects(sample, STAGE, exc))
                continue
            result.accepted += part.accepted
            result.keys.extend(part.keys)
            result.lineage.extend(part.lineage)
            result.rejects.extend(part.rejects)
            result.seconds += part.seconds
            for name, column in texts.items():
                column.extend(part.texts[name])
            for name, blocks in rows.items():
                blocks.append(part.raw[name])
        result.texts = texts
        result.raw = {name: np.concatenate(blocks) for name, blocks in rows.items()}
        return result
