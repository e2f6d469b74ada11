"""The framework-free core of the readers: cache sizing, a per-process handle, the sampler.

A reader holds a *recipe* for opening a release (its resolved path, a split, field names and
cache sizes), never an open file across processes: the HDF5 handle is opened lazily, at most
once per process (checked by pid), so fork, spawn and persistent workers each open their own.
"""

from __future__ import annotations

import math
import multiprocessing.util
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc/Zstd filters for reading)
import numpy as np

from h5etl.errors import H5EtlError

LINEAGE = "source_sha256"
DEFAULT_NSLOTS = 521  # HDF5's own default
# Handles inherited through fork: never used nor closed in the child (closing would drop the
# parent's file lock on the shared descriptor), only kept alive so no destructor runs here.
_INHERITED: list[Any] = []
# Every Release holding an open handle; closed just before this process forks (see below).
_OPEN: weakref.WeakSet[Release] = weakref.WeakSet()


def _close_before_fork() -> None:
    """Close this process's handles so a forked child never inherits an open HDF5 file.

    HDF5 would otherwise find the file "already open" in the child's copy of the library and
    share the parent's state with it. The parent reopens lazily on its next read.
    """
    for release in list(_OPEN):
        release.close()


os.register_at_fork(before=_close_before_fork)


class ReaderError(H5EtlError):
    """A release cannot be read as asked (missing split or field, unequal lengths)."""


@dataclass(frozen=True, slots=True)
class CacheSize:
    """Chunk-cache settings for one dataset: bytes, hash slots and the eviction weight."""

    nbytes: int
    nslots: int
    w0: float = 1.0  # evict fully read chunks first: a chunk-ordered epoch never needs them again


def next_prime(n: int) -> int:
    """The smallest prime >= ``n``."""
    candidate = max(n, 2)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


def cache_size(
    chunks: tuple[int, ...] | None, itemsize: int, *, batch_size: int, min_chunks: int = 2
) -> CacheSize:
    """Cache settings that hold every chunk one batch of ``batch_size`` rows can touch.

    A batch of ``b`` consecutive rows in chunk-local order spans at most ``ceil(b/c) + 1``
    chunks of ``c`` rows (one more when it straddles a boundary). ``nslots`` is a prime about
    100 times the number of chunks that fit, as the HDF5 documentation recommends.
    """
    if chunks is None:  # contiguous dataset: no chunk cache involved
        return CacheSize(nbytes=0, nslots=DEFAULT_NSLOTS)
    rows = chunks[0]
    held = max(min_chunks, math.ceil(batch_size / rows) + 1)
    chunk_bytes = math.prod(chunks) * itemsize
    return CacheSize(nbytes=held * chunk_bytes, nslots=next_prime(max(100 * held, DEFAULT_NSLOTS)))


def _open_dataset(group: h5py.Group, name: str, cache: CacheSize | None) -> h5py.Dataset:
    """Open ``group[name]`` with its own chunk cache (HDF5 keeps one cache per dataset)."""
    if cache is None or cache.nbytes == 0:
        return group[name]
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(cache.nslots, cache.nbytes, cache.w0)
    return h5py.Dataset(h5py.h5d.open(group.id, name.encode(), dapl=dapl))


@dataclass(frozen=True, slots=True)
class FieldInfo:
    """What a reader needs to know about one field to allocate its batches."""

    name: str
    shape: tuple[int, ...]  # per sample
    dtype: np.dtype[Any]
    chunks: tuple[int, ...] | None
    text: bool


def _field_info(dataset: h5py.Dataset) -> FieldInfo:
    text = h5py.check_string_dtype(dataset.dtype) is not None
    return FieldInfo(
        name=dataset.name.rsplit("/", 1)[-1],
        shape=tuple(dataset.shape[1:]),
        dtype=np.dtype(object) if text else dataset.dtype,
        chunks=dataset.chunks,
        text=text,
    )


def runs(sorted_indices: np.ndarray) -> list[tuple[int, int, int]]:
    """Split sorted unique indices into contiguous runs: ``(position, start, stop)`` triples."""
    if len(sorted_indices) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_indices) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(sorted_indices)]])
    return [
        (int(a), int(sorted_indices[a]), int(sorted_indices[b - 1]) + 1)
        for a, b in zip(starts, stops, strict=True)
    ]


class Release:
    """A picklable recipe for reading one split of a release, opened lazily once per process.

    Parameters:
        path: the release file or its link; the link is resolved once, here, so a reader keeps
            reading the release it started with even if the link is swapped meanwhile.
        split: the group to read, e.g. ``"train"``.
        fields: datasets to read; default every field but the ``source_sha256`` lineage.
        batch_size: the largest batch you will ask for; sizes the chunk cache.

    Raises:
        ReaderError: the file, split or a field is missing, or the fields differ in length.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str,
        *,
        fields: Sequence[str] | None = None,
        batch_size: int = 32,
    ):
        self.path = Path(os.path.realpath(path))
        self.split = split
        self.batch_size = batch_size
        with h5py.File(self.path, "r") as handle:
            group = self._group(handle)
            names = (
                list(fields)
                if fields is not None
                else [n for n, d in group.items() if isinstance(d, h5py.Dataset) and n != LINEAGE]
            )
            missing = [n for n in names if not isinstance(group.get(n), h5py.Dataset)]
            if missing or not names:
                have = ", ".join(n for n in group if isinstance(group[n], h5py.Dataset))
                raise ReaderError(
                    f"split {split!r} has no field {', '.join(missing) or '(none asked)'}; "
                    f"it has: {have}",
                    path=self.path,
                )
            self.info = {n: _field_info(group[n]) for n in names}
            lengths = {n: len(group[n]) for n in names}
        if len(set(lengths.values())) > 1:
            raise ReaderError(
                f"fields of split {split!r} differ in length: {lengths}", path=self.path
            )
        self.length = next(iter(lengths.values()))
        self.fields = tuple(names)
        self.caches = {
            n: cache_size(i.chunks, i.dtype.itemsize, batch_size=batch_size)
            for n, i in self.info.items()
            if not i.text
        }
        self._pid: int | None = None
        self._file: h5py.File | None = None
        self._datasets: dict[str, h5py.Dataset] = {}

    def _group(self, handle: h5py.File) -> h5py.Group:
        group = handle.get(self.split)
        if not isinstance(group, h5py.Group) or self.split == "diagnostics":
            splits = ", ".join(k for k in handle if k != "diagnostics")
            raise ReaderError(f"no split {self.split!r}; the release has: {splits}", path=self.path)
        return group

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk of the first chunked field (the unit the sampler keeps together)."""
        rows = [i.chunks[0] for i in self.info.values() if i.chunks and not i.text]
        return max(rows, default=1)

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in {"_file", "_datasets"}}
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._file, self._datasets = None, {}

    def datasets(self) -> dict[str, h5py.Dataset]:
        """The open datasets of this process, opening the file on first use after a fork."""
        pid = os.getpid()
        if self._file is not None and self._pid == pid:
            return self._datasets
        if self._file is not None:  # inherited through fork: the parent's, not ours
            _INHERITED.append((self._file, self._datasets))
        self._file, self._datasets = None, {}
        handle = h5py.File(self.path, "r")
        try:
            group = self._group(handle)
            datasets = {n: _open_dataset(group, n, self.caches.get(n)) for n in self.fields}
        except BaseException:
            handle.close()
            raise
        self._file, self._datasets, self._pid = handle, datasets, pid
        _OPEN.add(self)
        # Worker processes end through os._exit, which skips atexit; multiprocessing's own
        # finalizers still run there, so teardown closes the file in every process.
        multiprocessing.util.Finalize(self, Release._close_file, args=(handle,), exitpriority=10)
        return datasets

    @staticmethod
    def _close_file(handle: h5py.File) -> None:
        if handle.id.valid:
            handle.close()

    @property
    def is_open(self) -> bool:
        """Whether this process holds an open handle."""
        return self._file is not None and self._pid == os.getpid() and bool(self._file.id.valid)

    def close(self) -> None:
        """Close this process's handle (a later read opens it again)."""
        if self._file is not None and self._pid == os.getpid():
            self._datasets = {}
            self._close_file(self._file)
        self._file, self._datasets, self._pid = None, {}, None
        _OPEN.discard(self)

    def __enter__(self) -> Release:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_slice(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``start:stop`` of every field, one contiguous read per field."""
        out = {}
        for name, dataset in self.datasets().items():
            info = self.info[name]
            if info.text:
                out[name] = dataset.asstr()[start:stop]
            else:
                block = np.empty((stop - start, *info.shape), dtype=info.dtype)
                if stop > start:
                    dataset.read_direct(block, np.s_[start:stop])
                out[name] = block
        return out

    def read(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``indices`` (any order, repeats allowed), returned in that order.

        The indices are sorted and cut into contiguous runs; each run is one slice read per
        field, so a batch from the chunk-aware sampler costs one or two reads, not one per row.
        """
        wanted = np.asarray(indices, dtype=np.int64)
        if wanted.size and (wanted.min() < -self.length or wanted.max() >= self.length):
            raise IndexError(f"index out of range for {self.length} samples")
        wanted = np.where(wanted < 0, wanted + self.length, wanted)
        unique, inverse = np.unique(wanted, return_inverse=True)
        pieces = runs(unique)
        if len(pieces) == 1:
            _, start, stop = pieces[0]
            batch = self.read_slice(start, stop)
        else:
            batch = self._read_runs(pieces, len(unique))
        if len(unique) == len(wanted) and np.array_equal(unique, wanted):
            return batch
        return {name: rows[inverse] for name, rows in batch.items()}

    def _read_runs(self, pieces: list[tuple[int, int, int]], total: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name, dataset in self.datasets().items():
            info = self.info[name]
            if info.text:
                rows = np.empty(total, dtype=object)
                for pos, start, stop in pieces:
                    rows[pos : pos + stop - start] = dataset.asstr()[start:stop]
                out[name] = rows
                continue
            block = np.empty((total, *info.shape), dtype=info.dtype)
            for pos, start, stop in pieces:
                dataset.read_direct(block, np.s_[start:stop], np.s_[pos : pos + stop - start])
            out[name] = block
        return out


class ChunkSampler:
    """Epoch orders that keep each chunk's rows together, seeded per epoch.

    With ``shuffle`` the chunks come in a random order and the rows inside each chunk in a
    random order, so a batch touches one or two chunks instead of one per row; without it the
    order is sequential (right for a release shuffled at write time). With ``world_size > 1``
    each rank gets an equal, contiguous share of the epoch order (padded by wrapping around, or
    trimmed with ``drop_last``), so every rank runs the same number of batches. Call
    ``set_epoch(n)`` before each epoch; all ranks must use the same ``seed``.
    """

    def __init__(
        self,
        length: int,
        chunk_rows: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ):
        if chunk_rows < 1 or length < 0:
            raise ValueError(f"need chunk_rows >= 1 and length >= 0, got {chunk_rows}, {length}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        self.length = length
        self.chunk_rows = chunk_rows
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.epoch = 0

    @classmethod
    def for_release(cls, release: Release | Any, **kwargs: Any) -> ChunkSampler:
        """A sampler matching a ``Release`` (or anything with ``release``, like ``H5Dataset``)."""
        source: Release = getattr(release, "release", release)
        return cls(len(source), source.chunk_rows, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields."""
        self.epoch = epoch

    @property
    def per_rank(self) -> int:
        """Samples each rank yields per epoch."""
        if self.drop_last:
            return self.length // self.world_size
        return math.ceil(self.length / self.world_size) if self.length else 0

    def __len__(self) -> int:
        return self.per_rank

    def epoch_order(self) -> np.ndarray:
        """The whole epoch's order, before it is split between ranks."""
        if not self.shuffle:
            return np.arange(self.length, dtype=np.int64)
        rng = np.random.default_rng([self.seed, self.epoch])
        starts = np.arange(0, self.length, self.chunk_rows)
        parts = []
        for start in rng.permutation(starts):
            stop = min(int(start) + self.chunk_rows, self.length)
            parts.append(int(start) + rng.permutation(stop - int(start)))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def indices(self) -> np.ndarray:
        """This rank's share of the epoch order."""
        order = self.epoch_order()
        per = self.per_rank
        total = per * self.world_size
        if total > len(order) and len(order):
            order = np.resize(order, total)  # wrap around, like DistributedSampler
        return order[self.rank * per : (self.rank + 1) * per]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def batches(self, batch_size: int, *, drop_last: bool = False) -> list[np.ndarray]:
        """This rank's indices cut into batches of ``batch_size``."""
        order = self.indices()
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        return [order[i : i + batch_size] for i in range(0, stop, batch_size)]


def iter_batches(
    path: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    fields: Sequence[str] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield one epoch of a split as dicts of numpy arrays (for JAX, NumPy or anything else).

    Batches follow the chunk-aware order (``shuffle``) or the file order, so each batch costs
    one or two contiguous reads. Text fields come back as object arrays of ``str``.

    Raises:
        ReaderError: the split or a field is missing.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    release = Release(path, split, fields=fields, batch_size=batch_size)
    sampler = ChunkSampler(len(release), release.chunk_rows, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    with release:
        for batch in sampler.batches(batch_size, drop_last=drop_last):
            yield release.read(batch)
