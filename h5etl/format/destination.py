"""destination: where the chunks a thread encodes go, when not into fresh bytes objects.

A local worker compresses its task's chunks straight into the shared-memory slot its result
travels in (``h5etl.execute.arena``): ``encoding_into`` makes such a place this thread's
destination, and ``codec.encode_direct`` writes each chunk into a room ``current()`` reserves,
the chunk's bytes a view of it. Elsewhere (the parent's compress threads, Dask workers,
threads) there is none and chunks are bytes as ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol


class Destination(Protocol):
    """Rooms for encoded chunks: ``reserve`` one (None: no room left), ``commit`` the part
    written at its start as a chunk's bytes."""

    def reserve(self, nbytes: int) -> memoryview | None: ...
    def commit(self, written: memoryview) -> None: ...


_CURRENT: ContextVar[Destination | None] = ContextVar("h5etl_chunk_destination", default=None)


def current() -> Destination | None:
    """This thread's destination, or None: chunks are fresh bytes objects."""
    return _CURRENT.get()


@contextlib.contextmanager
def encoding_into(destination: Destination) -> Iterator[None]:
    """Within: this thread's blosc and lzf chunks go into rooms ``destination`` reserves
    (while it has room)."""
    token = _CURRENT.set(destination)
    try:
        yield
    finally:
        _CURRENT.reset(token)
