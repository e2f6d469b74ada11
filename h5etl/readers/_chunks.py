"""Compressed chunks read without HDF5: map the file, decode each chunk with imagecodecs.

HDF5 runs every filter under h5py's global lock, so threads cannot decode two chunks at once.
Here a field's chunks are indexed once (``chunk_iter``) and their stored bytes decoded
straight from a read-only mapping of the file by imagecodecs, which releases the GIL: two
threads decode two chunks in parallel. Only layouts and filter pipelines understood exactly
are decoded here (``ChunkStore`` raises ``NotDecodable`` otherwise, and h5py reads that field
as before); a chunk that fails to decode to exactly its size is read through h5py too. A
few rows of a Blosc chunk that a full cache does not hold are decoded alone, from the blocks
that hold them (``ChunkStore.gather``, ``_codecs.blosc_range``).

Per-process state only: the mapping, the decoded-chunk cache and the decode pool belong to
the process that made them (checked by pid), so a forked child builds its own.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import h5py
import numpy as np

from h5etl.readers._codecs import NotDecodable, Pipeline
from h5etl.readers._layout import copy_rows, gather_rows

logger = logging.getLogger(__name__)

DECODE_THREADS = 4  # at most; never more than the CPUs
# Measured: docs/internals/decisions.md#random-reads.
# A chunk missed by rows spanning at most 1/PART_OF of it, when the cache is full, is decoded
# in part (where the codec allows it): a cold random read costs a few Blosc blocks, while rows
# read in chunk order pay at most 1/PART_OF of a chunk more than one whole decode a chunk.
PART_OF = 8
# Chunks read in part that a second touch decodes whole and keeps, per field: those of the
# last two reads. More would catch rows read in order no better, and under a uniform random
# sampler would decode whole (and keep, for nothing) a share REMEMBERED / chunks of reads.
REMEMBERED = 2


class ChunkCache:
    """Decoded chunks by key, least recently used first out, at most ``nbytes`` held.

    Thread-safe; a chunk being decoded is held as a pending future, so two threads asking
    for it decode it once. The chunk just added always stays, even past ``nbytes``. It also
    remembers the keys of chunks lately read only in part (``recall``): once the cache is
    full, a chunk touched once is not worth a whole decode, one touched twice soon is.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.held = 0
        self.loads = 0  # chunks loaded (decoded), i.e. misses
        self.parts = 0  # reads that decoded part of a chunk, not kept
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, Future[np.ndarray]] = OrderedDict()
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self.remember = REMEMBERED  # keys: REMEMBERED per field sharing it (open_stores)

    def __len__(self) -> int:
        return len(self._items)

    def recall(self, key: Hashable, nbytes: int) -> bool:
        """Whether a miss at ``key`` should load the whole chunk (of ``nbytes``) and keep it.

        True when the chunk is held or being loaded, when the cache has room for it without
        evicting another (memory granted for decoded chunks: each is decoded once), or when
        it was read in part lately (one of the last ``remember`` such chunks: it is being
        read in order). Otherwise ``key`` is remembered now and the caller reads its part.
        """
        with self._lock:
            if key in self._items or self.held + nbytes <= self.nbytes:
                return True
            if key in self._seen:
                del self._seen[key]
                return True
            self._seen[key] = None
            while len(self._seen) > self.remember:
                self._seen.popitem(last=False)
            return False

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The chunk at ``key``, loaded by this thread unless cached or being loaded."""
        with self._lock:
            pending = self._items.get(key)
            if pending is not None:
                self._items.move_to_end(key)
            else:
                mine: Future[np.ndarray] = Future()
                self._items[key] = mine
        if pending is not None:
            return pending.result()
        try:
            value = load()
        except BaseException as exc:
            with self._lock:
                if self._items.get(key) is mine:
                    del self._items[key]
            mine.set_exception(exc)
            raise
        mine.set_result(value)
        with self._lock:
            self.loads += 1
            if self._items.get(key) is mine:
                self.held += value.nbytes
                self._evict(keep=key)
        return value

    def count_part(self) -> None:
        """One read decoded part of a chunk (counted like ``loads``, for tests and benchmarks)."""
        with self._lock:
            self.parts += 1

    def _evict(self, keep: Hashable) -> None:
        for key in list(self._items):
            if self.held <= self.nbytes:
                return
            item = self._items[key]
            if key != keep and item.done():
                del self._items[key]
                self.held -= item.result().nbytes


class ChunkFile:
    """The release mapped read-only: a chunk's stored bytes are a view, decoded in place.

    No copy and no system call per chunk: the decoder reads the mapped pages itself, with
    the GIL released (on a cold page cache the kernel reads them in as the decoder faults).
    The mapping ends when the last view of it is dropped, so threads still decoding when
    the release is closed keep what they read valid. Releases are never modified after
    publication, so the mapping stays true to the file.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.pid = os.getpid()
        self.memory: np.memmap[Any, np.dtype[np.uint8]] = np.memmap(path, mode="r")

    def read(self, offset: int, size: int) -> np.ndarray:
        if offset + size > self.memory.size:
            raise NotDecodable(f"chunk at byte {offset} ends past the file")
        return np.asarray(self.memory[offset : offset + size])


class ChunkStore:
    """Every chunk of one filtered field, read and decoded outside HDF5, with a shared cache.

    Parameters:
        dataset: the open field; its chunks must hold whole samples and all be allocated.
        file: the mapped release (this process's).
        cache: decoded chunks, shared between the fields of one reader.
        fallback: rows ``start:stop`` read by h5py, for a chunk that fails to decode here.

    Raises:
        NotDecodable: the layout or filters are not handled here.
    """

    def __init__(
        self,
        dataset: h5py.Dataset,
        file: ChunkFile,
        cache: ChunkCache,
        fallback: Callable[[int, int], np.ndarray],
    ):
        chunks, shape = dataset.chunks, dataset.shape
        if chunks is None or tuple(chunks[1:]) != tuple(shape[1:]):
            raise NotDecodable(f"chunks {chunks} do not hold whole samples of {shape[1:]}")
        if dataset.dtype.kind not in "iuf" or not hasattr(dataset.id, "chunk_iter"):
            raise NotDecodable(f"dtype {dataset.dtype} is not decoded here")
        self.pipeline = Pipeline.of(dataset)
        self.name = dataset.name
        self.rows = int(chunks[0])
        self.length = len(dataset)
        self.dtype: np.dtype[Any] = np.dtype(dataset.dtype)
        self.chunk_shape = (self.rows, *shape[1:])
        self.file, self.cache, self.fallback = file, cache, fallback
        self.closed = False  # set when its reader closes: queued read-aheads are dropped
        # Whether a miss on a few rows may decode only their part of the chunk (see gather).
        self.partial = self.pipeline.ranged and self.rows >= PART_OF
        # Where each chunk is stored, by chunk number: 24 bytes a chunk, not a Python object.
        count = math.ceil(self.length / self.rows)
        self.offsets = np.full(count, -1, dtype=np.int64)
        self.sizes = np.zeros(count, dtype=np.int64)
        self.masks = np.zeros(count, dtype=np.int64)

        def visit(store: Any) -> None:
            if store.byte_offset is None or any(store.chunk_offset[1:]):
                raise NotDecodable("unallocated or tiled chunk")
            number = store.chunk_offset[0] // self.rows
            self.offsets[number], self.sizes[number] = store.byte_offset, store.size
            self.masks[number] = store.filter_mask

        dataset.id.chunk_iter(visit)
        if count and self.offsets.min() < 0:
            raise NotDecodable("unallocated chunks (fill values)")

    def _load(self, base: int) -> np.ndarray:
        number = base // self.rows
        offset, size = int(self.offsets[number]), int(self.sizes[number])
        try:
            flat = self.pipeline.decode(self.file.read(offset, size), int(self.masks[number]))
            rows = flat.view(self.dtype).reshape(self.chunk_shape)
        except NotDecodable as exc:
            logger.warning("%s: chunk at row %d read through h5py: %s", self.name, base, exc)
            rows = self.fallback(base, min(base + self.rows, self.length))
        rows.flags.writeable = False  # cached and shared between threads: never handed out
        return rows

    def chunk(self, base: int) -> np.ndarray:
        """The decoded chunk starting at row ``base`` (read-only; may be short at the end)."""
        return self.cache.get((self.name, base), lambda: self._load(base))

    def load(self, bases: Iterable[int]) -> dict[int, np.ndarray]:
        """Several chunks, the ones to decode decoded in parallel (this thread decodes one)."""
        wanted = list(bases)
        if len(wanted) <= 1:
            return {b: self.chunk(b) for b in wanted}
        pending = {b: submit(self.chunk, b) for b in wanted[1:]}
        out = {wanted[0]: self.chunk(wanted[0])}
        out.update((b, f.result()) for b, f in pending.items())
        return out

    def prefetch(self, indices: np.ndarray) -> None:
        """Start decoding the chunks holding ``indices`` in the background; return at once."""
        for base in np.unique(indices - indices % self.rows).tolist():
            submit(self._read_ahead, base)

    def _read_ahead(self, base: int) -> None:
        if not self.closed:  # a closed reader's read-aheads would only delay other readers
            self.chunk(base)

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """Rows at ``indices`` in that order: one fancy take per chunk touched.

        A chunk the cache neither holds nor has room for, not touched lately, of which the
        rows asked span at most 1/``PART_OF``, is decoded only in part where the codec allows
        it (``Pipeline.ranged``) and not kept; the others are decoded whole (several in
        parallel) and kept (see ``ChunkCache.recall``).
        """
        bases = indices - indices % self.rows
        parts = self._parts(indices, bases) if self.partial and len(indices) else {}
        if not parts:
            return gather_rows(indices, self.rows, self.chunk_shape[1:], self.dtype, self.load)
        whole = [b for b in np.unique(bases).tolist() if b not in parts]
        pieces = {b: (0, c) for b, c in self.load(whole).items()} | parts
        out = np.empty((len(indices), *self.chunk_shape[1:]), dtype=self.dtype)
        for base, (first, rows) in pieces.items():
            where = np.flatnonzero(bases == base)
            out[where] = rows[indices[where] - base - first]
        return out

    def _parts(self, indices: np.ndarray, bases: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
        """The chunks worth decoding in part: base -> (first row decoded, the rows decoded)."""
        parts = {}
        lowest, highest = int(bases.min()), int(bases.max())
        chunks = [lowest] if lowest == highest else np.unique(bases).tolist()
        for base in chunks:
            local = indices - base if lowest == highest else indices[bases == base] - base
            first, stop = int(local.min()), int(local.max()) + 1
            if (stop - first) * PART_OF > self.rows:
                continue
            if self.cache.recall((self.name, base), self.pipeline.nbytes):
                continue
            rows = self._part(base, first, stop)
            if rows is not None:
                parts[base] = (first, rows)
        return parts

    def _part(self, base: int, first: int, stop: int) -> np.ndarray | None:
        """Rows ``base + first`` to ``base + stop`` decoded alone, or None: decode it whole."""
        number = base // self.rows
        row_bytes = self.pipeline.nbytes // self.rows
        try:
            stored = self.file.read(int(self.offsets[number]), int(self.sizes[number]))
            flat = self.pipeline.decode_range(
                stored, int(self.masks[number]), first * row_bytes, stop * row_bytes
            )
        except NotDecodable as exc:  # the whole decode tries again, then h5py
            logger.debug("%s: chunk at row %d not decoded in part: %s", self.name, base, exc)
            return None
        if flat is None:
            return None
        self.cache.count_part()
        return flat.view(self.dtype).reshape(stop - first, *self.chunk_shape[1:])

    def read_into(self, out: np.ndarray, start: int, stop: int, pos: int) -> None:
        """Rows ``start:stop`` copied into ``out[pos:]``."""
        copy_rows(out, start, stop, pos, self.rows, self.load, length=self.length)


# --- the decode pool: one per process, shut down before fork ------------------------------

_POOL_LOCK = threading.Lock()
_POOL: tuple[int, ThreadPoolExecutor] | None = None


def submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` on this process's decode pool (made on first use after a fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            workers = max(1, min(DECODE_THREADS, os.cpu_count() or 1))
            _POOL = (os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix="h5etl-decode"))
        return _POOL[1].submit(fn, *args)


def _shutdown_before_fork() -> None:
    """Let running decodes finish and stop the threads, so a child never inherits a pool."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL[0] == os.getpid():
            _POOL[1].shutdown(wait=True)
        _POOL = None


def _fresh_pool_in_child() -> None:
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(before=_shutdown_before_fork, after_in_child=_fresh_pool_in_child)


def h5py_rows(dataset: h5py.Dataset) -> Callable[[int, int], np.ndarray]:
    """Rows ``start:stop`` of ``dataset`` read by h5py (the path for what is not decoded here)."""

    def rows(start: int, stop: int) -> np.ndarray:
        block = np.empty((stop - start, *dataset.shape[1:]), dtype=dataset.dtype)
        if stop > start:
            dataset.read_direct(block, np.s_[start:stop])
        return block

    return rows


def open_stores(
    datasets: dict[str, h5py.Dataset], names: Iterable[str], file: ChunkFile, cache: ChunkCache
) -> dict[str, ChunkStore]:
    """A ``ChunkStore`` for each of ``names`` that can be decoded here; h5py keeps the rest."""
    stores = {}
    for name in names:
        dataset = datasets[name]
        try:
            stores[name] = ChunkStore(dataset, file, cache, h5py_rows(dataset))
        except NotDecodable as exc:
            logger.debug("%s read through h5py: %s", name, exc)
    cache.remember = REMEMBERED * max(1, len(stores))  # the fields a read touches share it
    return stores
