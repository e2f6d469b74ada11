"""Where a reader's release is: a local file, or a pinned object on object storage.

``ReleaseFile.of(path)`` resolves once, when a reader is made: a local link to its target, and
``s3://bucket/releases/cells.h5`` through its pointer ``cells.h5.json`` to the versioned file
it names, pinned by ETag (or VersionId) for the reader's life, so a later publish never changes
what an open reader reads. A ``ReleaseFile`` pickles as that resolution (a few strings), and
each process opens its own handles from it: ``open()`` for h5py, ``chunks()`` for the chunk
bytes the readers decode outside HDF5. A remote file is read by range reads in blocks
(``h5etl.remote.reading.RemoteFile``), kept in memory and, with ``cache_dir``, on disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5etl.errors import H5EtlError, ReaderError
from h5etl.readers._chunks import ChunkFile
from h5etl.readers._codecs import NotDecodable
from h5etl.remote.cache import DiskCache
from h5etl.remote.location import is_url, parse_location
from h5etl.remote.objects import RemoteObject
from h5etl.remote.reading import RemoteFile

__all__ = ["REMOTE_BLOCKS", "REMOTE_BLOCK_SIZE", "CacheDir", "ReleaseFile"]

# A reader's range reads: 1 MiB a request (HDF5's metadata near the file's start comes in one
# or two; a compressed chunk is one or two), 64 of them kept per process (64 MiB).
REMOTE_BLOCK_SIZE = 2**20
REMOTE_BLOCKS = 64
# HDF5's page buffer of a release written with fs_strategy="page": its metadata pages are kept
# apart from raw data, so opening reads them in a few requests and keeps them
PAGE_BUFFER_BYTES = 16 * 2**20

CacheDir = str | os.PathLike[str] | DiskCache | None


@dataclass(frozen=True)
class ReleaseFile:
    """One release, resolved: ``path`` for a local file, else the pinned ``remote`` object,
    the SHA-256 of its bytes when known (``sha256``), and the disk cache to keep blocks in."""

    path: Path | None = None
    remote: RemoteObject | None = None
    sha256: str | None = None
    cache: DiskCache | None = None

    @classmethod
    def of(
        cls, path: str | os.PathLike[str] | ReleaseFile, cache_dir: CacheDir = None
    ) -> ReleaseFile:
        """``path`` resolved (a ``ReleaseFile`` is kept as it is, pinned already).

        Raises:
            ReaderError: the URL names no release (no pointer, no bucket, refused credentials,
                the server unreachable), in one line naming it.
        """
        if isinstance(path, ReleaseFile):
            return path
        if not is_url(path):
            return cls(path=Path(os.path.realpath(path)))
        from h5etl.remote.publish import pin  # the release side: only when a URL is read

        try:
            obj, sha256 = pin(parse_location(path))
        except H5EtlError as exc:
            raise ReaderError(exc.message, path=str(exc.path or path)) from exc
        cache = cache_dir if isinstance(cache_dir, DiskCache) or cache_dir is None else None
        if cache_dir is not None and cache is None:
            cache = DiskCache(Path(os.fspath(cache_dir)))  # type: ignore[arg-type]
        return cls(remote=obj, sha256=sha256, cache=cache)

    @property
    def name(self) -> str:
        """What messages name: the local path, or the pinned file's URL."""
        return str(self.path) if self.remote is None else self.remote.url

    @property
    def local(self) -> bool:
        return self.remote is None

    def __str__(self) -> str:
        return self.name

    def __fspath__(self) -> str:
        if self.path is None:
            raise TypeError(f"{self.name} is on object storage, not a local path")
        return str(self.path)

    def cache_key(self) -> str | None:
        """What names the bytes on disk: the SHA-256, else the pinned ETag and version."""
        if self.remote is None:
            return None
        if self.sha256:
            return self.sha256
        import hashlib

        return hashlib.sha256(f"{self.remote.url}|{self.remote.stamp}".encode()).hexdigest()

    def handle(self) -> RemoteFile:
        """A new remote file for this process (its own blocks; the disk cache shared)."""
        assert self.remote is not None
        return RemoteFile(
            self.remote,
            block_size=REMOTE_BLOCK_SIZE,
            max_blocks=REMOTE_BLOCKS,
            cache=self.cache,
            key=self.cache_key() if self.cache else None,
        )

    def open(self, **options: Any) -> h5py.File:
        """The release opened read-only by h5py (``options``: its chunk cache settings).

        Raises:
            ReaderError: not an HDF5 file, or not readable (one line).
        """
        return self.open_with_bytes(**options)[0]

    def open_with_bytes(self, **options: Any) -> tuple[h5py.File, RemoteFile | None]:
        """``open()``, and the remote file h5py reads (None for a local one): what
        ``chunks`` reads chunk bytes from, sharing its blocks."""
        remote = None if self.remote is None else self.handle()
        try:
            if remote is None:
                return h5py.File(self.path, "r", **options), None
            return h5py.File(remote, "r", page_buf_size=PAGE_BUFFER_BYTES, **options), remote
        except ReaderError:
            raise  # a read that failed every attempt: one line already
        except H5EtlError as exc:
            raise ReaderError(exc.message, path=str(exc.path or self.name)) from exc
        except (OSError, ValueError) as exc:
            raise ReaderError(f"cannot open as HDF5: {exc}", path=self.name) from exc

    def chunks(self, remote: RemoteFile | None) -> ChunkFile:
        """The stored bytes of chunks, for decoding outside HDF5: the local file mapped, or
        the ``remote`` file h5py reads (its blocks shared with h5py's reads)."""
        if remote is None:
            assert self.path is not None
            return ChunkFile(self.path)
        return RemoteChunks(remote)


class RemoteChunks(ChunkFile):
    """A remote release's chunk bytes, read through its ``RemoteFile`` (thread-safe)."""

    def __init__(self, file: RemoteFile):  # no mapping: nothing local to map
        self.pid = os.getpid()
        self.file = file

    def read(self, offset: int, size: int) -> np.ndarray:
        if offset + size > self.file.obj.size:
            raise NotDecodable(f"chunk at byte {offset} ends past the file")
        return np.frombuffer(self.file.pread(offset, size), dtype=np.uint8)
