"""The resume journal: what a build has stored durably, so a killed build can continue.

Beside its temp file, a build appends JSON lines: a header (config and plan digests), then a
checkpoint delta each time the sink has flushed and fsynced a consistent prefix. A delta lists
the chunks stored since the last one (dataset, chunk offset, byte offset and size in the temp
file, SHA-256 of the stored bytes: a table of columns, ``pack_chunks``) and the small rows
(names, lineage, fingerprint, rejects).
``--resume`` copies the recorded chunk bytes from the dead build's temp file, verified against
their SHA-256, without trusting HDF5 metadata that may have been half-written at the kill.
A torn last line is ignored.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from h5etl.errors import SinkError, io_problem

# 3: statistics and conversion counts (tallies); text rows hold scalar columns too
# 4: chunks in write order across datasets, and where the small rows' runs came between them
# 5: a delta's chunks as a table of columns (``pack_chunks``), not an object per chunk
FORMAT = 5


@dataclass(frozen=True, slots=True)
class WrittenChunk:
    dataset: str
    offset: tuple[int, ...]
    filter_mask: int
    byte_offset: int
    size: int
    sha256: str


def _column(values: Any, dtype: str) -> str:
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def _read_column(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text, validate=True), dtype=dtype)


def pack_chunks(
    datasets: Sequence[str],
    which: Sequence[int],
    offsets: Sequence[tuple[int, ...]],
    places: Sequence[tuple[int, int, int]],
    sha256: Sequence[str],
) -> dict[str, Any]:
    """Chunks in write order as a table of columns, each one base64 string: chunk ``i`` is
    of ``datasets[which[i]]`` at ``offsets[i]``, stored at ``places[i]`` (filter mask, byte
    offset, size) with the SHA-256 (hex) ``sha256[i]``.

    A CT volume of 128 px tiles stored 16 chunks a slice: a record per chunk (a JSON
    object) made the journal the writer's largest cost after the writes (0.5 CPU-s of
    25,600 chunks, with the records); these columns cost a few milliseconds.
    """
    return {
        "datasets": list(datasets),
        "dataset": _column(which, "<u4"),
        "rank": _column([len(offset) for offset in offsets], "<u1"),
        "offset": _column(list(itertools.chain.from_iterable(offsets)), "<i8"),
        "place": _column(places, "<u8"),
        "sha256": base64.b64encode(bytes.fromhex("".join(sha256))).decode("ascii"),
    }


def unpack_chunks(table: dict[str, Any]) -> list[WrittenChunk]:
    """The chunk records of a table ``pack_chunks`` made.

    Raises:
        ValueError: the columns are damaged or of different lengths.
    """
    which = _read_column(table["dataset"], "<u4")
    ranks = _read_column(table["rank"], "<u1")
    flat = _read_column(table["offset"], "<i8")
    places = _read_column(table["place"], "<u8").reshape(-1, 3)
    digests = base64.b64decode(table["sha256"], validate=True)
    if not len(which) == len(ranks) == len(places) == len(digests) / 32 or ranks.sum() != len(flat):
        raise ValueError("the journal's chunk columns differ in length")
    names = table["datasets"]
    ends = np.cumsum(ranks).tolist()
    records = []
    for index, (dataset, end, rank, place) in enumerate(
        zip(which.tolist(), ends, ranks.tolist(), places.tolist(), strict=True)
    ):
        mask, byte_offset, size = place
        sha = digests[32 * index : 32 * index + 32].hex()
        offset = tuple(flat[end - rank : end].tolist())
        records.append(WrittenChunk(names[dataset], offset, mask, byte_offset, size, sha))
    return records


@dataclass(slots=True)
class ResumeState:
    """Everything a journal says was stored, accumulated over its checkpoints."""

    config_sha256: str
    plan_sha256: str
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)  # the task cutter's state
    rows: dict[str, int] = field(default_factory=dict)
    chunks: list[WrittenChunk] = field(default_factory=list)  # in write order
    runs: list[tuple[str, int]] = field(default_factory=list)  # (split, chunks before it)
    blocks: dict[str, list[str]] = field(default_factory=dict)  # image dataset -> block digests
    texts: dict[str, list[str]] = field(default_factory=dict)  # text dataset -> rows
    lineage: dict[str, list[list[str]]] = field(default_factory=dict)  # split -> rows
    fingerprint: list[str] = field(default_factory=list)
    rejects: list[dict[str, str]] = field(default_factory=list)
    tallies: dict[str, Any] = field(default_factory=dict)  # the latest snapshot (not a delta)
    # ragged values dataset -> rows in whole chunks and the partial chunk (latest snapshot)
    ragged: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(self.rows.values())

    @property
    def checkpointed(self) -> bool:
        """Whether a checkpoint stored anything (a build writes the header before its first)."""
        return bool(self.chunks or self.samples)

    def apply(self, delta: dict[str, Any]) -> None:
        for split, queue in delta["queues"].items():
            known = self.queues.setdefault(split, {"deferred": []})
            known.update(consumed=queue["consumed"], rounds=queue["rounds"], cut=queue["cut"])
            known["deferred"].extend(queue["deferred"])
        self.rows.update(delta["rows"])
        self.chunks.extend(unpack_chunks(delta["chunks"]))
        # no runs: the small rows all wait in the buffer, as in a delta before any run
        self.runs.extend((str(split), int(before)) for split, before in delta.get("runs", ()))
        for name, blocks in delta["blocks"].items():
            self.blocks.setdefault(name, []).extend(blocks)
        for name, rows in delta["texts"].items():
            self.texts.setdefault(name, []).extend(rows)
        for split, rows in delta["lineage"].items():
            self.lineage.setdefault(split, []).extend(rows)
        self.fingerprint.extend(delta["fingerprint"])
        self.rejects.extend(delta["rejects"])
        self.tallies = delta.get("tallies", self.tallies)
        self.ragged.update(delta.get("ragged", {}))


class JournalWriter:
    """Appends checkpoint deltas to the journal, each one fsynced before it counts.

    Lines go straight to the file descriptor: no buffer is left to write at the close, so
    closing after a failed write (a full disk) cannot fail again and hide the first error.

    Raises:
        SinkError: the journal cannot be created or written.
    """

    def __init__(self, path: Path, *, config_sha256: str, plan_sha256: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            problem = io_problem(exc)
            raise SinkError(f"cannot create the resume journal: {problem}", path=path) from exc
        self._append({"format": FORMAT, "config_sha256": config_sha256, "plan_sha256": plan_sha256})

    def _append(self, record: dict[str, Any]) -> None:
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        # A name's undecodable bytes (lone surrogates) are written as JSON escapes, which
        # read back as the same string.
        line = memoryview(text.encode("utf-8", errors="backslashreplace"))
        try:
            while line:
                line = line[os.write(self._fd, line) :]
            os.fsync(self._fd)
        except OSError as exc:
            raise SinkError(
                f"writing the resume journal failed: {io_problem(exc)}", path=self.path
            ) from exc

    def checkpoint(self, delta: dict[str, Any]) -> None:
        self._append(delta)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def read(path: Path) -> ResumeState | None:
    """The state a journal describes, or None if it has no usable header."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            break  # a line torn by the kill, and nothing after it can be trusted
    if not records or records[0].get("format") != FORMAT:
        return None
    state = ResumeState(records[0]["config_sha256"], records[0]["plan_sha256"])
    for delta in records[1:]:
        try:
            state.apply(delta)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            break  # not a checkpoint this h5etl wrote: trust only what came before it
    return state


def holds_checkpoint(path: Path) -> bool:
    """Whether the journal at ``path`` holds a checkpoint ``--resume`` can continue from
    (a build writes its journal's header before its first checkpoint)."""
    state = read(path)
    return state is not None and state.checkpointed
