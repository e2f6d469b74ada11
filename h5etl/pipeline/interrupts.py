"""interrupts: a Ctrl-C that Python swallowed still stops the build before it publishes.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be; when that is a
weakref callback or a finaliser run by the garbage collector, the exception is printed as
"Exception ignored" and lost, and the build went on to publish (seen once in ~25 loaded
runs of the SIGINT test). ``catching`` installs a handler that also records the request;
the build calls ``check`` after each result and before it publishes, which raises it again.
Meanwhile the lost exception's traceback is not printed: the one line a Ctrl-C gets is the
CLI's "interrupted; nothing was published". A Ctrl-C that lands in a C extension's callback can
come out as another error (h5py's lock turned it into ``SystemError`` while iterating
attributes): once one came, whatever ends the build is the interrupt.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

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
    hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        if not (_requested and isinstance(info.exc_value, KeyboardInterrupt)):
            hook(info)  # only the Ctrl-C ``check`` raises again goes unprinted

    sys.unraisablehook = unraisable
    try:
        yield
    except Exception as exc:
        if _requested:  # the Ctrl-C came out as another error: h5py's lock raised SystemError
            raise KeyboardInterrupt from exc
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
        _requested = False


def requested() -> bool:
    """Whether a Ctrl-C came during this build (whatever error it came out as)."""
    return _requested


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C came (whether or not it was raised)."""
    if _requested:
        raise KeyboardInterrupt
