"""cache: a bounded disk cache of a pinned object's blocks, shared by processes.

``DiskCache(root, max_bytes)`` keeps blocks of remote files as files
``root/<key>/<block_size>-<index>``, where ``key`` names the bytes themselves (a release's
SHA-256 from its pointer or upload metadata): a pinned release never changes, so a block read
once is good for every later reader of that release, in any process. Several processes (the
workers of a DataLoader) share one directory safely:

- a block is written to a temp file beside it and renamed into place (``os.replace``), so a
  reader sees a whole block or none; two processes writing one block write the same bytes;
- a block whose size is not the expected one is a miss (and is removed);
- the least recently used blocks (by modification time, touched on each hit) are deleted once
  the directory holds more than ``max_bytes``; a block deleted while another process reads it
  stays readable through the open file.

The bound is checked by each process after it has written an eighth of ``max_bytes`` since
its last look, so N processes writing at once overshoot by at most N/8 of it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_CACHE_BYTES", "DiskCache"]

DEFAULT_CACHE_BYTES = 16 * 2**30
_STALE_TEMP_S = 3600.0  # a temp file this old was left by a killed process
_TEMP = ".tmp-"


@dataclass
class DiskCache:
    """Blocks of pinned remote files under ``root``, at most about ``max_bytes`` in all."""

    root: Path
    max_bytes: int = DEFAULT_CACHE_BYTES
    hits: int = field(default=0, compare=False)
    misses: int = field(default=0, compare=False)
    _written: int = field(default=-1, compare=False, repr=False)  # -1: not looked yet

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser().absolute()
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "max_bytes": self.max_bytes}  # counters are per process

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def _path(self, key: str, block_size: int, index: int) -> Path:
        return self.root / key / f"{block_size}-{index}"

    def get(self, key: str, block_size: int, index: int, length: int) -> bytes | None:
        """The cached block ``index`` of ``key`` (``length`` bytes long), or None."""
        path = self._path(key, block_size, index)
        try:
            with path.open("rb") as file:
                data = file.read()
        except OSError:
            self.misses += 1
            return None
        if len(data) != length:  # not a block this cache wrote: never trusted
            with contextlib.suppress(OSError):
                path.unlink()
            self.misses += 1
            return None
        with contextlib.suppress(OSError):  # the LRU clock: a hit is a use
            os.utime(path)
        self.hits += 1
        return data

    def put(self, key: str, block_size: int, index: int, data: bytes) -> None:
        """Keep ``data`` as block ``index`` of ``key``; a full disk only skips caching."""
        path = self._path(key, block_size, index)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(prefix=_TEMP, dir=path.parent)
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(data)
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except OSError:
            return  # the cache is an optimisation: a read never fails for it
        if self._written < 0 or self._written + len(data) > self.max_bytes // 8:
            self.evict()
        else:
            self._written += len(data)

    def evict(self) -> int:
        """Delete the least recently used blocks until at most 9/10 of ``max_bytes`` remain;
        the bytes kept."""
        self._written = 0
        now = time.time()
        found: list[tuple[float, int, str]] = []
        total = 0
        for folder in _entries(self.root):
            for entry in _entries(Path(folder.path)):
                try:
                    stat = entry.stat()
                except OSError:
                    continue
                if entry.name.startswith(_TEMP):
                    if now - stat.st_mtime > _STALE_TEMP_S:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                    continue
                found.append((stat.st_mtime, stat.st_size, entry.path))
                total += stat.st_size
        if total <= self.max_bytes:
            return total
        found.sort()
        for _, size, path in found:
            if total <= self.max_bytes * 9 // 10:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
            total -= size
        return total


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except OSError:
        return []
