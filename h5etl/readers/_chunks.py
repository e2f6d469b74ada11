"""Compressed chunks read without HDF5: map the file, decode each chunk with imagecodecs.

HDF5 runs every filter under h5py's global lock, so threads cannot decode two chunks at once.
Here a field's chunks are indexed once (``chunk_iter``) and their stored bytes decoded
straight from a read-only mapping of the file by imagecodecs, which releases the GIL: two
threads decode two chunks in parallel. Only layouts and filter pipelines understood exactly
are decoded here (``ChunkStore`` raises ``NotDecodable`` otherwise, and h5py reads that field
as before); a chunk that fails to decode to exactly its size is read through h5py too.

Per-process state only: the mapping, the decoded-chunk cache and the decode pool belong to
the process that made them (checked by pid), so a forked child builds its own.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import h5py
import imagecodecs
import numpy as np

from h5etl.format import contract as ff
from h5etl.readers._layout import copy_rows, gather_rows

logger = logging.getLogger(__name__)

SHUFFLE, FLETCHER32, DEFLATE = ff.FILTER_SHUFFLE, ff.FILTER_FLETCHER32, ff.FILTER_DEFLATE
LZF, BLOSC, ZSTD = ff.FILTER_LZF, ff.FILTER_BLOSC, ff.FILTER_ZSTD
CODECS = frozenset({DEFLATE, LZF, BLOSC, ZSTD})
DECODE_THREADS = 4  # at most; never more than the CPUs


class NotDecodable(Exception):
    """This layout, pipeline or chunk is not decoded here; h5py reads it instead."""


def _codec(filter_id: int, stored: Any, nbytes: int) -> Any:
    """One codec's decoded bytes; ``out=nbytes`` makes a longer output an error, not a loss."""
    if filter_id == LZF:
        return imagecodecs.lzf_decode(stored, out=nbytes)
    if filter_id == DEFLATE:  # a zlib stream; libdeflate when the size is known
        return imagecodecs.deflate_decode(stored, out=nbytes)
    if filter_id == ZSTD:
        return imagecodecs.zstd_decode(stored, out=nbytes)
    return imagecodecs.blosc_decode(stored, numthreads=1)  # the frame states its own size


def unshuffle(data: Any, itemsize: int) -> np.ndarray:
    """Undo HDF5's byte shuffle: byte ``j`` of every item is stored together, for each ``j``."""
    flat = np.frombuffer(data, dtype=np.uint8)
    if itemsize == 1 or flat.size % itemsize:
        raise NotDecodable(f"cannot unshuffle {flat.size} bytes of {itemsize}-byte items")
    return np.ascontiguousarray(flat.reshape(itemsize, -1).T).reshape(-1)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A dataset's filters in write order, reduced to what decoding a chunk needs.

    Accepted: one codec (deflate, lzf, Blosc or Zstd), the byte shuffle, or the shuffle then
    one codec; anything else (fletcher32, scale-offset, two codecs, shuffle after the codec,
    unknown plugins) raises ``NotDecodable``. Every stage then has the chunk's own size.
    """

    filters: tuple[int, ...]
    itemsize: int
    nbytes: int  # one decoded chunk

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> Pipeline:
        plist = dataset.id.get_create_plist()
        filters = tuple(int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters()))
        codecs = [f for f in filters if f in CODECS]
        allowed = filters in {(*codecs,), (SHUFFLE, *codecs)}
        if len(codecs) > 1 or not allowed or not filters:
            raise NotDecodable(f"filter pipeline {filters} is not decoded here")
        itemsize = dataset.dtype.itemsize
        return cls(filters, itemsize, math.prod(dataset.chunks) * itemsize)

    def decode(self, stored: Any, mask: int) -> np.ndarray:
        """One chunk's bytes; filters whose bit is set in ``mask`` were skipped at write time."""
        data = stored
        for position in reversed(range(len(self.filters))):
            if mask >> position & 1:
                continue
            filter_id = self.filters[position]
            if filter_id == SHUFFLE:
                if self.itemsize > 1:  # HDF5 leaves 1-byte items as they are
                    data = unshuffle(data, self.itemsize)
                continue
            try:
                data = _codec(filter_id, data, self.nbytes)
            except (RuntimeError, ValueError) as exc:  # imagecodecs' errors are RuntimeErrors
                raise NotDecodable(f"filter {filter_id}: {exc}") from exc
        decoded = np.frombuffer(data, dtype=np.uint8)
        if decoded.size != self.nbytes:
            raise NotDecodable(f"decoded {decoded.size} bytes, the chunk has {self.nbytes}")
        return decoded


class ChunkCache:
    """Decoded chunks by key, least recently used first out, at most ``nbytes`` held.

    Thread-safe; a chunk being decoded is held as a pending future, so two threads asking
    for it decode it once. The chunk just added always stays, even past ``nbytes``.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.held = 0
        self.loads = 0  # chunks loaded (decoded), i.e. misses
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, Future[np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

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
        """Rows at ``indices`` in that order: one fancy take per chunk touched."""
        return gather_rows(indices, self.rows, self.chunk_shape[1:], self.dtype, self.load)

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
    return stores


# --- reading ahead, and reads against fork -------------------------------------------------


def prefetched(
    read: Callable[[np.ndarray], dict[str, np.ndarray]], batches: Iterable[np.ndarray], depth: int
) -> Generator[dict[str, np.ndarray], None, None]:
    """``read(batch)`` for each batch, in order, with ``depth`` reads running ahead in threads.

    Memory stays bounded (``depth`` batches in flight plus the one yielded); the pool is shut
    down, queued reads cancelled and running ones awaited, when the generator finishes, is
    closed or is garbage collected.
    """
    owner = os.getpid()
    todo = iter(batches)
    pool = ThreadPoolExecutor(min(depth, os.cpu_count() or 1), thread_name_prefix="h5etl-prefetch")
    try:
        pending: deque[Future[dict[str, np.ndarray]]] = deque(
            pool.submit(read, batch) for batch in itertools.islice(todo, depth)
        )
        while pending:
            if os.getpid() != owner:  # the threads filling ``pending`` stayed in the parent
                raise RuntimeError("a prefetching iterator cannot be resumed in a forked child")
            batch = pending.popleft().result()  # a reading error surfaces here, in order
            pending.extend(pool.submit(read, b) for b in itertools.islice(todo, 1))
            yield batch
    finally:
        pool.shutdown(wait=os.getpid() == owner, cancel_futures=True)


class ForkGate:
    """Reads share the gate; a fork waits for the running ones and holds new ones back.

    Handles are closed before a fork (see ``_core``); that is only safe when no other
    thread (a prefetching one, say) is reading through them, and none reopens one between
    the close and the fork. Never taken inside the decode pool, which a fork also waits for.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._forking = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Before a fork: wait until no read runs, and let none start."""
        with self._cond:
            self._forking = True
            while self._readers:
                self._cond.wait()

    def open(self) -> None:
        """After the fork, in the parent: let reads run again."""
        with self._cond:
            self._forking = False
            self._cond.notify_all()
