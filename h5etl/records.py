"""The plain data that flows between stages: samples, rejects, decode tasks and their results."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One input file of a sample: its source dir and its path relative to it.

    The absolute path is derived, not stored: one shared ``root`` string per source keeps a
    plan of millions of files small in the single parent process.
    """

    source: str
    root: str
    relpath: str

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.relpath)


@dataclass(frozen=True, slots=True)
class Sample:
    """Files paired by key (their relative stem), one per source, in source order."""

    key: str
    files: tuple[SourceFile, ...]


@dataclass(frozen=True, slots=True)
class Reject:
    """One input that is not in the release, and why. ``reason`` is a stable code."""

    path: str
    stage: str
    reason: str
    detail: str = ""
    key: str = ""

    def as_json(self) -> dict[str, str]:
        return {
            "path": self.path,
            "stage": self.stage,
            "reason": self.reason,
            "detail": self.detail,
            "key": self.key,
        }


@dataclass(frozen=True, slots=True)
class DecodeTask:
    """A slice of one split's write order, decoded by one worker call."""

    split: str
    start: int  # position of the first sample in the split's write order
    samples: tuple[Sample, ...]  # that passed cleaning, in write order
    full_batch: int  # a result this long can be stored as whole pre-compressed chunks


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One stored HDF5 chunk: its offset inside the block, the filter mask, the bytes and
    their SHA-256 (hex; for the resume journal, computed where the bytes are made)."""

    offset: tuple[int, ...]
    filter_mask: int
    data: bytes
    sha256: str = ""


@dataclass(slots=True)
class BatchResult:
    """What a worker returns for a task: pixels raw or as encoded chunks, and the rejects."""

    task: DecodeTask
    accepted: int
    raw: dict[str, np.ndarray] = field(default_factory=dict)  # when not encoded
    encoded: dict[str, list[list[EncodedChunk]]] = field(default_factory=dict)  # per row block
    block_sha256: dict[str, list[bytes]] = field(default_factory=dict)  # per row block
    keys: list[str] = field(default_factory=list)  # of the accepted samples, in order
    texts: dict[str, list[str]] = field(default_factory=dict)
    lineage: list[tuple[str, ...]] = field(default_factory=list)  # hex SHA-256 per source
    rejects: list[Reject] = field(default_factory=list)
    seconds: float = 0.0
