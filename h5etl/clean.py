"""clean: sanitise keys, probe headers, apply the oversize policy, assign splits, plan tasks.

Input: discovered samples. Output: a ``Plan`` (per split, samples in a seeded write order) and
rejects. Headers are read without decoding pixels. Splits are assigned by a seeded hash of the
key, so a sample keeps its split when the folder grows: no leakage between releases.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import math
import os
import re
import stat
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl import geometry, images
from h5etl.errors import RejectError
from h5etl.records import (
    Barrier,
    BatchResult,
    DecodeTask,
    Reject,
    Sample,
    sample_rejects,
    text_bytes,
    valid_text,
)

if TYPE_CHECKING:  # header probes run in the decode workers; pydantic stays out of them
    from h5etl.spec import Spec

STAGE = "clean"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\:]+")
MAX_KEY_LENGTH = 255

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Probed:
    """A sample that passed its header probes: its size, and what identifies its files' bytes."""

    height: int
    width: int
    stamp: str  # size and mtime (ns) of each file: a resume must find the same bytes


ProbeOutcome = Probed | list[Reject]
PROBE_BATCH = 128  # samples per probe task: big enough that IPC is noise beside the probes


@dataclass(frozen=True, slots=True)
class ProbeRules:
    """What a header probe checks beyond readability: plain data, picklable for workers."""

    reject_oversize: bool
    targets: tuple[tuple[str, int, int], ...]  # (field, height, width) of each image field

    @classmethod
    def of(cls, spec: Spec) -> ProbeRules:
        targets = []
        for name in spec.image_fields:
            shape = spec.fields[name].shape
            assert shape is not None
            targets.append((name, shape[1], shape[2]))
        return cls(spec.pad.oversize == "reject", tuple(targets))


ProbeBatch = Callable[[Sequence[Sample]], list[ProbeOutcome]]
Mapper = Callable[[ProbeBatch, Iterable[Sequence[Sample]]], Iterable[list[ProbeOutcome]]]
"""``mapper(fn, batches)`` runs ``fn`` on each batch (in parallel or not), results in order."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Samples per split in write order; decode tasks are cut from it lazily.

    It holds discover's own ``Sample`` objects (no per-sample copies: a plan of millions of
    files lives in the single parent process for the whole build).
    """

    splits: dict[str, list[Sample]]
    rejects: list[Reject]
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (original key, new key)
    digest: str = ""  # SHA-256 of splits, keys, file names, probed sizes, file sizes and mtimes

    @property
    def total(self) -> int:
        return sum(len(samples) for samples in self.splits.values())

    def fingerprint(self) -> str:
        """What a resume must find unchanged: splits, keys, files, their sizes and mtimes."""
        return self.digest


def sanitize_key(key: str) -> str:
    """NFC, control characters and backslashes/colons as ``_``, undecodable bytes of a name
    as ``\\xNN``, at most 255 characters."""
    cleaned = _UNSAFE.sub("_", unicodedata.normalize("NFC", valid_text(key))).strip() or "_"
    if len(cleaned) > MAX_KEY_LENGTH:
        digest = hashlib.sha256(cleaned.encode()).hexdigest()[:12]
        cleaned = f"{cleaned[: MAX_KEY_LENGTH - 13]}~{digest}"
    return cleaned


def sanitize_keys(samples: Sequence[Sample]) -> tuple[list[Sample], list[tuple[str, str]]]:
    """Sanitise every key; keys that collide afterwards are all kept, numbered ``key~2``, ...

    A key that needs no cleaning keeps its name, so a new file that cleans to it (``img:1``
    beside ``img_1``) cannot rename a file of earlier releases; the others are numbered in
    the (sorted) order given.
    """
    cleaned = [sanitize_key(s.key) for s in samples]
    counts = Counter(cleaned)
    taken = set(cleaned)  # a number must not land on a key that exists already (``a~2``)
    claimed = {c for sample, c in zip(samples, cleaned, strict=True) if sample.key == c}
    used: Counter[str] = Counter()
    out, renamed = [], []
    for sample, clean in zip(samples, cleaned, strict=True):
        key = clean
        if counts[clean] > 1 and sample.key != clean:
            if clean in claimed:
                used[clean] = max(used[clean], 1) + 1
                while f"{clean}~{used[clean]}" in taken:
                    used[clean] += 1
                key = f"{clean}~{used[clean]}"
                taken.add(key)
            else:
                claimed.add(clean)
        if key != sample.key:
            renamed.append((sample.key, key))
            sample = Sample(key, sample.relpaths, sample.roots)
        out.append(sample)  # unchanged samples are kept, not copied: plans can be large
    return out, renamed


def split_of(key: str, splits: dict[str, float], seed: int) -> str:
    """The split of a key: a seeded hash mapped onto the cumulative split fractions."""
    digest = hashlib.sha256(text_bytes(f"{seed}\x00{key}")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    cumulative = 0.0
    names = list(splits)
    for name in names:
        cumulative += splits[name]
        if position < cumulative:
            return name
    return names[-1]


def _reject_sample(sample: Sample, reason: str, detail: str, cause: str = "") -> list[Reject]:
    return sample_rejects(sample, STAGE, reason, detail, cause)


def _stat_problem(path: str, exc: OSError) -> tuple[str, str]:
    """The reject reason and detail for a file that cannot be stat'ed."""
    if exc.errno == errno.ELOOP:
        return "symlink_loop", "symbolic link loop"
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return "dangling_symlink", "symbolic link points nowhere"
    return "unreadable", f"cannot read: {exc.strerror or exc}"


def _stamp_sample(sample: Sample) -> ProbeOutcome:
    """The files' stamps alone (size and mtime): what a build needs before decoding."""
    stamps = []
    for f in sample.files:
        try:
            info = os.stat(f.path)
        except OSError as exc:
            return _reject_sample(sample, *_stat_problem(f.path, exc), f.path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the worker that opens it
            return _reject_sample(sample, "not_a_file", "not a regular file", f.path)
        stamps.append(f"{info.st_size}:{info.st_mtime_ns}")
    return Probed(0, 0, ",".join(stamps))


def stamp_samples(samples: Sequence[Sample]) -> list[ProbeOutcome]:
    """Stamp a batch of samples without reading them (``plan(..., headers=False)``)."""
    return [_stamp_sample(sample) for sample in samples]


def _probe_sample(sample: Sample, rules: ProbeRules) -> ProbeOutcome:
    """The sample's size from its headers (and its files' stamps), or the rejects of its files."""
    sizes: dict[str, tuple[int, int]] = {}
    stamps = []
    for f in sample.files:
        try:
            header = images.probe(f.path)
            stat = os.stat(f.path)
        except RejectError as exc:
            return _reject_sample(sample, exc.reason, exc.message, f.path)
        except OSError as exc:
            detail = f"cannot read: {exc.strerror or exc}"
            return _reject_sample(sample, "unreadable", detail, f.path)
        sizes[f.source] = (header.height, header.width)
        stamps.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{source} {h}x{w}" for source, (h, w) in sizes.items())
        return _reject_sample(sample, "size_mismatch", f"sizes differ (HxW): {shown}")
    size = next(iter(sizes.values()))
    if rules.reject_oversize:
        for name, height, width in rules.targets:
            if geometry.is_oversize(size, (height, width)):
                return _reject_sample(
                    sample,
                    "oversize",
                    f"{size[0]}x{size[1]} is larger than fields.{name}.shape "
                    f"{height}x{width} (pad.oversize: reject; crop or resize to keep it)",
                )
    return Probed(size[0], size[1], ",".join(stamps))


def probe_samples(samples: Sequence[Sample], rules: ProbeRules) -> list[ProbeOutcome]:
    """Probe a batch of samples; a decode worker runs this (see ``plan``'s ``mapper``)."""
    return [_probe_sample(sample, rules) for sample in samples]


def plan(
    spec: Spec,
    samples: Sequence[Sample],
    progress: Progress | None = None,
    *,
    mapper: Mapper | None = None,
    headers: bool = True,
) -> Plan:
    """Probe and place every sample.

    ``mapper`` runs the header probes (``probe_samples`` over batches of samples), e.g. on the
    decode workers; by default they run here. Placement does not depend on it. With
    ``headers=False`` only the files' sizes and mtimes are read, here: a build decodes every
    sample anyway, and decoding makes every check a header probe makes, so the probes would
    only read each file twice (a fifth of a build's wall time, before any decoding).

    Returns:
        The plan; every input is either in it once or among its rejects.
    """
    renamed_samples, renamed = sanitize_keys(samples)
    rules = ProbeRules.of(spec)
    batches = [
        renamed_samples[i : i + PROBE_BATCH] for i in range(0, len(renamed_samples), PROBE_BATCH)
    ]
    probe_batch: ProbeBatch = functools.partial(probe_samples, rules=rules)
    if not headers:
        outcomes: Iterable[list[ProbeOutcome]] = map(stamp_samples, batches)
    elif mapper is None:
        outcomes = map(probe_batch, batches)
    else:
        outcomes = mapper(probe_batch, batches)
    rejects: list[Reject] = []
    by_split: dict[str, list[Sample]] = {name: [] for name in spec.splits}
    digest = hashlib.sha256()
    # A sample's split follows from its own name (NFC), never from the key it was given, which
    # can change when another file's key collides with it.
    originals = {new: old for old, new in renamed}
    for batch, results in zip(batches, outcomes, strict=True):
        for sample, outcome in zip(batch, results, strict=True):
            if isinstance(outcome, list):
                rejects.extend(outcome)
            else:
                name = unicodedata.normalize("NFC", originals.get(sample.key, sample.key))
                split = split_of(name, spec.splits, spec.seed)
                by_split[split].append(sample)
                names = "\x01".join(sample.relpaths)
                size = f"{outcome.height}x{outcome.width}\x01{outcome.stamp}"
                digest.update(text_bytes(f"\x00{split}\x02{sample.key}\x01{names}\x01{size}"))
        if progress is not None:
            progress(len(batch))
    rng = np.random.default_rng(spec.seed)
    ordered = {}
    for name, members in by_split.items():
        members.sort(key=lambda s: s.key)
        ordered[name] = [members[i] for i in rng.permutation(len(members))]
    return Plan(ordered, rejects, renamed, digest.hexdigest())


# Accepted samples per decode task, at least: enough that IPC and task overhead are noise
# whatever the chunk size (a chunk of 1 sample would otherwise make a task of 1 sample), within
# a memory budget per task (a worker holds a task's rows, and the parent a few results).
TASK_SAMPLES = 64
TASK_BYTES = 64 * 2**20
RESERVE_FRACTION = 0.1  # reserves per task, of its rows: covers a 3% reject rate with margin


def task_rows(block: int, sample_bytes: int = 0) -> int:
    """Rows a decode task keeps: whole blocks (chunks of every field), about ``TASK_SAMPLES``
    but at most ``TASK_BYTES`` of decoded rows, and never less than one block."""
    blocks = max(1, round(TASK_SAMPLES / block))
    if sample_bytes:
        blocks = min(blocks, max(1, TASK_BYTES // (block * sample_bytes)))
    return block * blocks


def task_reserve(rows: int) -> int:
    """Reserve samples a task carries beyond its rows, to replace its rejects."""
    return max(2, math.ceil(rows * RESERVE_FRACTION))


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

    def journal_delta(self) -> dict[str, Any]:
        """Where the queue stands, with the deferred entries since the last call (copies)."""
        added = self.deferred[self.journaled :]
        self.journaled = len(self.deferred)
        return {"consumed": self.consumed, "deferred": added, "rounds": list(self.rounds)}


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
        self.rows = rows if rows is not None else task_rows(block, sample_bytes)
        if self.rows % block:
            raise ValueError(f"task rows {self.rows} must be a multiple of the block {block}")
        self.reserve = reserve if reserve is not None else task_reserve(self.rows)
        known = state or {}
        if any(queue.get("cut") != self.geometry for queue in known.values()):
            raise ValueError(f"the journal's tasks were cut otherwise than {self.geometry}")
        self.queues = {
            split: SplitQueue(
                len(members), **{k: v for k, v in known.get(split, {}).items() if k != "cut"}
            )
            for split, members in plan.splits.items()
        }

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

    def journal_delta(self) -> dict[str, dict[str, Any]]:
        """The queues as plain data for the resume journal: each split's position and rounds,
        and what it deferred since the last call (``journal.ResumeState`` adds them up)."""
        return {
            split: {**queue.journal_delta(), "cut": self.geometry}
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

    def _round(self, split: str, queue: SplitQueue, start: int, end: int) -> Iterator[DecodeTask]:
        members = self._plan.splits[split]
        step = self.rows + self.reserve
        final = end - start <= step
        position = start
        while position < end:
            stop = end if final else min(position + step, end)
            if stop > queue.consumed:  # a resumed build skips what its journal holds
                indices = tuple(queue.member(p) for p in range(position, stop))
                yield DecodeTask(
                    split,
                    position,
                    tuple(members[i] for i in indices),
                    self.rows,
                    self.block,
                    final=final,
                    members=indices,
                )
            position = stop
