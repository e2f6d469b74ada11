"""Reading ahead in threads, and the gate that makes reads and a fork wait for each other.

``prefetched`` runs reads ahead of the consumer on a small thread pool; ``ForkGate`` lets a
fork wait for the reads in flight (see ``_fork``). No file state lives here.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np


def prefetched(
    read: Callable[[np.ndarray], dict[str, np.ndarray]], batches: Iterable[np.ndarray], depth: int
) -> Generator[dict[str, np.ndarray], None, None]:
    """``read(batch)`` for each batch, in order, with ``depth`` reads running ahead in threads.

    Memory stays bounded (``depth`` batches in flight plus the one yielded); the pool is shut
    down, queued reads cancelled and running ones awaited, when the generator finishes, is
    closed or is garbage collected.
    """
    owner = os.getpid()
    todo = iter(batches)
    pool = ThreadPoolExecutor(min(depth, os.cpu_count() or 1), thread_name_prefix="h5etl-prefetch")
    try:
        pending: deque[Future[dict[str, np.ndarray]]] = deque(
            pool.submit(read, batch) for batch in itertools.islice(todo, depth)
        )
        while pending:
            if os.getpid() != owner:  # the threads filling ``pending`` stayed in the parent
                raise RuntimeError("a prefetching iterator cannot be resumed in a forked child")
            batch = pending.popleft().result()  # a reading error surfaces here, in order
            pending.extend(pool.submit(read, b) for b in itertools.islice(todo, 1))
            yield batch
    finally:
        pool.shutdown(wait=os.getpid() == owner, cancel_futures=True)


class ForkGate:
    """Reads share the gate; a fork waits for the running ones and holds new ones back.

    Handles are closed before a fork (see ``_core``); that is only safe when no other
    thread (a prefetching one, say) is reading through them, and none reopens one between
    the close and the fork. Never taken inside the decode pool, which a fork also waits for.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._forking = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Before a fork: wait until no read runs, and let none start."""
        with self._cond:
            self._forking = True
            while self._readers:
                self._cond.wait()

    def open(self) -> None:
        """After the fork, in the parent: let reads run again."""
        with self._cond:
            self._forking = False
            self._cond.notify_all()
