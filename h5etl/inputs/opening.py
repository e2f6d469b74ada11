"""opening: opening an input file without ever blocking, and naming what is wrong with it.

Discover, clean and the decoder all meet files that are not regular files (a FIFO blocks
whoever opens it), links that loop or point nowhere, and files that cannot be read; this
module words those rejects once.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from h5etl.errors import RejectError
from h5etl.inputs.urls import is_remote

NOT_FILES = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is when it is a folder, FIFO, socket or device, else None."""
    return next((name for test, name in NOT_FILES if test(mode)), None)


def link_problem(path: str, exc: OSError) -> RejectError | None:
    """The reject of a symbolic link that loops or points nowhere, else None."""
    if exc.errno == errno.ELOOP:
        return RejectError("symlink_loop", "symbolic link loop", path=path)
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return RejectError("dangling_symlink", "symbolic link points nowhere", path=path)
    return None


def _open_problem(path: str, exc: OSError) -> RejectError:
    linked = link_problem(path, exc)
    return linked or RejectError("unreadable", f"{type(exc).__name__}: {exc}", path=path)


def _open_regular(path: str) -> tuple[int, int]:
    """A descriptor of ``path`` opened for reading, and its size, if it is a regular file:
    opened without blocking and judged by what was opened (fstat). The caller closes it.

    Raises:
        RejectError: as ``opened``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _open_problem(path, exc) from exc
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise _open_problem(path, exc) from exc
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        what = kind_of(info.st_mode) or f"of mode {info.st_mode:o}"
        raise RejectError(
            "not_a_file",
            f"not a regular file but {what} (it changed after the folder was listed); "
            "only regular files are read",
            path=path,
        )
    return fd, info.st_size


@contextlib.contextmanager
def opened(path: str) -> Iterator[BinaryIO]:
    """``path`` opened for reading, if it is a regular file: never a wait.

    The file may have changed since the folder was listed: ``open()`` of a FIFO waits for a
    writer, forever. It is opened without blocking and judged by what was opened (fstat).

    Raises:
        RejectError: ``not_a_file`` for a FIFO, socket, device or folder; ``symlink_loop``,
            ``dangling_symlink`` or ``unreadable`` when it cannot be opened.
    """
    if is_remote(path):  # an object: its bytes as listed (kinds that stream)
        from h5etl.inputs import remote_files

        with io.BytesIO(remote_files.read_remote(path)) as remote:
            yield remote
        return
    fd, _ = _open_regular(path)
    try:
        handle = os.fdopen(fd, "rb")
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise _open_problem(path, exc) from exc
        raise
    with handle:
        yield handle


def read_file(path: str, stamp: str | None = None) -> bytes:
    """All bytes of the regular file ``path``, without ever blocking (see ``opened``); of the
    object ``path`` (a URL) as listed with ``stamp`` (``h5etl.inputs.remote_files``).

    Plain system calls, no file object: every decoded sample reads its files here, and the
    generator context and buffered reader around one ``read`` cost the workers about 10 us
    a file (0.6 CPU-s at 60,000 files).

    Raises:
        RejectError: ``not_a_file``, ``dangling_symlink``, ``symlink_loop`` or ``unreadable``;
            ``changed_during_build`` for an object replaced since it was listed.
    """
    if path[:1] != "/" and is_remote(path):
        from h5etl.inputs import remote_files  # only a build from object storage loads it

        return remote_files.read_remote(path, stamp)
    fd, size = _open_regular(path)
    try:
        parts, want = [], size + 1
        while part := os.read(fd, want):  # to the end, as the file is now (it may grow)
            parts.append(part)
            if len(part) < want:
                break  # a short read of a regular file is its end: no read of nothing after
            want = 1 << 16
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except OSError as exc:
        raise RejectError("unreadable", f"cannot read: {exc.strerror or exc}", path=path) from exc
    finally:
        os.close(fd)


def is_folder(entry: os.DirEntry[str]) -> bool:
    """Whether a scanned entry is a real folder (a symlinked folder is not walked: no loops);
    an entry that cannot be looked at is none, as in ``os.walk``."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def folder_stamp(path: str) -> str:
    """What identifies a folder entry's bytes without reading them: each non-hidden file's
    name, size and mtime (ns), by name (a resume must find the same files).

    Raises:
        OSError: the folder cannot be listed or is no folder.
    """
    parts = []
    with os.scandir(path) as scan:
        for entry in sorted(scan, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            info = entry.stat()
            parts.append(f"{entry.name}={info.st_size}:{info.st_mtime_ns}")
    return "[" + ";".join(parts) + "]"
