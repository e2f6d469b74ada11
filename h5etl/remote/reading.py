"""reading: one pinned object as a read-only, seekable file (what h5py opens for a reader).

``RemoteFile(obj)`` reads ``obj`` (a listed or resolved ``RemoteObject``) in blocks, each one
range read that names the object's version or carries its ETag (``read_bytes``), so the file
never mixes the bytes of two uploads: a replaced or deleted object fails the next read with
``RemoteChanged``. The last ``max_blocks`` blocks stay in memory (least recently used out), so
HDF5's many small metadata reads near each other cost one request. It pickles as the object and
its sizes, never its blocks: each DataLoader worker that unpickles one reads on its own.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

from h5etl.remote.errors import RemoteChanged
from h5etl.remote.objects import RemoteObject, read_bytes

__all__ = ["DEFAULT_BLOCK_SIZE", "RemoteFile"]

DEFAULT_BLOCK_SIZE = 4 * 2**20  # a request's round trip (~10-50 ms) is worth ~4 MiB on a LAN


class RemoteFile(io.RawIOBase):
    """The object ``obj`` as a read-only binary file, read in blocks of ``block_size`` bytes
    of which the last ``max_blocks`` are kept."""

    def __init__(
        self, obj: RemoteObject, *, block_size: int = DEFAULT_BLOCK_SIZE, max_blocks: int = 16
    ):
        super().__init__()
        if block_size < 1 or max_blocks < 1:
            raise ValueError(f"block_size and max_blocks must be >= 1: {block_size}, {max_blocks}")
        self.obj = obj
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.requests = 0  # range reads sent: what a reader's layout costs
        self._position = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.obj, self.block_size, self.max_blocks))

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
        wanted = min(len(view), max(self.obj.size - self._position, 0))
        done = 0
        while done < wanted:
            index, skip = divmod(self._position + done, self.block_size)
            block = self._block(index)
            piece = block[skip : skip + wanted - done]
            view[done : done + len(piece)] = piece
            done += len(piece)
        self._position += done
        return done

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is not None:
            self._blocks.move_to_end(index)
            return block
        start = index * self.block_size
        try:
            block = read_bytes(self.obj, start, min(start + self.block_size, self.obj.size))
        except RemoteChanged as exc:
            raise RemoteChanged(
                "the file changed while it was read (replaced or deleted, by prune?); "
                "nothing more is read from it: open the release again",
                path=self.obj.url,
            ) from exc
        self.requests += 1
        self._blocks[index] = block
        if len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        return block


def _reopen(obj: RemoteObject, block_size: int, max_blocks: int) -> RemoteFile:
    return RemoteFile(obj, block_size=block_size, max_blocks=max_blocks)
