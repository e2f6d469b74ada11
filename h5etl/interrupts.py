"""interrupts: a Ctrl-C that Python swallowed still stops the build before it publishes.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be; when that is a
weakref callback or a finaliser run by the garbage collector, the exception is printed as
"Exception ignored" and lost, and the build went on to publish (seen once in ~25 loaded
runs of the SIGINT test). ``catching`` installs a handler that also records the request;
the build calls ``check`` after each result and before it publishes, which raises it again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_requested = False


def _handler(signum: int, frame: FrameType | None) -> None:
    global _requested
    _requested = True
    raise KeyboardInterrupt


@contextmanager
def catching() -> Iterator[None]:
    """Around a build in the main thread: SIGINT is recorded as well as raised."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _requested = False
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested = False


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C came (whether or not it was raised)."""
    if _requested:
        raise KeyboardInterrupt
