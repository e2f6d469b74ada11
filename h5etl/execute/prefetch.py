"""prefetch: pull an iterator in a thread, a few items ahead of its consumer.

An incremental build copies its parent's chunks first (the writer's work, seconds for a large
release) and decodes what changed after; the decode results come from the worker pool (or a
Dask cluster) through ``schedule.in_order``, which submits tasks only as it is pulled.
``Ahead`` pulls it from a thread while the writer copies, so the workers decode meanwhile and
their results wait, at most ``depth`` of them besides the decoder's own window (memory stays
bounded). Items come out in order; an exception in the thread comes out of ``__next__``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_SECONDS = 0.05  # how often a blocked thread looks whether the consumer gave up
JOIN_SECONDS = 5.0  # a thread inside a long task (a CT case) is left to finish on its own


class _End:
    """The source is exhausted, or failed with ``error``."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


class Ahead(Generic[T]):
    """Iterate ``source`` in a daemon thread, up to ``depth`` items ahead; a context manager
    (its exit stops the thread and closes ``source`` there, cancelling what it submitted)."""

    def __init__(
        self, source: Iterator[T], depth: int = 2, *, start: threading.Event | None = None
    ):
        """``start``: the thread pulls nothing before it is set (or the consumer gives up)."""
        self._source = source
        self._start = start
        self._items: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._pull, name="h5etl-ahead", daemon=True)
        self._thread.start()

    def _put(self, item: T | _End) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _pull(self) -> None:
        try:
            while self._start is not None and not self._start.wait(_POLL_SECONDS):
                if self._stop.is_set():
                    return
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_End())
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(_End(exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Ahead[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if isinstance(item, _End):
            self._done = True
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop pulling: the thread closes the source (pending tasks are cancelled)."""
        self._stop.set()
        self._thread.join(JOIN_SECONDS)

    def __enter__(self) -> Ahead[T]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
