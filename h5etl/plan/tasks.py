"""tasks: cut the plan into decode tasks of whole chunks, in rounds per split.

A task keeps about ``TASK_SAMPLES`` accepted samples (whole chunks of every field) and carries
reserves that replace its rejects; what it cannot place in whole chunks comes back deferred
and is cut again in the split's next round, after a ``Barrier``. Where each sample lands
depends only on the plan and each sample's own outcome, never on timing or ``--jobs``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from h5etl.dataflow import Barrier, BatchResult, DecodeTask, Sample
from h5etl.plan.result import Plan

# Accepted samples per decode task, at least: enough that IPC and task overhead are noise
# whatever the chunk size (a chunk of 1 sample would otherwise make a task of 1 sample), within
# a memory budget per task (a worker holds a task's rows, and the parent a few results).
# Each task costs its worker ~3.7 ms beside its decoding (the pool's hand-over, the result
# into shared memory): 0.9 s a worker over 30,000 pairs in tasks of 64. In tasks of 128 the
# 30,000-pair build took 22.4 s against 23.5 s and the 3,000-pair one 2.94 s against 3.05 s
# (medians, interleaved); 256 gained nothing more. A plan smaller than ``SMALL_PLAN`` keeps
# tasks of ``SMALL_TASK_SAMPLES``: an incremental build's 174 new pairs, decoded in this
# process's threads, made two tasks of 120 and 54 for two threads.
TASK_SAMPLES = 128
SMALL_TASK_SAMPLES = 64
SMALL_PLAN = 2048
TASK_BYTES = 64 * 2**20
RESERVE_FRACTION = 0.1  # reserves per task, of its rows: covers a 3% reject rate with margin


def task_rows(block: int, sample_bytes: int = 0, samples: int | None = None) -> int:
    """Rows a decode task keeps: whole blocks (chunks of every field), about ``TASK_SAMPLES``
    (``SMALL_TASK_SAMPLES`` for a plan of fewer than ``SMALL_PLAN`` ``samples``) but at most
    ``TASK_BYTES`` of decoded rows, and never less than one block. A function of the plan
    alone, as where each sample lands must be."""
    small = samples is not None and samples < SMALL_PLAN
    # never more than TASK_SAMPLES: lowering it (a test's small tasks) lowers both
    wanted = min(TASK_SAMPLES, SMALL_TASK_SAMPLES) if small else TASK_SAMPLES
    blocks = max(1, round(wanted / block))
    if sample_bytes:
        blocks = min(blocks, max(1, TASK_BYTES // (block * sample_bytes)))
    return block * blocks


def task_reserve(rows: int, block: int = 0) -> int:
    """Reserve samples a task carries beyond its rows, to replace its rejects; none for a
    task of one sample (a CT case bigger than ``TASK_BYTES``): it is a whole block however
    many are rejected, and a final task would decode and hold its reserves too. None either
    where a block is one sample (only ragged columns, or chunks of one row): any number of
    rows is whole blocks, so a task keeps what it accepted, and reserves would only be
    deferred, decoded in a later round behind a barrier that idles the workers (a series
    build spent a fifth of its samples and two barriers on them)."""
    if rows == 1 or block == 1:
        return 0
    return max(2, math.ceil(rows * RESERVE_FRACTION))


Position = tuple[int, int, tuple[int, ...]]
"""Where a split's queue stood: results consumed, deferred entries, the rounds' ends."""


@dataclass(slots=True)
class SplitQueue:
    """One split's decode queue: the write order, then the samples deferred by tasks.

    Tasks are cut in rounds. The first round is the write order; each later round is what
    the previous one deferred, cut once every task of the split before it is consumed (a
    ``Barrier``). A round small enough for one task is the split's last: a final task.
    Journaled as plain data, so a resumed build cuts exactly the same tasks.
    """

    size: int  # samples in the write order
    consumed: int = 0  # queue position up to which results are stored
    deferred: list[int] = field(default_factory=list)  # write-order indices, queued again
    rounds: list[int] = field(default_factory=list)  # queue position where each round ends

    def member(self, position: int) -> int:
        return position if position < self.size else self.deferred[position - self.size]

    @property
    def length(self) -> int:
        return self.size + len(self.deferred)

    journaled: int = 0  # deferred entries already handed to the journal

    def position(self) -> Position:
        """Where the queue stands now: consumed, deferred entries, the rounds (a copy)."""
        return self.consumed, len(self.deferred), tuple(self.rounds)

    def journal_delta(self, at: Position) -> dict[str, Any]:
        """The queue as it stood at ``at``, with the deferred entries since the last call."""
        consumed, deferred, rounds = at
        added = self.deferred[self.journaled : deferred]
        self.journaled = deferred
        return {"consumed": consumed, "deferred": added, "rounds": list(rounds)}


class TaskCutter:
    """Cuts decode tasks from the plan, in rounds per split, and learns what each deferred.

    Every task but a split's last keeps a whole number of chunks of every field, so every
    chunk is compressed in a worker and the writer only writes. Which samples land in which
    row depends only on the plan and on each sample's own outcome, never on timing: the
    same file for any ``--jobs``. ``note`` is fed each result by the consumer, in order.
    """

    def __init__(
        self,
        plan: Plan,
        block: int,
        *,
        sample_bytes: int = 0,
        rows: int | None = None,
        reserve: int | None = None,
        state: dict[str, dict[str, Any]] | None = None,
    ):
        self._plan = plan
        self.block = block
        self.sample_bytes = sample_bytes  # decoded bytes of one sample, estimated
        total = sum(len(members) for members in plan.splits.values())
        self.rows = rows if rows is not None else task_rows(block, sample_bytes, total)
        if self.rows % block:
            raise ValueError(f"task rows {self.rows} must be a multiple of the block {block}")
        self.reserve = reserve if reserve is not None else task_reserve(self.rows, block)
        known = state or {}
        if any(queue.get("cut") != self.geometry for queue in known.values()):
            raise ValueError(f"the journal's tasks were cut otherwise than {self.geometry}")
        self.queues = {
            split: SplitQueue(
                len(members), **{k: v for k, v in known.get(split, {}).items() if k != "cut"}
            )
            for split, members in plan.splits.items()
        }
        self._noted: collections.deque[dict[str, Position]] = collections.deque()
        self._stored = self._position()  # as the journal (or nothing) left them

    @property
    def empty(self) -> bool:
        """Whether the plan holds no sample (every one carried): no task will be cut."""
        return not any(self._plan.splits.values())

    def samples(self) -> Iterator[Sample]:
        """Every sample of the plan, split by split: the inputs its tasks will read."""
        for members in self._plan.splits.values():
            yield from members

    @property
    def finished(self) -> bool:
        """Whether every sample of every split is consumed (the last result was noted):
        nothing more is cut, so a checkpoint now would only delay the build's end."""
        return all(queue.consumed >= queue.length for queue in self.queues.values())

    @property
    def geometry(self) -> list[int]:
        """How tasks are cut (rows, reserve, block): a resume must cut them the same way."""
        return [self.rows, self.reserve, self.block]

    def note(self, result: BatchResult) -> None:
        """Record a consumed result: where its split stands and what it deferred."""
        task = result.task
        queue = self.queues[task.split]
        queue.consumed = task.end
        queue.deferred.extend(task.members[position] for position in result.deferred)
        self._noted.append(self._position())

    def _position(self) -> dict[str, Position]:
        return {split: queue.position() for split, queue in self.queues.items()}

    def stored(self) -> None:
        """The oldest result noted and not yet stored is stored now: the journal may say so.

        Results are noted as they are decoded, which may run ahead of the writer (a thread
        pulls them while a resumed build copies the killed build's chunks,
        ``h5etl.execute.prefetch``);
        the journal must describe the queues as they stood after the last result stored.
        """
        self._stored = self._noted.popleft()

    def journal_delta(self) -> dict[str, dict[str, Any]]:
        """The queues as plain data for the resume journal, as they stood after the last
        stored result: each split's position and rounds, and what it deferred since the last
        call (``journal.ResumeState`` adds them up)."""
        return {
            split: {**queue.journal_delta(self._stored[split]), "cut": self.geometry}
            for split, queue in self.queues.items()
        }

    def __iter__(self) -> Iterator[DecodeTask | Barrier]:
        # Round r of every split, in plan order, then round r + 1: while one split waits for
        # its barrier, the tasks of the others keep the workers busy.
        open_splits = list(self.queues)
        number = 0
        while open_splits:
            for split in list(open_splits):
                queue = self.queues[split]
                start = queue.rounds[number - 1] if number else 0
                if number == len(queue.rounds):
                    if number:  # a round's samples are known once the one before is consumed
                        yield Barrier(split)
                    queue.rounds.append(queue.length)
                end = queue.rounds[number]
                if start == end:
                    open_splits.remove(split)
                    continue
                yield from self._round(split, queue, start, end)
            number += 1

    def _stamps_of(self, samples: tuple[Sample, ...]) -> tuple[str, ...]:
        """The samples' stamps, for a worker to read objects as listed; none for local files
        (their reads need none: a task stays as small as before)."""
        if not self._plan.remote:
            return ()
        return tuple(self._plan.stamps.get(sample.key, "") for sample in samples)

    def _round(self, split: str, queue: SplitQueue, start: int, end: int) -> Iterator[DecodeTask]:
        members = self._plan.splits[split]
        step = self.rows + self.reserve
        final = end - start <= step
        position = start
        while position < end:
            stop = end if final else min(position + step, end)
            if stop > queue.consumed:  # a resumed build skips what its journal holds
                indices = tuple(queue.member(p) for p in range(position, stop))
                samples = tuple(members[i] for i in indices)
                yield DecodeTask(
                    split,
                    position,
                    samples,
                    self.rows,
                    self.block,
                    final=final,
                    members=indices,
                    stamps=self._stamps_of(samples),
                )
            position = stop
