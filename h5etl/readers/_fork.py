"""Fork safety of the readers: the open readers, the open lock and the gate a fork waits for.

Before this process forks, every open ``Release`` closes its handles (after reads in other
threads finish), so a child never inherits an open HDF5 file; the child gets a fresh lock.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from h5etl.readers._ahead import ForkGate


class Closable(Protocol):
    """An open reader (``_core.Release`` is one): what a fork needs of it. A protocol, so this
    module does not import ``_core``, which imports it."""

    def _close_handles(self) -> None: ...


# Handles inherited through fork: never used nor closed in the child (closing would drop the
# parent's file lock on the shared descriptor), only kept alive so no destructor runs here.
_INHERITED: list[Any] = []
# Every Release holding an open handle; closed just before this process forks (see below).
_OPEN: weakref.WeakSet[Closable] = weakref.WeakSet()


_LOCK = threading.Lock()  # two threads' first reads must not both open the file
_GATE = ForkGate()  # reads in other threads (prefetching) finish before handles close


def _fresh_lock_in_child() -> None:
    global _LOCK, _GATE
    _LOCK = threading.Lock()  # a fork may copy it held by a thread that does not exist here
    _GATE = ForkGate()


def _close_before_fork() -> None:
    """Close this process's handles so a forked child never inherits an open HDF5 file.

    HDF5 would otherwise find the file "already open" in the child's copy of the library and
    share the parent's state with it. The parent reopens lazily on its next read.
    """
    _GATE.close()
    for release in list(_OPEN):
        release._close_handles()  # the decoded chunks stay: the parent reads on after the fork


def _reopen_gate_in_parent() -> None:
    _GATE.open()


os.register_at_fork(
    before=_close_before_fork,
    after_in_parent=_reopen_gate_in_parent,
    after_in_child=_fresh_lock_in_child,
)


F = TypeVar("F", bound=Callable[..., Any])


def _gated(method: F) -> F:
    """Run ``method`` as a read that a fork waits for (the gate is looked up per call)."""

    @functools.wraps(method)
    def gated(*args: Any, **kwargs: Any) -> Any:
        with _GATE.reading():
            return method(*args, **kwargs)

    return cast(F, gated)
