"""disk: the sink's side of the disk: room before a write, durable bytes handed back,
a parent's bytes asked for ahead of its copy.

Part of the sink: no HDF5 here, plain file system calls, so ``sync_and_drop`` may run in
the checkpoint thread beside the writer.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import resource
import sys
import threading
from pathlib import Path
from typing import Any

from h5etl.dataflow import BatchResult, array_nbytes

# Room kept free for the metadata HDF5 writes at a flush or at the close: a flush that fails
# leaves HDF5 unable to close the file at all, so the sink stops before the disk is full.
HEADROOM_BYTES = 1 << 20
# Of what a sync made durable, the page cache keeps only the file's last this many bytes.
# Written pages otherwise stay cached until memory runs short, and on a VM every page the
# cache takes fresh costs a fault in the hypervisor: past ~400 MB written, the kernel's
# share of each write grew tenfold (1.76 GB: 3.5 CPU-s against 0.65 s with the cache
# handed back every 2 s). Dropping clean pages also keeps a big build from pushing the
# training job's data out of the cache.
CACHE_KEEP_BYTES = 128 << 20
# Written bytes past which the sink has the kernel start writing them to disk, without
# waiting (``start_writeback``): else the fsync that publishes a release waited for every
# byte since the last checkpoint (0.18 s of a 4 s volume build, both cores idle).
WRITEBACK_BYTES = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start write-out of the range's dirty pages


def batch_nbytes(result: BatchResult) -> int:
    """An upper bound of the bytes a result adds to the file (its chunks as they come, its
    raw rows uncompressed, texts at 4 bytes a character)."""
    texts = sum(
        4 * len(text) + 16
        for rows in result.columns.values()
        if isinstance(rows, list)
        for text in rows
    )
    return array_nbytes(result) + texts + sum(64 * len(row) for row in result.lineage)


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def no_room(path: Path, nbytes: int) -> tuple[OSError, str] | None:
    """Why ``nbytes`` more (and ``HEADROOM_BYTES``) would not fit in the file at ``path``
    (a full disk, a file size limit), as the error and its detail; None when they fit or
    when the file system cannot say (the write itself will)."""
    need = nbytes + HEADROOM_BYTES
    try:
        stat = os.statvfs(path.parent)
        size = os.path.getsize(path)
    except OSError:
        return None
    # root may use the blocks ext4 reserves; everyone else only the available ones
    free = (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if free < need:
        code, detail = errno.ENOSPC, f"{mib(free)} free, about {mib(need)} needed"
    elif limit != resource.RLIM_INFINITY and size + need > limit:
        code, detail = errno.EFBIG, f"the limit is {mib(limit)}"
    else:
        return None
    return OSError(code, os.strerror(code)), detail


def start_writeback(path: Path, start: int) -> int:
    """Have the kernel start writing the file's bytes from ``start`` to its end to disk,
    without waiting for them (Linux ``sync_file_range``; elsewhere nothing); returns the
    end, where the next call starts. Advice only: any error is ignored."""
    if not sys.platform.startswith("linux"):
        return start
    with contextlib.suppress(OSError, AttributeError), open(path, "rb") as handle:
        end = os.fstat(handle.fileno()).st_size
        if end > start:
            _sync_file_range()(handle.fileno(), start, end - start, _SYNC_FILE_RANGE_WRITE)
        return end
    return start


@functools.cache
def _sync_file_range() -> Any:
    """libc's ``sync_file_range``, looked up once (a build calls it every 16 MiB written).

    Raises:
        AttributeError: the C library has none.
    """
    call = ctypes.CDLL(None, use_errno=True).sync_file_range
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return call


class Writeback:
    """Starts the kernel writing a file's new bytes to disk every ``WRITEBACK_BYTES``
    written, in a thread (submitting the writes can block for tens of milliseconds, which
    the writer, between two results, need not wait for).

    One thread serves the whole file, woken when a writeback is due: a thread started for
    each (12 for 3,000 pairs, 115 for 30,000) held the writer 2-3 ms each in ``start``,
    waiting for the new thread to be scheduled."""

    def __init__(self, path: Path):
        self.path = path
        self.start = 0  # where the last writeback ended
        self.pending = 0  # bytes written since it began
        self._thread: threading.Thread | None = None
        self._woken = threading.Event()
        self._idle = threading.Event()  # no writeback asked for or running
        self._idle.set()
        self._closing = False

    def note(self, nbytes: int) -> None:
        """``nbytes`` more were written; start a writeback if due and none is running."""
        self.pending += nbytes
        if self.pending < WRITEBACK_BYTES or not self._idle.is_set():
            return
        self.pending = 0
        self._idle.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="h5etl-writeback", daemon=True)
            self._thread.start()
        self._woken.set()

    def _serve(self) -> None:
        while True:
            self._woken.wait()
            self._woken.clear()
            if not self._idle.is_set():
                self.start = start_writeback(self.path, self.start)
                self._idle.set()
            if self._closing:
                return

    def wait(self) -> None:
        """Wait for a writeback asked for to end."""
        self._idle.wait()

    def close(self) -> None:
        """Wait for a running writeback, and end the thread."""
        if self._thread is not None:
            self._closing = True
            self._woken.set()
            self._thread.join()
            self._thread = None


def sync_and_drop(path: Path) -> None:
    """fsync the file, then let the page cache drop what is durable but its last
    ``CACHE_KEEP_BYTES`` (advice only: the file is the same byte for byte).

    Raises:
        OSError: the file cannot be opened or synced.
    """
    with open(path, "rb") as handle:
        durable = os.fstat(handle.fileno()).st_size  # every byte below: written
        os.fsync(handle.fileno())
        if durable > CACHE_KEEP_BYTES and hasattr(os, "posix_fadvise"):
            length = durable - CACHE_KEEP_BYTES
            os.posix_fadvise(handle.fileno(), 0, length, os.POSIX_FADV_DONTNEED)


def prefetch(path: Path) -> None:
    """Ask the kernel to read ``path`` into the page cache, from a daemon thread (advice
    only: nothing waits for it, a failure changes nothing). An incremental build copies most
    of its parent, whose writer handed all but its last ``CACHE_KEEP_BYTES`` back: the copy
    of 1.75 GB read them from the disk as it went (2.0 s of its 3.5), where the disk can
    stream them while the build plans."""

    def advise() -> None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    if hasattr(os, "posix_fadvise"):
        threading.Thread(target=advise, name="h5etl-prefetch", daemon=True).start()
