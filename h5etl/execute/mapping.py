"""mapping: light, pure work over samples, results in order, where it costs least.

``map_in_workers`` runs header probes on the decode workers (a crash costs only the samples
that cause it); ``map_in_threads`` runs stat calls here, or in a few threads once the file
system makes each call wait. Both go through ``schedule.in_order``'s bounded window.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool  # loky's is a subclass
from typing import TypeVar

from h5etl.dataflow import Reject, Sample
from h5etl.execute.schedule import crash_rejects, in_order, rerun_after_crash, submit_to_pool

__all__ = ["PROBE_STAGE", "SLOW_STAT_SECONDS", "STAT_THREADS", "map_in_threads", "map_in_workers"]

PROBE_STAGE = "clean"  # header probes belong to cleaning (clean.STAGE)
Out = TypeVar("Out")
Item = TypeVar("Item")


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
        return submit_to_pool(jobs, fn, batch)

    def alone(sample: Sample) -> Out | list[Reject]:
        try:
            return submit((sample,)).result()[0]
        except BrokenProcessPool as exc:
            return crash_rejects(sample, stage, exc)

    def result(batch: Sequence[Sample], future: Future[list[Out]]) -> list[Out | list[Reject]]:
        outcomes: Future[list[Out | list[Reject]]] = future  # type: ignore[assignment]
        return rerun_after_crash(
            outcomes,
            lambda: submit(batch),  # type: ignore[arg-type,return-value]
            lambda: [alone(sample) for sample in batch],
        )

    yield from in_order(batches, submit, result, window or 2 * jobs + 1)


STAT_THREADS = 8  # stat calls wait on the file system (a network one most): threads overlap them
# A stat answered from the kernel's cache costs about 3 us; in threads the GIL handoffs cost
# more than that (60,000 cached stats: 0.17 s here, 0.3-0.4 s in 8 threads). Threads pay off
# only when the file system makes each call wait. Per sample, not per call: a pair of cached
# stats with the Python around them is ~10 us, and twice that on a loaded machine (where 20 us
# sent the 10x corpus's 30,000 pairs to threads: plan 0.55 s instead of 0.3 s); a network
# file system's stat takes 0.1-1 ms.
SLOW_STAT_SECONDS = 60e-6
JUDGED_BATCHES = 3  # batches timed before their median decides


def _waits(per_sample: Sequence[float], slow: float) -> bool:
    """Whether the file system makes each call wait, from the batches timed so far: their
    median over ``slow``, or the last two over ten times it. Not one batch: a garbage
    collection of the parent's heap (20 ms at 30,000 pairs) made a single batch of cached
    stats look slow, and the 60,000 stats went to threads (plan 0.49 s instead of 0.28 s)."""
    if len(per_sample) >= 2 and min(per_sample[-2:]) > 10 * slow:
        return True
    return len(per_sample) >= JUDGED_BATCHES and statistics.median(per_sample) > slow


def map_in_threads(
    fn: Callable[[Sequence[Item]], list[Out]],
    batches: Iterable[Sequence[Item]],
    *,
    threads: int = STAT_THREADS,
    slow: float = SLOW_STAT_SECONDS,
) -> Iterator[list[Out]]:
    """``fn`` over batches, results in order: here while each sample costs less than
    ``slow`` seconds, else in a few threads of this process with at most ``2 * threads``
    batches in flight. For work that waits on the file system, not the CPU (stat calls
    release the GIL): it needs no worker process to have started."""
    remaining = iter(batches)
    per_sample: list[float] = []  # each batch's seconds a sample
    for batch in remaining:
        started = time.perf_counter()
        done = fn(batch)
        per_sample.append((time.perf_counter() - started) / max(len(batch), 1))
        yield done
        if _waits(per_sample, slow):
            break  # the file system makes calls wait: overlap the rest
    else:
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="h5etl-stat") as pool:
        yield from in_order(
            remaining,
            lambda batch: pool.submit(fn, batch),
            lambda batch, future: future.result(),
            2 * threads,
        )
