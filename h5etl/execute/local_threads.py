"""local_threads: decode a small increment in this process's threads instead of starting workers.

Starting the local pool costs more than a small increment's decoding: each loky worker is a
fresh interpreter that imports the decode stack, and loky starts a resource tracker first
(two workers were ready 1.0 s after the request here, 0.75 CPU-s on the two cores the build
runs on). An incremental build that decodes 174 of 3,150 pairs (0.25 CPU-s) waited for that.

The rule (``Choice.here``): a local build of ``--jobs`` N > 1 decodes in N threads of this
process when the parent's carry record says what one sample cost to decode, and the samples
to decode would cost less than ``START_SECONDS`` at that rate; the decoders release the GIL
for their heavy parts (Pillow, zlib, hashlib, the codecs), and the tasks and the file are
those the workers would have made (the same ``decode.decode_batch``). Never when a worker's
crash isolation may matter: the build found the temp file of a killed build (a crash in this
process, or a kill -9, left it), it resumes one, or the parent release rejected a sample as
``worker_crashed``. A sample that crashes this process then kills the build (the previous
release and the link stay as they were, as for any killed build); the next build finds its
temp file and decodes in workers, where the crash costs only that sample (a reject).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from h5etl.dataflow import Barrier, BatchResult, DecodeTask
from h5etl.decode import task as decode
from h5etl.decode.recipe import DecodeRecipe
from h5etl.execute import schedule

# Decoding below this many CPU-seconds (at the parent's rate) is cheaper here than starting
# the pool (measured above: 1.0 s until two workers were ready, 0.75 CPU-s).
START_SECONDS = 1.0
CRASHED = "worker_crashed"  # the reason a dead worker's samples are rejected with


RATE_KEY = "decode_seconds_per_sample"  # in the carry record


def per_sample_seconds(record: Mapping[str, Any] | None) -> float | None:
    """Decode seconds per sample as a carry record has them (None: unknown)."""
    rate = None if record is None else record.get(RATE_KEY)
    if isinstance(rate, bool) or not isinstance(rate, float | int) or rate < 0:
        return None
    return float(rate)


def rate_of(samples: int, seconds: float, inherited: float | None) -> float | None:
    """A build's decode seconds per sample (``samples`` took ``seconds`` in the decoders),
    or its parent's (``inherited``) when it decoded none (every block carried)."""
    return round(seconds / samples, 9) if samples > 0 else inherited


def crashed_before(record: Mapping[str, Any] | None) -> bool:
    """Whether the release of this carry record rejected a sample because it killed its
    worker (its decode-time rejects are in ``rejected``: state, then the stored rows)."""
    rejected = None if record is None else record.get("rejected")
    if not isinstance(rejected, dict):
        return False
    return any(CRASHED in row for entry in rejected.values() for row in entry[3])


@dataclass(frozen=True, slots=True)
class Choice:
    """Where one build decodes: ``here`` (threads) or not, and why, for the log and facts."""

    here: bool
    why: str


def choose(samples: int, rate: float | None, refused: str | None) -> Choice:
    """Decode ``samples`` here when ``rate`` (seconds a sample) says it costs less than
    starting the workers, unless ``refused`` says why the workers' isolation is needed."""
    if refused is not None:
        return Choice(False, refused)
    if rate is None:
        return Choice(False, "the parent release does not say what a sample costs to decode")
    estimate = samples * rate
    if estimate >= START_SECONDS:
        return Choice(False, f"{samples} samples, about {estimate:.2f} s of decoding")
    return Choice(
        True,
        f"{samples} samples, about {estimate:.2f} s of decoding: less than starting the "
        f"workers ({START_SECONDS:.1f} s)",
    )


def refusal(*, killed: bool, resume: bool, record: Mapping[str, Any] | None) -> str | None:
    """Why this build must keep each sample's crash in a worker (None: it need not);
    ``record``: the parent's carry record."""
    if killed:
        return "a killed build left its temp file: workers isolate a crash"
    if resume:
        return "a resumed build decodes in workers"
    if crashed_before(record):
        return "the parent release rejected a sample that killed its worker"
    return None


def threads(count: int) -> schedule.Decoder:
    """A decoder running ``decode.decode_batch`` in ``count`` threads of this process,
    results in task order, at most ``2 * count + 1`` tasks in flight."""

    def run(tasks: Iterable[DecodeTask | Barrier], recipe: DecodeRecipe) -> Iterator[BatchResult]:
        pool = ThreadPoolExecutor(count, thread_name_prefix="h5etl-decode")

        def submit(task: DecodeTask) -> Future[BatchResult]:
            return pool.submit(decode.decode_batch, task, recipe)

        def result(_: DecodeTask, future: Future[BatchResult]) -> BatchResult:
            return future.result()  # (names its task: nothing was pickled)

        try:
            yield from schedule.in_order(tasks, submit, result, 2 * count + 1)
        finally:
            # the threads' batch buffers go with them (``decode._Buffers`` is per thread)
            pool.shutdown(wait=True, cancel_futures=True)

    return run
