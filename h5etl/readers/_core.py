"""The framework-free core of the readers: cache sizing, a per-process handle, the sampler.

A reader holds a *recipe* for opening a release (its resolved path, a split, field names and
cache sizes), never an open file across processes: the HDF5 handle is opened lazily, at most
once per process (checked by pid), so fork, spawn and persistent workers each open their own.
"""

from __future__ import annotations

import math
import multiprocessing.util
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc/Zstd filters for reading)
import numpy as np

from h5etl.errors import H5EtlError
from h5etl.readers._sampler import ChunkSampler

LINEAGE = "source_sha256"
DEFAULT_NSLOTS = 521  # HDF5's own default
# Handles inherited through fork: never used nor closed in the child (closing would drop the
# parent's file lock on the shared descriptor), only kept alive so no destructor runs here.
_INHERITED: list[Any] = []
# Every Release holding an open handle; closed just before this process forks (see below).
_OPEN: weakref.WeakSet[Release] = weakref.WeakSet()


_LOCK = threading.Lock()  # two threads' first reads must not both open the file


def _fresh_lock_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a fork may copy it held by a thread that does not exist here


def _close_before_fork() -> None:
    """Close this process's handles so a forked child never inherits an open HDF5 file.

    HDF5 would otherwise find the file "already open" in the child's copy of the library and
    share the parent's state with it. The parent reopens lazily on its next read.
    """
    for release in list(_OPEN):
        release.close()


os.register_at_fork(before=_close_before_fork, after_in_child=_fresh_lock_in_child)


class ReaderError(H5EtlError):
    """A release cannot be read as asked (not HDF5, missing split or field, unequal lengths)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class CacheSize:
    """Chunk-cache settings for one dataset: bytes, hash slots and the eviction weight."""

    nbytes: int
    nslots: int
    # HDF5's default. Not 1.0: with HDF5 2.0, w0=1.0 never evicts chunks read row by row, so
    # the cache grows past nbytes without bound (measured: a 10 MiB cache held 150 MB).
    w0: float = 0.75


def next_prime(n: int) -> int:
    """The smallest prime >= ``n``."""
    candidate = max(n, 2)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


def cache_size(
    chunks: tuple[int, ...] | None,
    itemsize: int,
    *,
    batch_size: int,
    shape: tuple[int, ...] | None = None,
    filtered: bool = True,
    min_chunks: int = 2,
) -> CacheSize:
    """Cache settings that hold every chunk one batch of ``batch_size`` rows can touch.

    A batch of ``b`` consecutive rows in chunk-local order spans at most ``ceil(b/c) + 1``
    blocks of ``c`` rows (one more when it straddles a boundary); a block is one chunk, or
    several when the chunks also split the per-sample ``shape``. ``nslots`` is a prime about
    100 times the number of chunks that fit, as the HDF5 documentation recommends. Unfiltered
    (uncompressed) chunks get no cache: HDF5 then reads the asked rows straight into the
    caller's buffer, while a cache would copy every chunk twice.
    """
    if chunks is None or not filtered:
        return CacheSize(nbytes=0, nslots=DEFAULT_NSLOTS)
    rows = chunks[0]
    inner = shape if shape is not None else chunks[1:]
    per_block = math.prod(math.ceil(s / c) for s, c in zip(inner, chunks[1:], strict=True))
    held = max(min_chunks, (math.ceil(batch_size / rows) + 1) * per_block)
    chunk_bytes = math.prod(chunks) * itemsize
    return CacheSize(nbytes=held * chunk_bytes, nslots=next_prime(100 * held))


def _open_dataset(group: h5py.Group, name: str, cache: CacheSize | None) -> h5py.Dataset:
    """Open ``group[name]`` with its own chunk cache.

    HDF5 keeps one cache per dataset *per process*: a second opening of the same dataset in
    the same process shares the first one's cache and its size.
    """
    if cache is None:
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
    filtered: bool  # stored bytes differ from the array's bytes (compression, shuffle > 1 byte)


def _filtered(dataset: h5py.Dataset) -> bool:
    plist = dataset.id.get_create_plist()
    ids = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
    if dataset.dtype.itemsize == 1:
        ids.discard(h5py.h5z.FILTER_SHUFFLE)  # byte shuffle of 1-byte items is the identity
    return bool(ids)


def _field_info(dataset: h5py.Dataset) -> FieldInfo:
    text = h5py.check_string_dtype(dataset.dtype) is not None
    return FieldInfo(
        name=dataset.name.rsplit("/", 1)[-1],
        shape=tuple(dataset.shape[1:]),
        dtype=np.dtype(object) if text else dataset.dtype,
        chunks=dataset.chunks,
        text=text,
        filtered=text or _filtered(dataset),
    )


class _MappedChunks:
    """Unfiltered chunks read through ``mmap``: a batch costs what a ``.npy`` memmap costs.

    Releases are never modified after publication, so the chunk offsets HDF5 reports stay
    valid for the life of the handle (even after the link moves or the file is unlinked).
    """

    def __init__(self, dataset: h5py.Dataset, memory: np.memmap[Any, Any], info: FieldInfo):
        assert info.chunks is not None
        self.rows = info.chunks[0]
        self.length = len(dataset)
        chunk_shape = (self.rows, *info.shape)
        nbytes = math.prod(chunk_shape) * info.dtype.itemsize
        self.chunks: dict[int, np.ndarray] = {}

        def visit(store: Any) -> None:
            if store.size != nbytes or store.byte_offset is None:
                raise _NotMappable
            raw = memory[store.byte_offset : store.byte_offset + nbytes]
            self.chunks[store.chunk_offset[0]] = raw.view(info.dtype).reshape(chunk_shape)

        dataset.id.chunk_iter(visit)
        if len(self.chunks) != math.ceil(self.length / self.rows):
            raise _NotMappable  # unallocated chunks (fill values): let HDF5 handle them

    def gather(self, indices: np.ndarray, info: FieldInfo) -> np.ndarray:
        """Rows at ``indices`` in that order: one copy, one fancy take per chunk touched."""
        bases = indices - indices % self.rows
        if len(indices) and bases.min() == bases.max():  # the usual sampler batch: one chunk
            first = int(bases[0])
            rows: np.ndarray = self.chunks[first][indices - first]
            return rows
        out = np.empty((len(indices), *info.shape), dtype=info.dtype)
        for base in np.unique(bases).tolist():
            where = np.flatnonzero(bases == base)
            out[where] = self.chunks[base][indices[where] - base]
        return out

    def read_into(self, out: np.ndarray, start: int, stop: int, pos: int) -> None:
        while start < stop:
            base = start - start % self.rows
            end = min(stop, base + self.rows)
            out[pos : pos + end - start] = self.chunks[base][start - base : end - base]
            pos, start = pos + end - start, end


class _NotMappable(Exception):
    """The layout cannot be read through mmap; HDF5 reads it instead."""


def _mapped(
    dataset: h5py.Dataset, path: Path, info: FieldInfo, memory: list[np.memmap[Any, Any]]
) -> _MappedChunks | None:
    if info.filtered or info.chunks is None or not hasattr(dataset.id, "chunk_iter"):
        return None
    try:
        if not memory:
            memory.append(np.memmap(path, mode="r", dtype=np.uint8))
        return _MappedChunks(dataset, memory[0], info)
    except (_NotMappable, OSError, ValueError):
        return None


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
        try:
            handle = h5py.File(self.path, "r")
        except (OSError, ValueError) as exc:
            raise ReaderError(f"cannot open as HDF5: {exc}", path=os.fspath(path)) from exc
        with handle:
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
            n: cache_size(
                i.chunks,
                i.dtype.itemsize,
                batch_size=batch_size,
                shape=i.shape,
                filtered=i.filtered,
            )
            for n, i in self.info.items()
            if not i.text
        }
        self._pid: int | None = None
        self._file: h5py.File | None = None
        self._datasets: dict[str, h5py.Dataset] = {}
        self._maps: dict[str, _MappedChunks] = {}
        self.use_mmap = True

    def _group(self, handle: h5py.File) -> h5py.Group:
        group = handle.get(self.split)
        if not isinstance(group, h5py.Group) or self.split == "diagnostics":
            splits = ", ".join(k for k in handle if k != "diagnostics")
            raise ReaderError(f"no split {self.split!r}; the release has: {splits}", path=self.path)
        return group

    @property
    def chunk_rows(self) -> int:
        """The largest rows-per-chunk of the array fields: the unit the sampler keeps together."""
        rows = [i.chunks[0] for i in self.info.values() if i.chunks and not i.text]
        return max(rows, default=1)

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in {"_file", "_datasets", "_maps"}}
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._file, self._datasets, self._maps = None, {}, {}

    def datasets(self) -> dict[str, h5py.Dataset]:
        """The open datasets of this process, opening the file on first use after a fork."""
        if self._file is not None and self._pid == os.getpid():
            return self._datasets
        with _LOCK:
            if self._file is not None and self._pid == os.getpid():
                return self._datasets
            return self._open()

    def _open(self) -> dict[str, h5py.Dataset]:
        pid = os.getpid()
        if self._file is not None:  # inherited through fork: the parent's, not ours
            _INHERITED.append((self._file, self._datasets, self._maps))
        self._file, self._datasets, self._maps = None, {}, {}
        handle = h5py.File(self.path, "r")
        try:
            group = self._group(handle)
            datasets = {n: _open_dataset(group, n, self.caches.get(n)) for n in self.fields}
            memory: list[np.memmap[Any, Any]] = []
            maps = {
                n: m
                for n, d in datasets.items()
                if self.use_mmap and (m := _mapped(d, self.path, self.info[n], memory))
            }
        except BaseException:
            handle.close()
            raise
        self._file, self._datasets, self._maps, self._pid = handle, datasets, maps, pid
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
            self._close_file(self._file)
        self._file, self._datasets, self._maps, self._pid = None, {}, {}, None
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
                continue
            block = np.empty((stop - start, *info.shape), dtype=info.dtype)
            if name in self._maps:
                self._maps[name].read_into(block, start, stop, 0)
            elif stop > start:
                dataset.read_direct(block, np.s_[start:stop])
            out[name] = block
        return out

    def read(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``indices`` (any order, repeats allowed), returned in that order.

        HDF5 fields: the indices are sorted and cut into contiguous runs, each run one slice
        read, so a batch from the chunk-aware sampler costs one read, not one per row.
        Unfiltered fields are gathered straight from the mapped chunks (one copy).
        """
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        if wanted.size and (wanted.min() < -self.length or wanted.max() >= self.length):
            raise IndexError(f"index out of range for {self.length} samples")
        wanted = np.where(wanted < 0, wanted + self.length, wanted)
        self.datasets()
        out = {n: self._maps[n].gather(wanted, self.info[n]) for n in self._maps}
        rest = [n for n in self.fields if n not in out]
        if not rest:
            return out
        unique, inverse = np.unique(wanted, return_inverse=True)
        pieces = runs(unique)
        in_order = len(unique) == len(wanted) and bool(np.array_equal(unique, wanted))
        batch = self._read_runs(pieces, len(unique), rest)
        for name in rest:
            out[name] = batch[name] if in_order else batch[name][inverse]
        return {n: out[n] for n in self.fields}

    def _read_runs(
        self, pieces: list[tuple[int, int, int]], total: int, names: list[str]
    ) -> dict[str, np.ndarray]:
        datasets = self.datasets()
        out: dict[str, np.ndarray] = {}
        for name in names:
            dataset, info = datasets[name], self.info[name]
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

    Batches follow the chunk-aware order (``shuffle``) or the file order and are cut on chunk
    boundaries (see ``ChunkSampler.batches``), so each costs one contiguous read per field.
    Text fields come back as object arrays of ``str``.

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
