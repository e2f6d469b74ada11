"""shared_memory: a local worker's big results reach the parent through shared memory.

A ragged column of many value rows per chunk comes back raw (the parent cuts its chunks), and
pickling it, piping it and unpickling it cost the build as much CPU as compressing it (0.7
CPU-s of the 120-recording series benchmark). Compressed chunks, the bulk of every other
result, went the same way: the pipe and unpickling were the single writer's largest cost
after the writes themselves (at 30,000 image pairs, 1.76 GB through loky's result pipe). A
local worker writes such an array, or a column's chunks one after another, to a file in
``/dev/shm`` (one copy, as pickling made) and sends its name; the parent maps it (no copy;
the chunks become views of the mapping that ``write_direct_chunk`` reads) and unlinks the
name at once, so the memory goes when the result does. Names carry the
parent's pid: what a cancelled or crashed build leaves is swept (``sweep``). Without
``/dev/shm`` (not Linux) the values travel pickled, as ever; a Dask worker never shares.

A result of at most ``SLOT_BYTES`` goes into a recycled file instead (``Slots``): the parent
lends one to each task it submits, keeps it mapped, and takes it back once nothing holds a
view of the result any more. A file made, mapped, unlinked and freed for every result cost
the writer 1 ms a result in page allocation, mapping and freeing (0.45 of its 4 CPU-s at
30,000 image pairs, and the workers as much again zeroing fresh pages).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from h5etl.dataflow import BatchResult, EncodedChunk, EncodedRows, RaggedRows, values_nbytes
from h5etl.execute.arena import SHM as SHM
from h5etl.execute.arena import SLOT_BYTES as SLOT_BYTES
from h5etl.execute.arena import Arena
from h5etl.processes import pid_alive

PREFIX = "h5etl-values"
MIN_BYTES = 1 << 20  # smaller arrays cost less pickled than a file
# A result whose shared columns hold at most this many bytes goes into a lent slot (a task of
# image chunks: 3-10 MB). Larger ones (CT cases) get a file of their own, freed with them: a
# slot keeps its pages until the build ends. (A worker maps a slot this long: ``arena``.)


@dataclass(frozen=True, slots=True)
class SharedArray:
    """Where a worker left one column's values: a file name, their shape and dtype; in a
    lent slot (``slot``), from byte ``offset``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int = 0
    slot: bool = False


@dataclass(frozen=True, slots=True)
class SharedChunks:
    """Where a worker left one column's compressed chunks: a file name, each chunk's size in
    the order of ``EncodedRows.blocks`` (block by block, chunk by chunk); in a lent slot
    (``slot``), from byte ``offset``, one after another, or each from its own ``starts``
    (compressed into the slot where they lie: ``arena``)."""

    name: str
    sizes: tuple[int, ...]
    offset: int = 0
    slot: bool = False
    starts: tuple[int, ...] = ()


class _Wanted(NamedTuple):
    """A column to share: its name, raw values array or encoded rows, their bytes, and where
    its chunks lie in the arena (None: not all of them there)."""

    name: str
    values: Any
    nbytes: int
    starts: tuple[int, ...] | None


def _shareable(result: BatchResult, arena: Arena | None) -> list[_Wanted]:
    """The columns of ``result`` worth sharing: each of ``MIN_BYTES`` or more, and any whose
    chunks are all in ``arena`` (shared at no cost)."""
    out: list[_Wanted] = []
    for name, rows in result.columns.items():
        values = rows.values if isinstance(rows, RaggedRows) else rows
        shareable = isinstance(values, EncodedRows) or (
            isinstance(values, np.ndarray) and isinstance(rows, RaggedRows)
        )
        if not shareable:
            continue
        starts = None
        if arena is not None and isinstance(values, EncodedRows):
            starts = arena.starts_of(values)
        nbytes = values_nbytes(values)
        if nbytes >= MIN_BYTES or starts is not None:
            out.append(_Wanted(name, values, nbytes, starts))
    return out


def _write_values(fd: int, values: Any) -> tuple[int, ...]:
    """Write a column's bytes at the file position of ``fd`` (an array's, or its chunks' one
    after another); return the chunk sizes (none for an array)."""
    if isinstance(values, EncodedRows):
        chunks = [chunk for block in values.blocks for chunk in block]
        _write_all(fd, [chunk.data for chunk in chunks])
        return tuple(len(chunk.data) for chunk in chunks)
    _write_all(fd, [np.ascontiguousarray(values).reshape(-1).view(np.uint8).data])
    return ()


IOV_MAX = 1024  # buffers per writev (Linux's limit)


def _write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> None:
    """Write ``buffers`` end to end, ``IOV_MAX`` to a system call: a CT case is thousands
    of chunks of a few KB, and a write each cost a third more (36 against 27 ms for 3,200
    chunks of 14 KB)."""
    pending: list[bytes | memoryview] = [b for b in buffers if len(b)]
    while pending:
        written = os.writev(fd, pending[:IOV_MAX])
        done = 0  # whole buffers written; a short write resumes inside the next
        while done < len(pending) and written >= len(pending[done]):
            written -= len(pending[done])
            done += 1
        pending = pending[done:]
        if written:
            pending[0] = memoryview(pending[0])[written:]


def _emptied(result: BatchResult, name: str, values: Any) -> None:
    """Leave the column's rows without their bytes: they travel through shared memory."""
    rows = result.columns[name]
    if isinstance(values, EncodedRows):
        # (the constructor, not dataclasses.replace: 6x cheaper, for thousands of chunks a case)
        values.blocks = [
            [EncodedChunk(c.offset, c.filter_mask, b"", c.sha256) for c in block]
            for block in values.blocks
        ]
    else:
        assert isinstance(rows, RaggedRows)
        rows.values = values[:0]


def _ref(name: str, values: Any, sizes: tuple[int, ...], offset: int, slot: bool) -> Any:
    if isinstance(values, EncodedRows):
        return SharedChunks(name, sizes, offset, slot)
    return SharedArray(name, values.shape, values.dtype.str, offset, slot)


def share(
    result: BatchResult, owner: int, slot: str | None = None, arena: Arena | None = None
) -> BatchResult:
    """In a local worker: move each raw ragged values array and each column's compressed
    chunks of ``MIN_BYTES`` or more to ``/dev/shm`` (``result.shared``), leaving them empty
    in the result: into the parent's lent ``slot`` (a file name) when they fit
    ``SLOT_BYTES``, else each into a file named for the parent ``owner``. Chunks compressed
    into the slot already (its ``arena``) stay where they are. Any error leaves the values
    where they are (or in files of their own, if the slot failed)."""
    try:
        if SHM.is_dir():
            _share(result, owner, slot, arena)
    finally:
        if arena is not None:
            _detach(result, arena)
    return result


def _share(result: BatchResult, owner: int, slot: str | None, arena: Arena | None) -> None:
    wanted = _shareable(result, arena)
    if not wanted:
        return
    placed = arena.used if arena is not None else 0
    rest = sum(w.nbytes for w in wanted if w.starts is None)
    fits = slot is not None and placed + rest <= SLOT_BYTES
    if fits and slot is not None and _into_slot(result, wanted, slot, arena):
        return
    for name, values, _, _ in wanted:
        path = SHM / f"{PREFIX}-{owner}-{uuid.uuid4().hex}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                sizes = _write_values(fd, values)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        result.shared[name] = _ref(path.name, values, sizes, 0, False)
        _emptied(result, name, values)


def _detach(result: BatchResult, arena: Arena) -> None:
    """Give the chunks of columns that were not shared bytes of their own if they view
    ``arena``: the result is pickled, and the slot's next task writes over the arena."""
    for name, rows in result.columns.items():
        values = rows.values if isinstance(rows, RaggedRows) else rows
        if name not in result.shared and isinstance(values, EncodedRows):
            arena.detach(values)


def _into_slot(result: BatchResult, wanted: list[_Wanted], slot: str, arena: Arena | None) -> bool:
    """Write the ``wanted`` columns one after another into the lent ``slot``, after what its
    ``arena`` holds (columns all in it stay there); False (and the result untouched) if it
    cannot be written (the parent gave it up: the build stopped)."""
    refs: dict[str, Any] = {}
    offset = arena.used if arena is not None else 0
    try:
        fd = os.open(SHM / slot, os.O_WRONLY | os.O_CLOEXEC)  # never made here: the parent's
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            for name, values, nbytes, starts in wanted:
                if starts is not None:
                    sizes = tuple(len(c.data) for block in values.blocks for c in block)
                    refs[name] = SharedChunks(slot, sizes, 0, True, starts)
                    continue
                refs[name] = _ref(slot, values, _write_values(fd, values), offset, True)
                offset += nbytes
        finally:
            os.close(fd)
    except OSError:
        return False
    for name, values, _, _ in wanted:
        result.shared[name] = refs[name]
        _emptied(result, name, values)
    return True


def attach(result: BatchResult, slots: Slots | None = None, lent: str | None = None) -> BatchResult:
    """In the parent: put the shared values back into their columns (read-only arrays, or
    chunks whose bytes are views, over the mapped files), unlinking each file of its own at
    once. Values in the slot ``lent`` (of ``slots``) for this result are views of its
    mapping, and the slot goes back to ``slots`` once the last of them is freed (at once,
    if the worker did not use it)."""
    anchor = None
    for name, ref in result.shared.items():
        if ref.slot:
            assert slots is not None, "a result in a slot, attached without the slots"
            assert ref.name == lent, "a slot the result was not lent"
            if anchor is None:
                anchor = slots.anchor(ref.name, result.shared.values())
            mapped: Any = anchor
        else:
            path = SHM / ref.name
            with open(path, "rb") as handle:
                # prefaulted in one call: a fault per page, as a fresh buffer takes, cost more
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapped = mmap.mmap(handle.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
            path.unlink()
        rows = result.columns[name]
        if isinstance(ref, SharedChunks):
            encoded = rows.values if isinstance(rows, RaggedRows) else rows
            assert isinstance(encoded, EncodedRows)
            _attach_chunks(encoded, memoryview(mapped), ref.sizes, ref.offset, ref.starts)
            continue
        assert isinstance(rows, RaggedRows)
        count = int(np.prod(ref.shape, dtype=np.int64))
        values = np.frombuffer(mapped, dtype=ref.dtype, count=count, offset=ref.offset)
        rows.values = values.reshape(ref.shape)
    result.shared = {}
    if slots is not None and lent is not None and anchor is None:
        slots.give_back(lent)  # the worker wrote nothing there
    return result


def _attach_chunks(
    rows: EncodedRows,
    view: memoryview,
    sizes: tuple[int, ...],
    start: int = 0,
    starts: tuple[int, ...] = (),
) -> None:
    """Give each chunk of ``rows`` its bytes back, as views of ``view`` in their order, the
    first at ``start``, or each at its own of ``starts``."""
    blocks, index = [], 0
    for block in rows.blocks:
        placed = []
        for chunk in block:
            size = sizes[index]
            if starts:
                start = starts[index]
            data = view[start : start + size]
            placed.append(EncodedChunk(chunk.offset, chunk.filter_mask, data, chunk.sha256))
            start, index = start + size, index + 1
        blocks.append(placed)
    rows.blocks = blocks


class Slots:
    """The files of ``/dev/shm`` the parent ``owner`` lends its tasks, at most ``most``.

    ``take`` lends one for a task (None when all are out: the worker then makes files of its
    own); ``anchor`` maps a result's part of it; the slot comes back when the result's last
    view is freed, and a slot whose task failed is retired (its worker may not be done with
    it). ``close`` removes them all (views still held stay valid: the pages go with them).
    """

    def __init__(self, owner: int, most: int):
        self.owner = owner
        self.most = most
        self.made: list[str] = []
        self._free: list[str] = []  # append and pop: atomic, whichever thread frees a result
        self._mapped: dict[str, mmap.mmap] = {}

    def take(self) -> str | None:
        """A slot to lend a task, or None: all are out, or no shared memory here."""
        with contextlib.suppress(IndexError):
            return self._free.pop()
        if len(self.made) >= self.most or not SHM.is_dir():
            return None
        name = f"{PREFIX}-{self.owner}-slot-{uuid.uuid4().hex}"
        try:
            (SHM / name).touch(exist_ok=False)
        except OSError:
            return None
        self.made.append(name)
        return name

    def give_back(self, name: str) -> None:
        self._free.append(name)

    def retire(self, name: str) -> None:
        """Never lend ``name`` again (its task failed: a worker may still write there)."""
        self._mapped.pop(name, None)
        with contextlib.suppress(OSError):
            os.remove(SHM / name)

    def anchor(self, name: str, refs: Any) -> np.ndarray:
        """A read-only array over the slot's bytes that ``refs`` (of one result) occupy; the
        slot comes back once it and every view of it are freed."""
        end = max(_end(ref) for ref in refs if ref.slot)
        mapped = self._mapped.get(name)
        if mapped is None or len(mapped) < end:  # more of the slot is used: map it again
            # only as far as it is used: a worker makes the file ``arena.SLOT_BYTES`` long,
            # and reading (populating) a tmpfs file's hole gives it a page
            with open(SHM / name, "rb") as handle:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapped = mmap.mmap(handle.fileno(), end, flags=flags, prot=mmap.PROT_READ)
            self._mapped[name] = mapped
        anchor = np.frombuffer(mapped, dtype=np.uint8, count=end)
        weakref.finalize(anchor, self.give_back, name)
        return anchor

    def close(self) -> None:
        self._mapped.clear()
        self._free.clear()
        for name in self.made:
            with contextlib.suppress(OSError):
                os.remove(SHM / name)


def _end(ref: SharedArray | SharedChunks) -> int:
    """Where ``ref``'s bytes end in its file."""
    if isinstance(ref, SharedChunks) and ref.starts:
        return max((s + n for s, n in zip(ref.starts, ref.sizes, strict=True)), default=0)
    if isinstance(ref, SharedChunks):
        return ref.offset + sum(ref.sizes)
    size = int(np.prod(ref.shape, dtype=np.int64)) * np.dtype(ref.dtype).itemsize
    return ref.offset + size


@contextlib.contextmanager
def swept(owner: int) -> Iterator[None]:
    """Around a build's task stream: what killed builds left is removed first, and what this
    one (``owner``) gave up after it (results of a build that stopped early)."""
    sweep()
    try:
        yield
    finally:
        sweep(owner)


def sweep(owner: int | None = None) -> None:
    """Remove what no parent will attach: ``owner``'s files (results given up: a build that
    stopped early), and those of parents that are gone (a killed build)."""
    if not SHM.is_dir():
        return
    for path in SHM.glob(f"{PREFIX}-*-*"):
        try:
            pid = int(path.name[len(PREFIX) + 1 :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == owner or not pid_alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()
