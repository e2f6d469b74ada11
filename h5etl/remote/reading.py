"""reading: one pinned object as a read-only, seekable file (what h5py opens for a reader).

``RemoteFile(obj)`` reads ``obj`` (a listed or resolved ``RemoteObject``) in blocks, each one
range read that names the object's version or carries its ETag (``read_bytes``), so the file
never mixes the bytes of two uploads: a replaced or deleted object fails the next read with
``RemoteChanged``. The last ``max_blocks`` blocks stay in memory (least recently used out), so
HDF5's many small metadata reads near each other cost one request; with a ``DiskCache`` and the
``key`` that names the object's bytes (a release's SHA-256), blocks are also kept on disk for
later readers and other processes. ``pread`` reads at an offset without moving the position and
is safe from several threads at once (the readers decode chunks in threads while h5py reads
through ``readinto``). A request the server fails (unreachable, stopped mid-read) is sent again
after a growing pause, ``attempts`` times in all, then fails with ``RemoteReadFailed`` naming
the URL. It pickles as the object, its sizes and its cache, never its blocks: each DataLoader
worker that unpickles one reads on its own.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from h5etl import collection
from h5etl.remote.cache import DiskCache
from h5etl.remote.errors import RemoteChanged, RemoteError, RemoteReadFailed, RemoteUsageError
from h5etl.remote.objects import RemoteObject, read_bytes

__all__ = ["DEFAULT_ATTEMPTS", "DEFAULT_BLOCK_SIZE", "RemoteFile"]

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 4 * 2**20  # a request's round trip (~10-50 ms) is worth ~4 MiB on a LAN
DEFAULT_ATTEMPTS = 5  # pauses of 0.25, 0.5, 1 and 2 s between them: ~4 s beyond the requests'
FIRST_PAUSE_S = 0.25


class RemoteFile(io.RawIOBase):
    """The object ``obj`` as a read-only binary file, read in blocks of ``block_size`` bytes
    of which the last ``max_blocks`` are kept in memory, and every block in ``cache`` (under
    ``key``) when given."""

    def __init__(
        self,
        obj: RemoteObject,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_blocks: int = 16,
        cache: DiskCache | None = None,
        key: str | None = None,
        attempts: int | None = None,
    ):
        super().__init__()
        attempts = DEFAULT_ATTEMPTS if attempts is None else attempts
        if block_size < 1 or max_blocks < 1 or attempts < 1:
            raise ValueError(
                f"block_size, max_blocks and attempts must be >= 1: "
                f"{block_size}, {max_blocks}, {attempts}"
            )
        if cache is not None and not key:
            raise ValueError("a disk cache needs the key that names the object's bytes")
        self.obj = obj
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.cache = cache
        self.key = key
        self.attempts = attempts
        self.requests = 0  # range reads sent (retries included): what a reader's layout costs
        self._position = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.obj, self.block_size, self.max_blocks, self.cache, self.key))

    def __repr__(self) -> str:
        return f"RemoteFile({self.obj.url!r}, size={self.obj.size})"

    @property
    def name(self) -> str:
        return self.obj.url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.obj.size}
        if whence not in base:
            raise ValueError(f"invalid whence: {whence}")
        position = base[whence] + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = self._read_at(self._position, view)
        self._position += done
        return done

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer at the end), the position left as it is."""
        out = bytearray(max(0, min(size, self.obj.size - offset)))
        self._read_at(offset, memoryview(out))
        return bytes(out)

    def _read_at(self, offset: int, view: memoryview) -> int:
        wanted = min(len(view), max(self.obj.size - offset, 0))
        done = 0
        while done < wanted:
            index, skip = divmod(offset + done, self.block_size)
            block = self._block(index)
            piece = block[skip : skip + wanted - done]
            view[done : done + len(piece)] = piece
            done += len(piece)
        return done

    def _block(self, index: int) -> bytes:
        with self._lock:
            block = self._blocks.get(index)
            if block is not None:
                self._blocks.move_to_end(index)
                return block
        start = index * self.block_size
        length = min(self.block_size, self.obj.size - start)
        cached = (
            self.cache.get(self.key or "", self.block_size, index, length) if self.cache else None
        )
        block = cached if cached is not None else self._fetch(start, start + length)
        if cached is None and self.cache is not None:
            self.cache.put(self.key or "", self.block_size, index, block)
        with self._lock:  # two threads may fetch one block: the same bytes, kept once
            self._blocks[index] = block
            self._blocks.move_to_end(index)
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)
        return block

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` from the server, sent again after a pause when it fails."""
        pause = FIRST_PAUSE_S
        for attempt in range(1, self.attempts + 1):
            self.requests += 1
            try:
                # No automatic garbage collection, in any thread, while the request waits:
                # h5py calls ``readinto`` holding its global lock, and the request waits for
                # fsspec's event loop thread. A collection there that frees an h5py object of
                # some reference cycle (a file a test or a notebook left behind) takes that
                # lock to close it: each thread then waited for the other, for ever (a reader
                # test hung so, twice). Collection resumes once nothing holds it paused.
                with collection.paused():
                    return read_bytes(self.obj, start, end)
            except RemoteChanged as exc:
                raise RemoteChanged(
                    "the file changed while it was read (replaced or deleted, by prune?); "
                    "nothing more is read from it: open the release again",
                    path=self.obj.url,
                ) from exc
            except RemoteUsageError:
                raise  # refused credentials, a deleted bucket: asking again changes nothing
            except RemoteError as exc:
                if attempt == self.attempts:
                    raise RemoteReadFailed(
                        f"cannot read bytes {start}-{end}: the server failed {attempt} "
                        f"attempts ({exc.message})",
                        path=self.obj.url,
                    ) from exc
                logger.warning("%s: attempt %d failed, again in %.2f s", exc, attempt, pause)
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")  # pragma: no cover


def _reopen(
    obj: RemoteObject, block_size: int, max_blocks: int, cache: DiskCache | None, key: str | None
) -> RemoteFile:
    return RemoteFile(obj, block_size=block_size, max_blocks=max_blocks, cache=cache, key=key)
