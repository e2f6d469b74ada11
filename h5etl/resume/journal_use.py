"""journal_use: choosing a killed build's journal, and feeding this build's journal as it goes.

A checkpoint records what the sink stored durably (chunk places and digests, small rows), the
task cutter's queues and the fingerprint lines and rejects of the stored samples. A resumed
build copies the recorded chunks and restarts the cutter where the journal left it, so it
yields the same file as a build that was never killed.

Why a copy, not the killed file continued in place: HDF5 keeps the chunk indexes, object
headers and free-space state in its caches and writes them when it evicts them, so a killed
file's metadata is a mix of moments; a checkpoint flushes nothing (a flush at clock times moved
the layout), and even a file kept readable (SWMR) would, reopened by another process, allocate
from other free-space state than the build never killed: not the same file, byte for byte.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from h5etl.config.spec import Spec, spec_sha256
from h5etl.dataflow import BatchResult, Reject
from h5etl.format import journal
from h5etl.plan.result import Plan
from h5etl.plan.tasks import TaskCutter
from h5etl.sink.writer import Sink
from h5etl.stats.tallies import Tallies

logger = logging.getLogger(__name__)

# How far apart checkpoints come by default: a killed build loses what it stored since its
# last checkpoint whose fsync had ended. Every 2 s, a build of 16,200 pairs (12.6 s) killed at
# half time had its last checkpoint at 32 % of its samples, and its resume cost 0.89x a full
# build; a checkpoint of such a build costs a few milliseconds of the writer's time.
CHECKPOINT_SECONDS = 0.5
# A checkpoint walks each dataset's whole chunk index (HDF5 finds a chunk's place no faster),
# so it costs more as the file grows: every 2 s, a build of 20 CT cases (160,000 chunks) would
# spend more of its writer's time on checkpoints the longer it ran. The interval grows with
# the cost instead, so checkpoints take at most this share of the time...
CHECKPOINT_SHARE = 0.05
# ...but never beyond this many seconds: the work a kill loses stays bounded by the clock,
# however large the file (a walk of 160,000 chunks, about 0.3 s, then takes 6 %).
MAX_CHECKPOINT_SECONDS = 5.0


def checkpoint_interval(every: float, cost: float) -> float:
    """Seconds from one checkpoint to the next: ``every``, or more when a checkpoint costs
    ``cost`` CPU seconds, so that checkpoints take at most ``CHECKPOINT_SHARE`` of the time,
    but no more than ``MAX_CHECKPOINT_SECONDS`` (nor ``every``, when longer) (``every=0``:
    after every batch, whatever they cost)."""
    if not every:
        return 0.0
    return min(max(every, cost / CHECKPOINT_SHARE), max(every, MAX_CHECKPOINT_SECONDS))


@dataclass(frozen=True, slots=True)
class Resume:
    """A killed build to continue: its journal's state and its temp file."""

    state: journal.ResumeState
    partial: Path

    @property
    def queues(self) -> dict[str, dict[str, Any]]:
        """Where the task cutter stood: it cuts the same tasks from there."""
        return self.state.queues

    def tallies(self) -> Tallies:
        """The statistics and conversion counts of what the killed build stored."""
        return Tallies.restored(self.state.tallies)

    def restore(self, sink: Sink, checkpoints: Checkpoints) -> Restored:
        """Copy the killed build's stored chunks and rows into ``sink`` (verified against the
        journal) and record them in this build's journal at once.

        Raises:
            ResumeMismatch: a recorded chunk is missing or its bytes changed.
        """
        sink.restore(self.state, self.partial)
        checkpoints.seed(self.state, sink)
        return Restored(
            self.state.samples,
            [Reject(**r) for r in self.state.rejects],
            "".join(self.state.fingerprint),
        )


@dataclass(frozen=True, slots=True)
class Restored:
    """What a resumed build starts from: samples stored, their rejects, fingerprint lines."""

    samples: int
    rejects: list[Reject]
    fingerprint: str
    resumed: bool = True  # copied from a killed build (not carried from a sharded build's shards)
    stage: str = "resume_copy"  # its entry in the build's stage times
    worker_seconds: float = 0.0  # decoding it cost in other processes (a sharded build's)
    writer_seconds: float = 0.0  # writing it cost in other processes


class Start(Protocol):
    """Where a build starts from other than nothing: a killed build (``Resume``) or the
    committed shards of a sharded build (``h5etl.shards.committer.Shards``)."""

    @property
    def queues(self) -> dict[str, dict[str, Any]]: ...

    def tallies(self) -> Tallies: ...

    def restore(self, sink: Sink, checkpoints: Checkpoints) -> Restored: ...


def usable_resume(candidates: list[tuple[Path, Path]], spec: Spec, plan: Plan) -> Resume | None:
    """The newest killed build whose journal holds a checkpoint of this config and plan.

    A build killed again before its first checkpoint leaves a journal with nothing in it
    beside an older one that still holds its work; a build of another config may have been
    killed after one of this config.
    """
    if not candidates:
        logger.info("nothing to resume; building from the start")
        return None
    changed = False
    for partial, journal_path in candidates:
        state = journal.read(journal_path)
        if state is None:
            logger.info("the journal %s is unreadable or of another h5etl version", journal_path)
            continue
        if not state.checkpointed:
            logger.info("the journal %s holds no checkpoint", journal_path)
            continue
        if state.config_sha256 != spec_sha256(spec) or state.plan_sha256 != plan.fingerprint():
            logger.info("the journal %s is of another config or other inputs", journal_path)
            changed = True
            continue
        return Resume(state, partial)
    if changed:
        logger.warning(
            "the config or the inputs changed since the killed build; building from the start"
        )
    else:
        logger.warning("no journal of a killed build holds a checkpoint; building from the start")
    return None


class Checkpoints:
    """Feeds the resume journal: what the sink stored durably, plus the pipeline's own state.

    The fsync that makes a checkpoint durable runs in a thread beside the writer (it can take
    a while on a slow disk and must not stall the workers); the journal line is appended only
    after it. Checkpoints come ``every`` seconds, or further apart when each costs more than
    ``CHECKPOINT_SHARE`` of that. ``every=0`` checkpoints after each batch, synchronously (for
    tests).
    """

    def __init__(
        self,
        path: Path,
        spec: Spec,
        plan: Plan,
        cutter: TaskCutter,
        every: float,
        tallies: Tallies | None = None,
    ):
        self.writer = journal.JournalWriter(
            path, config_sha256=spec_sha256(spec), plan_sha256=plan.fingerprint()
        )
        self.cutter = cutter
        self.tallies = tallies if tallies is not None else Tallies()
        self.every = every
        self.interval = every  # grows with the checkpoints' cost (CHECKPOINT_SHARE)
        self._cost = 0.0  # of the latest checkpoint, CPU seconds
        self.last = time.monotonic()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="h5etl-fsync")
        self._pending: Future[None] | None = None
        self._trimmed = time.monotonic()
        self.fingerprint: list[str] = []
        self.rejects: list[Reject] = []

    def seed(self, state: journal.ResumeState, sink: Sink) -> None:
        """Carry a resumed build's state into this journal, and record it at once.

        This journal replaces the old one, so it must hold everything copied from it (the
        sink keeps the copied chunks and rows unjournaled): a build killed again and resumed
        again then finds the whole prefix here.
        """
        self.seed_with(list(state.fingerprint), [Reject(**r) for r in state.rejects], sink)

    def seed_with(self, fingerprint: list[str], rejects: list[Reject], sink: Sink) -> None:
        """Record what the sink holds before this build decoded anything (copied from a killed
        build, or carried from shards) with its fingerprint lines and rejects, at once."""
        self.fingerprint = fingerprint
        self.rejects = rejects
        self.write_now(sink)

    def note(self, result: BatchResult, lines: list[str]) -> None:
        """``result`` was stored (with ``lines``, its fingerprint lines)."""
        self.cutter.stored()
        self.fingerprint.extend(lines)
        self.rejects.extend(result.rejects)

    def maybe_write(self, sink: Sink) -> None:
        if time.monotonic() - self.last < self.interval or not sink.consistent:
            return
        if self._pending is not None:
            if not self._pending.done():
                return  # the previous fsync is still running; checkpoint later
            self._pending.result()  # re-raise a failed fsync here, in the build
        delta = self._delta(sink)
        if self.every == 0:
            self._commit(sink, delta)
        else:
            self._pending = self._thread.submit(self._commit, sink, delta)

    def sync_soon(self, sink: Sink) -> None:
        """Start an fsync of what the sink stored so far beside the writer, journaling
        nothing: the chunks an incremental build carried (most of its bytes) are durable
        before it publishes, whose own fsync then writes only the rest (``drain`` waits)."""
        if self._pending is not None:
            if not self._pending.done():
                return  # one is under way; publishing syncs the rest
            self._pending.result()
        self._pending = self._thread.submit(sink.sync)

    def write_now(self, sink: Sink) -> None:
        """A checkpoint now, in this thread (the sink must be consistent)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        self._commit(sink, self._delta(sink))

    def _delta(self, sink: Sink) -> dict[str, Any]:
        started = time.thread_time()
        delta = sink.checkpoint()
        delta.update(
            queues=self.cutter.journal_delta(),
            tallies=self.tallies.snapshot(),
            fingerprint=self.fingerprint,
            rejects=[r.as_json() for r in self.rejects],
        )
        self.fingerprint, self.rejects = [], []
        self.last = time.monotonic()
        self._cost = 0.0
        self._spent(time.thread_time() - started)
        return delta

    def _spent(self, seconds: float) -> None:
        """Space the next checkpoints by the CPU this one cost (its delta in the writer, its
        journal line in the fsync thread): at most ``CHECKPOINT_SHARE`` of the time."""
        self._cost += seconds
        self.interval = checkpoint_interval(self.every, self._cost)

    def due_for_trim(self) -> bool:
        """True about once a second: when to hand freed batch buffers back to the OS."""
        now = time.monotonic()
        if now - self._trimmed < 1.0:
            return False
        self._trimmed = now
        return True

    def _commit(self, sink: Sink, delta: dict[str, Any]) -> None:
        sink.sync()
        started = time.thread_time()  # the line's encoding, not the fsync's wait
        self.writer.checkpoint(delta)
        self._spent(time.thread_time() - started)

    def drain(self) -> None:
        """Wait for the checkpoint in flight: a failed fsync of the file fails the build."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.writer.close()
