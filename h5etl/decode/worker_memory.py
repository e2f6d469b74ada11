"""worker_memory: how a decode worker holds and gives back memory around its tasks.

A big result (a CT case) trims the worker's heap once it is sent and freed, but only when the
worker idles (``busy``, ``_give_back_memory``); the garbage collector's young generation runs
rarely while results arrive (``collecting_less``); and a pool's workers hand big results to
the pool one at a time (``send_one_at_a_time``), so a single pickled copy is in flight.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator

from h5etl.dataflow import BatchResult, array_nbytes
from h5etl.decode import memory

BIG_RESULT = 32 * 2**20  # compressed bytes of a result past which its worker trims its heap


result_nbytes = array_nbytes  # (the window and the send lock size results by it)


def trim_when_gone(result: BatchResult) -> None:
    """Trim this process's heap once ``result`` is freed, if it carries a big case."""
    if result_nbytes(result) > BIG_RESULT:
        weakref.finalize(result, _give_back_memory)


YOUNG_COLLECTION_EVERY = 50_000  # allocations, against Python's default of 700


@contextlib.contextmanager
def collecting_less() -> Iterator[None]:
    """Collect the young generation of Python's garbage collector rarely while results
    arrive. A CT case comes back as thousands of chunk objects (none in a reference
    cycle), and each young collection scanned the ones that had arrived again: 0.3 of the
    writer's 1.3 CPU-s on 8 cases of 200 slices (py-spy). The thresholds come back after."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], YOUNG_COLLECTION_EVERY), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


SEND_WAIT_SECONDS = 60.0  # past this, a big result is sent anyway: a wait, never a hang


def send_lock_path(parent: int) -> str:
    """The file whose lock is the turn to send of the pool process ``parent`` runs (which
    removes it when its tasks are done)."""
    return os.path.join(tempfile.gettempdir(), f"h5etl-send-{parent}.lock")


def send_one_at_a_time(result: BatchResult) -> None:
    """Before a worker hands a big result (a CT case) to the pool to send, wait until no
    other worker of this pool is sending one; the turn passes once this result is freed,
    that is sent.

    The pool pickles a result whole and only then waits for its turn at the pipe, so two
    workers finishing cases together held two pickled copies beside their cases while the
    writer received a third (2 x 115 MiB a worker for a 500-slice case). Waiting before the
    copy is made keeps one copy in flight; the sends were one at a time anyway. The turn
    is an advisory lock on a file named after the pool's parent process; a worker that dies
    releases it with its descriptors.
    """
    if result_nbytes(result) <= BIG_RESULT:
        return
    import fcntl

    try:
        fd = os.open(send_lock_path(os.getppid()), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return  # no turn to take: send as the pool would
    deadline = time.monotonic() + SEND_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return
            time.sleep(0.005)
    weakref.finalize(result, os.close, fd)  # closing the descriptor passes the turn on


TRIM_IDLE_SECONDS = 0.2  # a worker this long without a task is idle: its heap is trimmed


class _Activity:
    """Whether this worker runs a task (``busy``), and since when it has not."""

    running = 0
    since = time.monotonic()
    trim_pending = False


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Around a task in a pooled worker (its decode and its hand-over to shared memory):
    no heap trim meanwhile (``_give_back_memory``)."""
    _Activity.running += 1
    try:
        yield
    finally:
        _Activity.running -= 1
        _Activity.since = time.monotonic()


def idle_seconds() -> float:
    """How long this worker has run no task (``busy``): 0.0 while it runs one."""
    return 0.0 if _Activity.running else time.monotonic() - _Activity.since


def _give_back_memory() -> None:
    """Trim the heap once the worker idles (no task for ``TRIM_IDLE_SECONDS``): a
    finalizer runs as the result starts being freed (its chunks still alive), so the trim
    waits on a thread. Not between two tasks: the next case reuses the heap the last one
    grew, and after a trim its first touch of every page was a fault again (0.07 CPU-s of
    a 200-slice case's 0.6, which the work limit never paid)."""
    _Activity.since = time.monotonic()
    if _Activity.trim_pending:
        return  # a trim waits for the idle time already
    _Activity.trim_pending = True

    def trim() -> None:
        while True:
            time.sleep(TRIM_IDLE_SECONDS)
            if idle_seconds() >= TRIM_IDLE_SECONDS:
                break
        _Activity.trim_pending = False
        memory.release_free_memory()

    threading.Thread(target=trim, name="h5etl-trim", daemon=True).start()
