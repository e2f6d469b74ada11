"""Every error h5etl raises on purpose, as one tree.

::

    H5EtlError                      base; carries ``path`` and ``key``; exit code 1
    ├── ConfigError                 the config or the command line is wrong; exit code 2
    ├── UsageError                  the command names something that is not there or
    │                               cannot be used; exit code 2
    ├── RejectError                 one input cannot go into the release; has a ``reason`` code
    ├── BuildFailed                 the work stopped (``on_error: fail``, too many rejects)
    ├── SinkError                   writing the HDF5 file failed (also OSError)
    │   └── ResumeMismatch          a killed build's temp file does not hold what its
    │                               journal recorded (the build starts afresh)
    ├── ReleaseError                naming, linking or rolling back releases failed
    │   ├── LockHeld                another build holds the output folder
    │   └── ReleaseUsageError       (also UsageError) no such folder, not a link, no such
    │                               version to roll back to; exit code 2
    ├── ClusterError                the Dask cluster cannot run the build (no scheduler at
    │   │                           the address, no workers, a worker that sees the sources
    │   │                           otherwise or cannot run h5etl)
    │   └── ClusterLost             the scheduler was lost mid-build; the temp file and its
    │                               journal stay for ``--resume``
    ├── ShardError                  a shard of a sharded build does not hold what the plan
    │                               gave it (missing or extra rows, a chunk whose bytes changed)
    ├── CheckFailed                 ``h5etl check`` found a damaged release
    ├── KindDefinitionError         (also TypeError) a kind's entry or class lacks a required
    │                               hook (a plugin's is reported when a config names it)
    └── ReaderError                 a release cannot be read as asked (not HDF5, no such
                                    split or field); exit code 2

The CLI turns any of these into one line and an exit code; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from pathlib import Path

from h5etl import docrefs


class H5EtlError(Exception):
    """Base of every error h5etl raises on purpose.

    ``docs``: the reference section that explains this error (``h5etl.docrefs``), named once
    at the end of the message.
    """

    exit_code = 1
    resumable = False  # the build's temp file and journal stay for --resume (a lost cluster)

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        key: str | None = None,
        docs: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.path = path
        self.key = key
        self.docs = docs

    def __str__(self) -> str:
        where = [str(self.path)] if self.path is not None else []
        if self.key:
            where.append(self.key)
        return ": ".join([*where, self.message]) + self.see()

    def see(self) -> str:
        """`` (see <docs>)``, or nothing: what ends the message's last line."""
        return f" (see {self.docs})" if self.docs else ""


class ConfigError(H5EtlError):
    """The config file (or a command-line value) breaks a rule; nothing was built.

    ``topic``: the config key whose reference section explains the problem (default: ``key``);
    the message ends by naming that section once, after the last problem.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        key: str | None = None,
        problems: list[str] | None = None,
        topic: str | None = None,
    ):
        super().__init__(message, path=path, key=key)
        self.problems = problems or [H5EtlError.__str__(self)]  # __str__ reads problems
        self.docs = docrefs.config_key(topic or key)

    def __str__(self) -> str:
        if len(self.problems) > 1:
            return "\n".join(self.problems) + self.see()
        return super().__str__()


class UsageError(H5EtlError):
    """The command line names something that is not there or cannot be used; nothing was done."""

    exit_code = 2


class RejectError(H5EtlError):
    """One input cannot go into the release; ``reason`` is a stable code for reports."""

    def __init__(self, reason: str, message: str, *, path: Path | str | None = None):
        super().__init__(message, path=path)
        self.reason = reason


class BuildFailed(H5EtlError):
    """The build stopped on bad data; no release was published.

    ``rejects`` holds the per-file rejects found so far (``h5etl.dataflow.Reject``), for the
    CLI to show; a failed build also writes them to ``report`` when it has one.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        key: str | None = None,
        rejects: Sequence[object] = (),
        report: Path | None = None,
        docs: str | None = None,
    ):
        super().__init__(message, path=path, key=key, docs=docs)
        self.rejects = list(rejects)
        self.report = report


class SinkError(H5EtlError, OSError):
    """Writing the HDF5 file failed (disk full, I/O error)."""


class ResumeMismatch(SinkError):
    """A killed build's temp file does not hold what its journal recorded."""


class ReleaseError(H5EtlError):
    """Naming, publishing or rolling back a release failed."""


class LockHeld(ReleaseError):
    """Another live build holds the lock on the output folder."""

    exit_code = 1


class ReleaseUsageError(ReleaseError, UsageError):
    """The command names a release folder, link or version that is not there."""

    exit_code = 2


class ClusterError(H5EtlError):
    """The Dask cluster cannot run the build; nothing was published.

    Raised in workers too (a source a worker cannot see), so it pickles by its message alone.
    """


class SchedulerUnreachable(ClusterError):
    """No connection could be made to the Dask scheduler. A shard writer's, after another
    shard of the build had connected, means the scheduler was lost mid-build."""


class ClusterLost(ClusterError):
    """The connection to the Dask scheduler was lost mid-build; nothing was published.

    ``resumable``: the build's temp file and journal stay, so ``--resume`` continues from
    the last checkpoint, as after a kill; ``kept`` says which (before the first checkpoint
    there is nothing to continue).
    """

    resumable = True

    def kept(self, checkpoint: bool) -> None:
        """End the message with what ``--resume`` can do: the release folder knows whether
        a checkpoint stayed."""
        self.message += (
            ": --resume continues from the last checkpoint"
            if checkpoint
            else " (no checkpoint had been written yet: the next build starts from the start)"
        )


class ShardError(H5EtlError):
    """A shard of a sharded build does not hold what the plan gave it; nothing was published."""


class CheckFailed(H5EtlError):
    """A release failed its integrity check."""


_NO_ROOM_HINTS = {
    errno.ENOSPC: "free some space on that disk and build again",
    errno.EDQUOT: "free some space or raise the disk quota, and build again",
    errno.EFBIG: "the file system or `ulimit -f` caps the file size; write the release elsewhere",
}
_ERRNO_IN_TEXT = re.compile(r"errno = (\d+)")  # how HDF5 quotes the errno in its messages


def io_problem(exc: BaseException, detail: str = "") -> str:
    """One line for a failed write of a build's files: what the errno says (and ``detail``)
    and, when the disk is full, what to do. HDF5's own messages span lines and name buffers
    and offsets, so only the errno they quote is kept."""
    code = getattr(exc, "errno", None)
    if not code:
        found = _ERRNO_IN_TEXT.search(str(exc))
        code = int(found[1]) if found else None
    if not code:
        return " ".join(str(exc).split())
    text = os.strerror(code)
    text = text[:1].lower() + text[1:] + (f" ({detail})" if detail else "")
    return f"{text}; {_NO_ROOM_HINTS[code]}" if code in _NO_ROOM_HINTS else text


class KindDefinitionError(H5EtlError, TypeError):
    """A kind's registry entry or behaviour class breaks the kind contract (no ``kind`` name,
    no column, no decode): raised when the entry is made, naming the class and the hook."""


class ReaderError(H5EtlError):
    """A release cannot be read as asked (not HDF5, missing split or field, unequal lengths)."""

    exit_code = 2
