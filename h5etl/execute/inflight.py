"""inflight: how many decode tasks may be in flight at once (``schedule.in_order``'s limit).

Bounded by count (every worker busy and a result waiting for each) and by the decoded bytes
the tasks hold, as the task cutter estimates them and as their results turn out.
"""

from __future__ import annotations

from h5etl.dataflow import BatchResult
from h5etl.decode import worker_memory

# Decoded bytes that the tasks in flight may hold together: the bound that matters when a
# sample is a CT case of a few hundred MB (docs/benchmarks/volumes.md: peak RSS below 3x the largest
# case at any --jobs: two cases of 512 x 512 x 512 in flight); for images (tasks of at most
# 64 MiB) it allows 8 tasks in flight, 2 * jobs + 1 up to --jobs 3.
WINDOW_BYTES = 512 * 2**20


def window_for(jobs: int, task_bytes: int) -> int:
    """Tasks in flight: ``2 * jobs + 1`` (every worker busy and a result waiting for each),
    fewer when so many would hold more than ``WINDOW_BYTES`` of decoded samples, never
    fewer than 2 (one decoding while the writer stores the other)."""
    full = 2 * jobs + 1
    if task_bytes <= 0:
        return full
    return max(min(2, full), min(full, WINDOW_BYTES // task_bytes))


class InFlightLimit:
    """The tasks in flight: ``window_for`` a task's bytes as the task cutter estimates its
    decoded samples, or, once results have arrived, as twice the largest result seen if
    that allows more (a result is held twice on its way: in its worker beside the pickled
    copy it sends, in this process as the bytes received and the objects made of them).

    A task's result is its real size: a CT case streamed by its kind is never whole decoded,
    and is only as large as it compresses (a 200-slice case came to 45 MiB against an
    estimate of 256 MiB, which held two workers to a window of 2 and made them wait for the
    writer). Results only widen the window: image tasks (at most 64 MiB decoded) keep the
    window they had, whatever they compress to."""

    def __init__(self, jobs: int, task_bytes: int):
        self.jobs = jobs
        self.estimate = task_bytes
        self.largest = 0  # of the results seen, ``worker_memory.result_nbytes``

    def limit(self) -> int:
        planned = window_for(self.jobs, self.estimate)
        if not self.largest:
            return planned
        return max(planned, window_for(self.jobs, 2 * self.largest))

    def noted(self, result: BatchResult) -> BatchResult:
        self.largest = max(self.largest, worker_memory.result_nbytes(result))
        return result
