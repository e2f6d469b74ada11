"""arena: a local worker compresses its task's chunks straight into the slot it was lent.

A local worker's compressed chunks reach the parent through a file of ``/dev/shm`` the parent
lends the task (``shared_memory.Slots``). Compressing each block into a fresh bytes object and
then copying it into the slot cost the worker twice: the bytes object's pages came fresh from
the kernel for every block (the task's chunks are all alive until the result leaves, so
malloc never reuses them: a page fault and a zeroed page per 4 KiB), and the copy into the
file was a second pass over the bytes. With blosc-lz4, 1,024 samples of the benchmark corpus:
102 us a sample compressing and 26 us copying, against 62 and 1 here.

``writing_into(slot)`` maps the slot in the worker (read-write, shared: the parent's mapping
sees the same pages), makes it the codecs' destination for the task (``destination.encoding_into``),
and tells ``shared_memory.share`` where each chunk landed (``Arena.offset_of``). The mapping
is kept for the worker's next task in the same slot: its pages are faulted in once per worker,
not per task. A mapping whose file is gone (the parent retired the slot, or its build ended)
is dropped at the next task, and a worker that idles ``IDLE_DROP_SECONDS`` drops them all:
the parent removes its slots when its build ends, and a mapping would keep their pages (a
pool outlives a build in a notebook by a minute).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from h5etl.dataflow import EncodedChunk, EncodedRows
from h5etl.decode import worker_memory
from h5etl.format.destination import encoding_into

SHM = Path("/dev/shm")
# What a slot may hold (a result past it gets files of its own: ``shared_memory.share``), all
# of it an arena: the file is made this long at once (a tmpfs file's pages exist only once
# written).
SLOT_BYTES = 16 << 20


class Arena:
    """A lent slot, mapped in this worker; chunks are placed one after another from byte 0."""

    def __init__(self, name: str, mapped: mmap.mmap, inode: int):
        self.name = name
        self.inode = inode
        self.used = 0
        self._mapped = mapped
        self._view = memoryview(mapped)
        self._placed: dict[int, tuple[memoryview, int]] = {}  # id -> (view, offset)

    def reserve(self, nbytes: int) -> memoryview | None:
        """Room for ``nbytes`` at the end of what was placed, or None: the slot is full."""
        if self.used + nbytes > SLOT_BYTES:
            return None
        return self._view[self.used : self.used + nbytes]

    def commit(self, written: memoryview) -> None:
        """Keep ``written``, the start of the last room ``reserve`` gave, as a chunk's bytes."""
        self._placed[id(written)] = (written, self.used)
        self.used += len(written)

    def offset_of(self, data: object) -> int | None:
        """Where in the slot the chunk bytes ``data`` were placed; None: not placed here."""
        placed = self._placed.get(id(data))
        return placed[1] if placed is not None and placed[0] is data else None

    def starts_of(self, rows: EncodedRows) -> tuple[int, ...] | None:
        """Where each chunk of ``rows`` lies here, in order; None unless all do."""
        starts = []
        for block in rows.blocks:
            for chunk in block:
                start = self.offset_of(chunk.data)
                if start is None:
                    return None
                starts.append(start)
        return tuple(starts)

    def detach(self, rows: EncodedRows) -> None:
        """Give each chunk of ``rows`` that views this arena bytes of its own."""
        for block in rows.blocks:
            for index, chunk in enumerate(block):
                if self.offset_of(chunk.data) is not None:
                    data = bytes(chunk.data)
                    block[index] = EncodedChunk(chunk.offset, chunk.filter_mask, data, chunk.sha256)

    def clear(self) -> None:
        """Forget this task's chunks (the next task places from byte 0 again)."""
        self._placed.clear()
        self.used = 0


_ARENAS: dict[str, Arena] = {}  # this worker's mapped slots, by name
IDLE_DROP_SECONDS = 2.0  # a worker this long without a task forgets its mapped slots


_dropping = False  # a thread waits to drop them (``_drop_when_idle``)


def _drop_when_idle() -> None:
    """Forget every mapped slot (their pages go once no view of them is left) once this
    worker has run no task (``worker_memory.busy``) for ``IDLE_DROP_SECONDS``, on a thread;
    one such thread at a time."""
    global _dropping
    if _dropping:
        return
    _dropping = True

    def watch() -> None:
        global _dropping
        while worker_memory.idle_seconds() < IDLE_DROP_SECONDS:
            time.sleep(min(IDLE_DROP_SECONDS, 0.25))
        _ARENAS.clear()  # a task that took its arena meanwhile keeps it; it is mapped anew next
        _dropping = False

    threading.Thread(target=watch, name="h5etl-arena-idle", daemon=True).start()


def _inode(name: str) -> int | None:
    try:
        return os.stat(SHM / name).st_ino
    except OSError:
        return None


def _mapped(name: str) -> Arena | None:
    """The slot ``name`` mapped in this process (made ``SLOT_BYTES`` long), or None if it
    cannot be (the parent gave it up: the build stopped)."""
    for other, arena in list(_ARENAS.items()):  # the parent's files that are gone
        if _inode(other) != arena.inode:
            _ARENAS.pop(other, None)
    known = _ARENAS.get(name)
    if known is not None:
        return known
    try:
        fd = os.open(SHM / name, os.O_RDWR | os.O_CLOEXEC)  # never made here: the parent's
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if info.st_size < SLOT_BYTES:
            os.ftruncate(fd, SLOT_BYTES)
        mapped = mmap.mmap(fd, SLOT_BYTES, flags=mmap.MAP_SHARED)
    except OSError:
        return None
    finally:
        os.close(fd)
    arena = _ARENAS[name] = Arena(name, mapped, info.st_ino)
    return arena


@contextlib.contextmanager
def writing_into(slot: str | None) -> Iterator[Arena | None]:
    """Within (a task, inside ``worker_memory.busy``): the codecs place this thread's chunks
    in the lent ``slot`` (the arena given; None: no slot, no ``/dev/shm``, or the slot is
    gone, and chunks are bytes as ever)."""
    arena = _mapped(slot) if slot is not None and SHM.is_dir() else None
    if arena is None:
        yield None
        return
    arena.clear()
    try:
        with encoding_into(arena):
            yield arena
    finally:
        arena.clear()
        _drop_when_idle()
