"""The plain data that flows between stages: samples, rejects, decode tasks and their results."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def valid_text(text: str) -> str:
    """``text`` as valid Unicode, for places that must store or encode it as UTF-8.

    Python's file APIs return the bytes of a name that is not valid UTF-8 (an archive from
    another system) as lone surrogates; those become ``\\xNN`` escapes here, so
    ``caf\\xe9.png`` is what HDF5 stores. Valid text comes back unchanged.
    """
    if text.isascii():  # most names: no copy made to find out (30,000 keys twice a build)
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # surrogates no file name can hold
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
        return raw.decode("utf-8", "backslashreplace")
    return text


_PLAIN_SEP = os.sep == "/" and os.altsep is None


def join_path(root: str, relpath: str) -> str:
    """``os.path.join(root, relpath)``, quicker for the usual case: it runs for every file of
    every sample at every stage (60,000 times a plan at 10x; posixpath.join costs ~2 us)."""
    if _PLAIN_SEP and root and relpath and root[-1] != "/" and relpath[0] != "/":
        return f"{root}/{relpath}"
    return os.path.join(root, relpath)


def text_bytes(text: str) -> bytes:
    """``text`` as bytes for hashing: UTF-8, lone surrogates included (never fails)."""
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One input file of a sample: its source, the source dir and its path relative to it."""

    source: str
    root: str
    relpath: str

    @property
    def path(self) -> str:
        return join_path(self.root, self.relpath)


Roots = tuple[tuple[str, str], ...]
"""(source name, source dir) in source order; one object shared by every sample of a build."""


@dataclass(frozen=True, slots=True)
class Sample:
    """Files paired by key (their relative stem), one per source, in source order.

    Only the relative paths are stored, beside a ``roots`` tuple shared by all samples: the
    plan of a build lives in the single parent process, so each file costs one string.
    """

    key: str
    relpaths: tuple[str, ...]
    roots: Roots
    extras: tuple[Any, ...] = ()  # values known at plan time, one per plan-side field
    name: str = ""  # the name its split is seeded by, when not its key (a renamed key)
    group: str = ""  # its group (``splits.group_by``); "" when splits are not grouped

    def __reduce__(self) -> tuple[type[Sample], tuple[Any, ...]]:
        # A call of the class: a slotted dataclass's own state functions cost 3x more, and
        # every task sends its samples to a worker (see ``DecodeTask.__reduce__``).
        return Sample, self.fields()

    def fields(self) -> tuple[Any, ...]:
        """The constructor's arguments, in order (``Sample(*sample.fields())`` is a copy)."""
        return (self.key, self.relpaths, self.roots, self.extras, self.name, self.group)

    @classmethod
    def of(cls, key: str, files: tuple[SourceFile, ...]) -> Sample:
        return cls(key, tuple(f.relpath for f in files), tuple((f.source, f.root) for f in files))

    @property
    def split_name(self) -> str:
        """The name its split is seeded by: the NFC name it was found under."""
        return self.name or self.key

    @property
    def paths(self) -> tuple[str, ...]:
        """Each file's path, in source order (what ``files`` holds, without the objects)."""
        return tuple(
            join_path(root, relpath)
            for (_, root), relpath in zip(self.roots, self.relpaths, strict=True)
        )

    @property
    def files(self) -> tuple[SourceFile, ...]:
        return tuple(
            SourceFile(source, root, relpath)
            for (source, root), relpath in zip(self.roots, self.relpaths, strict=True)
        )


@dataclass(frozen=True, slots=True)
class Reject:
    """One input that is not in the release, and why. ``reason`` is a stable code."""

    path: str
    stage: str
    reason: str
    detail: str = ""
    key: str = ""
    # where user code raised (``file:line in function``) for a ``transform_error``; written
    # to the rejects file only when set, so other rejects keep their record
    frame: str = ""

    def as_json(self) -> dict[str, str]:
        out = {
            "path": self.path,
            "stage": self.stage,
            "reason": self.reason,
            "detail": self.detail,
            "key": self.key,
        }
        if self.frame:
            out["frame"] = self.frame
        return out


def sample_rejects(
    sample: Sample, stage: str, reason: str, detail: str, culprit: str = ""
) -> list[Reject]:
    """One reject per file of ``sample``; the files other than ``culprit`` say which one it was."""
    return [
        Reject(
            f.path,
            stage,
            reason,
            detail if f.path == culprit or not culprit else f"{detail} (in {culprit})",
            sample.key,
        )
        for f in sample.files
    ]


@dataclass(frozen=True, slots=True)
class DecodeTask:
    """A run of one split's decode queue, decoded by one worker call.

    The worker decodes ``samples`` in order until ``rows`` of them are accepted; the samples
    after those are reserves, there to replace rejects so the result still fills whole
    chunks. Reserves it did not need, and accepted samples that would leave a partial chunk
    (too many rejects), come back as ``deferred`` and are queued again. A ``final`` task is
    the last of its split: it keeps every accepted sample, the last chunk padded.
    """

    split: str
    start: int  # position of the first sample in the split's decode queue
    samples: tuple[Sample, ...]  # that passed cleaning, in queue order
    rows: int  # accepted samples to keep: a whole number of chunks of every field
    block: int  # rows of one chunk of every field (the lcm of their chunk rows)
    final: bool = False
    members: tuple[int, ...] = ()  # each sample's index in the split's write order
    raw: bool = False  # rows come back uncompressed (crash isolation joins them)
    # each sample's stamps (``Plan.stamps``) when a source is on object storage: the worker
    # reads each object as listed (its ETag or version), never a newer one; empty otherwise
    stamps: tuple[str, ...] = ()

    @property
    def end(self) -> int:
        return self.start + len(self.samples)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The single parent pickles every task for the pool (loky's pickler calls back into
        # Python for each object that is not a plain container): its samples go as tuples
        # of their fields, one call for the task. At 30,000 pairs that cut the parent's
        # pickling from 0.29 to 0.09 ms a task and the worker's unpickling by half.
        samples = tuple(sample.fields() for sample in self.samples)
        fields = (self.split, self.start, samples, self.rows, self.block, self.final)
        return _task, (*fields, self.members, self.raw, self.stamps)


def _task(
    split: str,
    start: int,
    samples: tuple[tuple[Any, ...], ...],
    rows: int,
    block: int,
    final: bool,
    members: tuple[int, ...],
    raw: bool,
    stamps: tuple[str, ...] = (),
) -> DecodeTask:
    """A ``DecodeTask`` from its pickled form (``DecodeTask.__reduce__``)."""
    samples_of = tuple(Sample(*fields) for fields in samples)
    return DecodeTask(split, start, samples_of, rows, block, final, members, raw, stamps)


@dataclass(frozen=True, slots=True)
class Barrier:
    """In a task stream: wait until every task of ``split`` given so far is consumed."""

    split: str

    def holds(self, item: object) -> bool:
        return isinstance(item, DecodeTask) and item.split == self.split


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One stored HDF5 chunk: its offset inside the block, the filter mask, the bytes and
    their SHA-256 (hex; for the resume journal, computed where the bytes are made)."""

    offset: tuple[int, ...]
    filter_mask: int
    data: bytes | memoryview  # a view of shared memory once a local worker's result arrives
    sha256: str = ""

    def __reduce__(self) -> tuple[type[EncodedChunk], tuple[Any, ...]]:
        # Pickled as a call of the class: a slotted dataclass's own state functions cost
        # 4x more, and a CT case sends 3,200 chunks (16 ms a case, both ends).
        return EncodedChunk, (self.offset, self.filter_mask, self.data, self.sha256)


@dataclass(slots=True)
class EncodedRows:
    """An array column's rows as compressed chunks, per block of chunk rows, with the
    SHA-256 of each uncompressed block (the sink's digests and the resume journal's)."""

    blocks: list[list[EncodedChunk]]
    digests: list[bytes]


@dataclass(slots=True)
class BlockTally:
    """The statistics and conversion counts of one block of rows (``DecodeTask.block``):
    what an incremental build needs to carry the block without decoding it."""

    stats: dict[str, Any] = field(default_factory=dict)
    conversions: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(slots=True)
class RaggedRows:
    """A ragged column's rows in a result: the values of its samples end to end, and each
    sample's length (rows of values). Where they land in the values dataset depends on every
    sample before them, so the sink cuts them into chunks through a carry; with one value
    row per chunk each sample starts a chunk, and they come compressed, a block per row."""

    values: np.ndarray | EncodedRows  # (sum of lengths, *trailing), or compressed
    lengths: np.ndarray  # (samples,) int64


ColumnRows = EncodedRows | RaggedRows | np.ndarray | list[str]
"""One column's rows in a result: compressed chunks, ragged values, plain rows (scalars, or
arrays a crash isolation joined) or strings."""


@dataclass(slots=True, weakref_slot=True)
class BatchResult:
    """What a worker returns for a task: each field's column rows, and the rejects.

    ``accepted`` rows are stored; ``deferred`` lists the positions (in ``task.samples``) of
    the samples to queue again, neither stored nor rejected. ``stats`` holds each field's
    statistics over the accepted rows, ``conversions`` the lossy conversions counted per
    field and code (a 16-bit input scaled into 8 bits).
    """

    task: DecodeTask
    accepted: int
    columns: dict[str, ColumnRows] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # of the accepted samples, in order
    lineage: list[tuple[str, ...]] = field(default_factory=list)  # hex SHA-256 per source
    stats: dict[str, Any] = field(default_factory=dict)
    conversions: dict[str, dict[str, int]] = field(default_factory=dict)
    blocks: list[BlockTally] = field(default_factory=list)  # per block of ``task.block`` rows
    rejects: list[Reject] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    seconds: float = 0.0
    # column -> where a local worker left its raw values (``h5etl.execute.shared_memory``)
    shared: dict[str, Any] = field(default_factory=dict)


def values_nbytes(values: Any) -> int:
    """The bytes of one column's values: its compressed chunks, or its raw rows (0 for
    anything else: texts, scalars)."""
    if isinstance(values, EncodedRows):
        return sum(len(chunk.data) for block in values.blocks for chunk in block)
    if isinstance(values, np.ndarray):
        return int(values.nbytes)
    return 0


def array_nbytes(result: BatchResult) -> int:
    """The bytes of a result's array columns: its compressed chunks, or its raw rows."""
    return sum(
        values_nbytes(rows.values if isinstance(rows, RaggedRows) else rows)
        for rows in result.columns.values()
    )
