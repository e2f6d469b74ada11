"""lock: one build at a time per release name and output URL, through a lock object.

The lock is the object ``<output>/.<name>.lock``, created with ``If-None-Match: *``: of two
builds that create it at once, the store lets exactly one succeed. It names its holder (pid,
host, start, a token), like the local lock file (``h5etl.release.lock``), and the same rules
decide whether a lock found there is stale: a holder on this host whose pid is gone is dead,
and its lock is taken (deleted with ``If-Match`` on the ETag read, so only that lock goes, then
created anew); a holder on another host cannot be seen from here and counts as alive, and the
error says which object to delete if that build is gone. An object store has no ``flock`` that
dies with its holder, so a build killed on another host leaves its lock until it is deleted.
The holder deletes its lock with ``If-Match`` on its own ETag: never a lock it no longer holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import NoReturn

from h5etl.errors import LockHeld
from h5etl.processes import pid_alive
from h5etl.remote import s3
from h5etl.remote.errors import RemoteError
from h5etl.remote.location import Location

__all__ = ["RemoteLock", "lock_location"]

logger = logging.getLogger(__name__)


def lock_location(output: Location, name: str) -> Location:
    """The lock object of release ``name``: ``<output>/.<name>.lock``."""
    return output.child(f".{name}.lock")


class RemoteLock:
    """The build lock of release ``name`` in the object-storage folder ``output``."""

    def __init__(self, output: Location, name: str):
        self.location = lock_location(output, name)
        self.name = name

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the block; it is deleted at the end, however the block ends.

        Raises:
            LockHeld: a live build holds it (or one on another host, which may be dead).
        """
        etag = self._acquire()
        try:
            yield
        finally:
            try:
                s3.delete(self.location, if_match=etag)
            except s3.Precondition:
                logger.warning(
                    "%s: the lock was taken from this build; left as it is", self.location.url
                )
            except RemoteError as exc:  # never over the error that ended the block
                logger.warning(
                    "%s: cannot delete the lock (%s); the next build on this host takes it "
                    "as a dead build's",
                    self.location.url,
                    exc.message,
                )

    def _acquire(self) -> str:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex,
        }
        for _ in range(3):
            try:
                return s3.put(self.location, json.dumps(holder).encode(), if_none_match=True).etag
            except s3.Precondition:
                pass
            found = s3.get(self.location)
            if found is None:
                continue  # its holder finished meanwhile
            if self._alive(_holder(found[0])):
                self._raise_held(_holder(found[0]))
            # a dead holder's lock: delete exactly that one (If-Match), then try again
            with contextlib.suppress(s3.Precondition):
                s3.delete(self.location, if_match=found[1].etag)
            logger.warning(
                "%s: took the lock of a build that is gone (%s)",
                self.location.url,
                _holder(found[0]),
            )
        found = s3.get(self.location)
        self._raise_held(_holder(found[0]) if found else {})

    @staticmethod
    def _alive(holder: dict[str, object]) -> bool:
        """Whether the holder named by the lock may still run (see the module docstring)."""
        pid = holder.get("pid")
        if holder.get("host") != socket.gethostname():
            return True  # its pid means nothing here
        return not isinstance(pid, int) or pid == os.getpid() or pid_alive(pid)

    def _raise_held(self, holder: dict[str, object]) -> NoReturn:
        raise LockHeld(
            f"another build of {self.name!r} is running (pid {holder.get('pid')} on "
            f"{holder.get('host')}, started {holder.get('started')}); wait for it, or delete "
            f"the lock object if that process is gone",
            path=self.location.url,
        )


def _holder(data: bytes) -> dict[str, object]:
    try:
        found = json.loads(data)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
