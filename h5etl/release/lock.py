"""lock: one build at a time per release name and output folder.

The lock is an exclusive ``flock`` on ``.<name>.lock``, which the kernel drops when its holder
dies, so a lock left by a dead build is simply taken. The file also names its holder (pid,
host, start) for the error a second build prints; where the file system has no ``flock``
(NFS mounted nolock), the pid it names decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from h5etl.errors import LockHeld, ReleaseError, io_problem
from h5etl.processes import pid_alive

logger = logging.getLogger(__name__)


class BuildLock:
    """The lock file ``path`` of the release ``name``."""

    def __init__(self, path: Path, name: str):
        self.path = path
        self.name = name

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the build lock: an exclusive ``flock`` on the lock file, which the kernel
        drops when its holder dies, so a lock left by a dead build is simply taken.

        The file also names its holder (pid, host, start) for the error a second build
        prints. A holder the lock cannot see (an h5etl without ``flock``, or another host on
        a file system that does not share locks) still counts while its pid lives.
        """
        fd = self._acquire()
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # before the unlock: no one may lock this inode
            os.close(fd)

    def _acquire(self) -> int:
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
                created = True
            except FileExistsError:
                try:
                    fd = os.open(self.path, os.O_RDWR)
                except FileNotFoundError:
                    continue  # its holder finished meanwhile
                created = False
            locked = self._flock(fd)
            if not self._still_named(fd):  # its holder finished and removed it meanwhile
                os.close(fd)
                continue
            if not created and self._held_without_flock(trust_flock=locked):
                os.close(fd)
                self._raise_held()
            if not created and not locked:
                # No flock on this file system (NFS mounted nolock): take a dead holder's
                # lock as before flock, by removing it and creating it anew.
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                continue
            holder = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "flock": locked,  # if so, its holder is alive exactly while the flock is held
            }
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(holder).encode(), 0)
            except OSError as exc:  # a full disk: this is the build's first write
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                raise ReleaseError(
                    f"cannot write the lock file: {io_problem(exc)}", path=self.path
                ) from exc
            return fd
        self._raise_held()

    def _flock(self, fd: int) -> bool:
        """Take the flock on ``fd``; False where the file system has none."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._raise_held()
        except OSError as exc:
            logger.warning(
                "%s: the file system offers no flock (%s); the lock relies on the pid it names",
                self.path,
                exc.strerror or exc,
            )
            return False
        return True

    def _still_named(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _read_lock(self) -> dict[str, object]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _held_without_flock(self, *, trust_flock: bool) -> bool:
        """Whether the file names a live holder that the flock does not speak for.

        With ``trust_flock`` (we hold the flock), a holder that used flock is dead, whatever
        its pid now names (pids are reused) or whichever host it ran on; a holder without
        flock (an older h5etl, a file system without it) is judged by its pid on this host.
        """
        holder = self._read_lock()
        pid = holder.get("pid")
        if not holder or pid == os.getpid() or (trust_flock and holder.get("flock") is True):
            return False
        if holder.get("host") != socket.gethostname():
            return True  # its pid means nothing here
        return isinstance(pid, int) and pid_alive(pid)

    def _raise_held(self) -> NoReturn:
        holder = self._read_lock()
        raise LockHeld(
            f"another build of {self.name!r} is running (pid {holder.get('pid')} on "
            f"{holder.get('host')}, started {holder.get('started')}); wait for it, or delete "
            f"the lock file if that process is gone",
            path=self.path,
        )
