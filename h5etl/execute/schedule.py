"""schedule: run decode tasks (and header probes) on the worker pool, results in order.

At most ``window`` tasks are submitted and not yet consumed, so memory stays bounded whatever
the dataset size; results come back in submission order, so output does not depend on
``--jobs``. A ``Barrier`` in the task stream waits until every task of its split has been
consumed (the task cutter needs their deferred samples to cut the next round). A worker that
dies costs only the samples that kill it: they become ``worker_crashed`` rejects.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool  # loky's is a subclass
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from h5etl import timeline
from h5etl.dataflow import Barrier, BatchResult, DecodeTask, Reject, Sample, sample_rejects
from h5etl.decode import gather, worker_memory
from h5etl.decode import rows as decode_rows
from h5etl.decode import task as decode
from h5etl.decode.recipe import DecodeRecipe
from h5etl.execute import arena, shared_memory
from h5etl.execute import pool as workers
from h5etl.execute.inflight import InFlightLimit
from h5etl.format import codec

In = TypeVar("In")
Out = TypeVar("Out")
Got = TypeVar("Got")

Worker = Callable[[DecodeTask, DecodeRecipe], BatchResult]
Decoder = Callable[[Iterable[DecodeTask | Barrier], DecodeRecipe], Iterator[BatchResult]]
"""Runs a task stream, results in task order: the local pool (``local``) or a Dask cluster
(``h5etl.execute.dask_cluster.Cluster.run_tasks``)."""


def run_tasks(
    tasks: Iterable[DecodeTask | Barrier],
    recipe: DecodeRecipe,
    *,
    jobs: int,
    window: int | InFlightLimit | None = None,
    worker: Worker = decode.decode_batch,
) -> Iterator[BatchResult]:
    """Decode tasks on ``jobs`` processes; yield results in task order, at most ``window``
    in flight (an ``InFlightLimit``: as many as its results' sizes allow).

    ``jobs=1`` decodes in this process, where a barrier is met by construction.
    """
    if jobs <= 1:
        try:
            for task in tasks:
                if not isinstance(task, Barrier):
                    yield worker(task, recipe)
        finally:
            decode_rows.drop_buffers()  # inline, the buffers would outlive the build here
        return
    owner = os.getpid()
    # slots for the tasks in flight and the results held beside them; past that, files
    slots = shared_memory.Slots(owner, most=4 * jobs + 4)
    pool = _Pool(jobs, worker, recipe, slots)
    with (
        worker_memory.collecting_less(),
        _removed(worker_memory.send_lock_path(owner)),
        shared_memory.swept(owner),
        contextlib.closing(slots),
    ):
        if isinstance(window, InFlightLimit):
            sized = window

            def result(task: DecodeTask, future: Future[BatchResult]) -> BatchResult:
                return sized.noted(pool.result(task, future))

            yield from in_order(tasks, pool.submit, result, window.limit)
            return
        yield from in_order(tasks, pool.submit, pool.result, window or 2 * jobs + 1)


def local(jobs: int) -> Decoder:
    """The local decoder: ``run_tasks`` on ``jobs`` loky processes."""

    def run(tasks: Iterable[DecodeTask | Barrier], recipe: DecodeRecipe) -> Iterator[BatchResult]:
        # a task cutter estimates a task's decoded bytes; its results then tell their size
        task_bytes = getattr(tasks, "rows", 0) * getattr(tasks, "sample_bytes", 0)
        return run_tasks(tasks, recipe, jobs=jobs, window=InFlightLimit(jobs, task_bytes))

    return run


class Cancellable(Protocol):
    """What the window needs of a future: a way to give up on it (concurrent.futures' or
    dask.distributed's)."""

    def cancel(self) -> Any: ...


Fut = TypeVar("Fut", bound=Cancellable)


def in_order(
    items: Iterable[In | Barrier],
    submit: Callable[[In], Fut],
    result: Callable[[In, Fut], Out],
    limit: int | Callable[[], int],
) -> Iterator[Out]:
    """Submit ``items`` with at most ``limit`` not yet consumed; yield their results in order.

    ``result(item, future)`` collects one (and recovers from a dead worker); what is still
    pending when the consumer stops is cancelled. A ``Barrier`` yields pending results until
    none of its split is left; tasks of other splits stay in flight meanwhile. A callable
    ``limit`` is asked again after every submission (it may learn from the results).
    """
    pending: deque[tuple[In, Fut]] = deque()
    # Collected and not yet yielded, so still in flight: a result that widens the limit
    # lets the next items go to the workers before the consumer takes it (the first CT case
    # widened a window of 2, and both workers idled while the writer stored it).
    ready: deque[Out] = deque()
    try:
        for item in items:
            if isinstance(item, Barrier):
                yield from _drained(ready)
                while any(item.holds(waiting) for waiting, _ in pending):
                    yield result(*pending.popleft())
                continue
            pending.append((item, submit(item)))
            while (pending or ready) and len(pending) + len(ready) >= (
                limit() if callable(limit) else limit
            ):
                if ready:
                    yield ready.popleft()
                else:
                    ready.append(result(*pending.popleft()))
        yield from _drained(ready)
        while pending:
            yield result(*pending.popleft())
    finally:
        for _, future in pending:
            future.cancel()


def _drained(ready: deque[Out]) -> Iterator[Out]:
    while ready:
        yield ready.popleft()


def submit_to_pool(jobs: int, fn: Callable[..., Got], *args: object) -> Future[Got]:
    """Submit to the pool; a pool a worker broke on the way fails the future, not the build.

    loky raises at submit time when a worker died since the pool was last checked; the
    future then carries that error to ``result``, which reruns or isolates the work (on a
    fresh pool) as for any crash.
    """
    try:
        return workers.pool(jobs).submit(fn, *args)
    except BrokenProcessPool as exc:
        workers.discard()  # the rerun this failure leads to gets a fresh pool
        failed: Future[Got] = Future()
        failed.set_exception(exc)
        return failed


def rerun_after_crash(
    future: Future[Got],
    again: Callable[[], Future[Got]],
    isolate: Callable[[], Got],
    collect: Callable[[Future[Got]], Got] = Future.result,
) -> Got:
    """The future's result (``collect``-ed); if its worker died, the same work once more (it
    may only have shared a pool with the crash), and if that dies too, ``isolate()``: the
    work split so that a crash costs only what causes it."""
    try:
        return collect(future)
    except BrokenProcessPool:
        pass
    try:
        return collect(again())
    except BrokenProcessPool:
        return isolate()


def crash_rejects(sample: Sample, stage: str, exc: BaseException) -> list[Reject]:
    """The rejects of a sample whose worker died on it, whatever was tried."""
    return sample_rejects(
        sample,
        stage,
        "worker_crashed",
        f"the worker process died on this sample ({exc}{workers.death_note()})",
    )


# What a worker sends back in place of its task: the parent holds the task already, and
# unpickling its samples (paths and keys) cost the single parent time for every result.
_TASK_KEPT = DecodeTask("", 0, (), 1, 1)


def run_remote(worker: Worker, task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    result = worker(task, recipe)
    result.task = _TASK_KEPT
    return result


def run_pooled(
    worker: Worker,
    task: DecodeTask,
    recipe: DecodeRecipe,
    owner: int,
    slot: str | None = None,
    direct: dict[codec.ChunkLayout, bool] | None = None,
) -> BatchResult:
    """``run_remote`` in a worker of the local pool: compressed chunks and raw ragged values
    go back through shared memory (``shared_memory``: the ``slot`` the parent lent this
    task, or files of their own), not the pipe, and a big result still waits for its turn
    to be sent before the pool copies it (``worker_memory.send_one_at_a_time``). ``direct``: the
    parent's ``codec.has_direct`` answers for the recipe's layouts (``direct_verdicts``)."""
    timeline.mark("worker: first task started", once=True)
    if direct:
        codec.trust_direct(direct)
    # its heap is trimmed once it idles, not between two cases; its chunks are compressed
    # into the lent slot itself (``arena``)
    with worker_memory.busy(), arena.writing_into(slot) as placed:
        result = shared_memory.share(run_remote(worker, task, recipe), owner, slot, placed)
    worker_memory.send_one_at_a_time(result)
    timeline.mark("worker: task sent")
    return result


def direct_verdicts(recipe: DecodeRecipe) -> dict[codec.ChunkLayout, bool]:
    """``codec.has_direct`` of each storage column's layout, answered here: a worker of the
    local pool takes them (``codec.trust_direct``) rather than load HDF5 to check them again."""
    layouts = (getattr(column, "layout", None) for _, _, column in recipe.columns)
    return {
        layout: codec.has_direct(layout)
        for layout in layouts
        if isinstance(layout, codec.ChunkLayout)
    }


@contextlib.contextmanager
def _removed(path: str) -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


class _Pool:
    """joblib's reusable loky executor, re-created after a worker dies; each task is lent a
    slot of shared memory for its result (``shared_memory.Slots``)."""

    def __init__(
        self,
        jobs: int,
        worker: Worker,
        recipe: DecodeRecipe,
        slots: shared_memory.Slots | None = None,
    ):
        self.jobs = jobs
        self.worker = worker
        self.recipe = recipe
        self.slots = slots
        self._lent: dict[Future[BatchResult], str] = {}
        self._direct: dict[codec.ChunkLayout, bool] | None = None

    def submit(self, task: DecodeTask) -> Future[BatchResult]:
        slot = self.slots.take() if self.slots is not None else None
        if self._direct is None:
            self._direct = direct_verdicts(self.recipe)
        timeline.mark("first task submitted", once=True)
        future = submit_to_pool(
            self.jobs, run_pooled, self.worker, task, self.recipe, os.getpid(), slot, self._direct
        )
        if slot is not None:
            self._lent[future] = slot
        return future

    def collect(self, future: Future[BatchResult]) -> BatchResult:
        """The future's result with its shared values attached; the slot of a task that
        failed is retired (a worker may still be writing there)."""
        slot = self._lent.pop(future, None)
        try:
            got = future.result()
        except BaseException:
            if slot is not None and self.slots is not None:
                self.slots.retire(slot)
            raise
        return shared_memory.attach(got, self.slots, slot)

    def result(self, task: DecodeTask, future: Future[BatchResult]) -> BatchResult:
        alone = lambda part: self.collect(self.submit(part))  # noqa: E731
        got = rerun_after_crash(
            future,
            lambda: self.submit(task),
            lambda: isolate(task, self.recipe, alone),
            self.collect,
        )
        got.task = task
        return got


def isolate(
    task: DecodeTask,
    recipe: DecodeRecipe,
    run_alone: Callable[[DecodeTask], BatchResult],
    crashed: type[BaseException] | tuple[type[BaseException], ...] = BrokenProcessPool,
) -> BatchResult:
    """Decode each sample of ``task`` alone (``run_alone``, in a fresh worker) and join the
    results here.

    A sample whose worker dies (``run_alone`` raises ``crashed``) is rejected with
    ``worker_crashed``; every other sample keeps the result of its own run, under the task's
    rule (``decode.keep_whole_blocks``). Nothing is decoded twice in this pass, and no rerun of
    the survivors can crash again. The rows come back raw, so the writer compresses them: a
    crash is rare. The local pool and the Dask cluster both isolate with it.
    """
    result = BatchResult(task, 0)
    parts: list[tuple[int, BatchResult]] = []
    for position, sample in enumerate(task.samples):
        if decode.done_decoding(task, len(parts), position):
            result.deferred.extend(range(position, len(task.samples)))
            break
        alone = replace(
            task,
            start=task.start + position,
            samples=(sample,),
            rows=1,
            final=True,
            raw=True,
            members=task.members[position : position + 1],
            stamps=task.stamps[position : position + 1],
        )
        try:
            part = run_alone(alone)
        except crashed as exc:
            result.rejects.extend(crash_rejects(sample, decode.STAGE, exc))
            continue
        result.rejects.extend(part.rejects)
        result.seconds += part.seconds
        if part.accepted:
            parts.append((position, part))
    keep = decode.keep_whole_blocks(task, len(parts))
    result.deferred = sorted([*result.deferred, *(p for p, _ in parts[keep:])])
    gather.join_results(result, recipe, [part for _, part in parts[:keep]])
    return result
