"""collection: pauses of Python's automatic garbage collection, counted, for the process.

Two parts of h5etl pause it: the CLI while a build starts (``h5etl.cli.early``: its imports,
config and plan make objects that live as long as the command, which the collector walked
over and over), and a remote range read while it waits (``h5etl.remote.reading``: a
collection on fsspec's thread that frees an h5py object would wait for the lock h5py holds
around the read, for ever). Each holds a pause; collection comes back when the last is
released, and only if it was on before the first. One counter for both: a read that began
during the CLI's pause would otherwise have turned collection back on behind it, or off
again after it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()
_holds = 0  # pauses held now
_was_enabled = True  # collection's state when the first of them began


def hold() -> None:
    """Pause automatic collection (in every thread) until ``release``."""
    global _holds, _was_enabled
    with _LOCK:
        if _holds == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holds += 1


def release() -> None:
    """End one pause; collection resumes with the last, if it was on before the first."""
    global _holds
    with _LOCK:
        _holds -= 1
        if _holds == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection while the block runs."""
    hold()
    try:
        yield
    finally:
        release()
