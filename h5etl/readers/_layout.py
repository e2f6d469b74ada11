"""How a release's datasets are laid out, and what that means for reading them.

Chunk-cache sizing from the chunk shape, the per-field facts a reader needs, and the ``mmap``
path for unfiltered chunks. No open-file state lives here (see ``_core``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

DEFAULT_NSLOTS = 521  # HDF5's own default
MAX_NSLOTS = 1 << 20


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
    100 times the number of chunks that fit, as the HDF5 documentation recommends, capped near
    ``MAX_NSLOTS`` (HDF5 allocates every slot when it opens the dataset). Unfiltered
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
    return CacheSize(nbytes=held * chunk_bytes, nslots=_slots(held))


def decoded_nbytes(chunks: tuple[int, ...] | None, itemsize: int, shape: tuple[int, ...]) -> int:
    """Bytes of all chunks of a dataset of ``shape``, decoded (edge chunks count whole)."""
    if chunks is None:
        return math.prod(shape) * itemsize
    count = math.prod(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
    return count * math.prod(chunks) * itemsize


def widened(
    cache: CacheSize, nbytes: int, chunks: tuple[int, ...] | None, itemsize: int
) -> CacheSize:
    """``cache`` grown to hold ``nbytes`` (never shrunk), with hash slots to match."""
    if nbytes <= cache.nbytes or chunks is None:
        return cache
    held = math.ceil(nbytes / (math.prod(chunks) * itemsize))
    return CacheSize(nbytes=nbytes, nslots=_slots(held), w0=cache.w0)


def _slots(held: int) -> int:
    """Hash slots for ``held`` chunks: a prime near 100 per chunk, capped near ``MAX_NSLOTS``."""
    # HDF5 allocates every slot when it opens the dataset: 8 bytes each, so cap them.
    return next_prime(min(100 * held, MAX_NSLOTS))


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes this process could still get: Linux ``MemAvailable``, and the cgroup's headroom.

    In a container (Docker, Kubernetes, SLURM) ``MemAvailable`` is the host's; the cgroup
    limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) minus its usage is what the
    kernel's OOM killer goes by. None where neither can be read (not Linux).
    """
    found = [v for v in (_meminfo_available(root), _cgroup_headroom(root)) if v is not None]
    return min(found, default=None)


def _meminfo_available(root: Path) -> int | None:
    try:
        for line in (root / "proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(root: Path) -> int | None:
    """The memory cgroup's limit minus its usage, or None when unlimited or unknown."""
    try:
        lines = (root / "proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, limit_name, usage_name = "sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base = "sys/fs/cgroup/memory"
            limit_name, usage_name = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        # With a cgroup namespace the process sees its own cgroup as the root.
        for folder in (root / base / path.lstrip("/"), root / base):
            try:
                limit = (folder / limit_name).read_text(encoding="ascii").strip()
                usage = int((folder / usage_name).read_text(encoding="ascii"))
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as ~2**63
                return None
            return max(0, int(limit) - usage)
    return None


def open_dataset(group: h5py.Group, name: str, cache: CacheSize | None) -> h5py.Dataset:
    """Open ``group[name]`` (a name, or a path from the file) with its own chunk cache.

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


def field_info(dataset: h5py.Dataset, name: str | None = None) -> FieldInfo:
    """What to allocate for ``dataset``; ``name`` is its field (default: the last path part)."""
    text = h5py.check_string_dtype(dataset.dtype) is not None
    return FieldInfo(
        name=name if name is not None else dataset.name.rsplit("/", 1)[-1],
        shape=tuple(dataset.shape[1:]),
        dtype=np.dtype(object) if text else dataset.dtype,
        chunks=dataset.chunks,
        text=text,
        filtered=text or _filtered(dataset),
    )


class MappedChunks:
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
                raise NotMappable
            raw = memory[store.byte_offset : store.byte_offset + nbytes]
            self.chunks[store.chunk_offset[0]] = raw.view(info.dtype).reshape(chunk_shape)

        dataset.id.chunk_iter(visit)
        if len(self.chunks) != math.ceil(self.length / self.rows):
            raise NotMappable  # unallocated chunks (fill values): let HDF5 handle them

    def gather(self, indices: np.ndarray, info: FieldInfo) -> np.ndarray:
        """Rows at ``indices`` in that order: one copy, one fancy take per chunk touched."""
        return gather_rows(indices, self.rows, info.shape, info.dtype, self._chunks_at)

    def read_into(self, out: np.ndarray, start: int, stop: int, pos: int) -> None:
        copy_rows(out, start, stop, pos, self.rows, self._chunks_at, length=self.length)

    def _chunks_at(self, bases: list[int]) -> dict[int, np.ndarray]:
        return {base: self.chunks[base] for base in bases}


ChunksAt = Callable[[list[int]], dict[int, np.ndarray]]
"""The chunks starting at the given rows, by starting row (mapped, or decoded)."""


def gather_rows(
    indices: np.ndarray,
    rows: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks_at: ChunksAt,
) -> np.ndarray:
    """Rows at ``indices`` in that order from chunks of ``rows`` rows: one take per chunk."""
    bases = indices - indices % rows
    if len(indices) and bases.min() == bases.max():  # the usual sampler batch: one chunk
        first = int(bases[0])
        taken: np.ndarray = chunks_at([first])[first][indices - first]
        return taken
    out = np.empty((len(indices), *shape), dtype=dtype)
    for base, chunk in chunks_at(np.unique(bases).tolist()).items():
        where = np.flatnonzero(bases == base)
        out[where] = chunk[indices[where] - base]
    return out


def copy_rows(
    out: np.ndarray,
    start: int,
    stop: int,
    pos: int,
    rows: int,
    chunks_at: ChunksAt,
    *,
    length: int,
) -> None:
    """Rows ``start:stop`` from chunks of ``rows`` rows copied into ``out[pos:]``.

    ``start:stop`` must lie within the dataset's ``length`` rows: a stored edge chunk is
    whole, so rows past the end would be its padding, not data.
    """
    if not 0 <= start <= stop <= length:
        raise IndexError(f"rows {start}:{stop} are not within the {length} rows of the field")
    bases = list(range(start - start % rows, stop, rows))
    for base, chunk in chunks_at(bases).items():
        lo, hi = max(start, base), min(stop, base + rows)
        out[pos + lo - start : pos + hi - start] = chunk[lo - base : hi - base]


class NotMappable(Exception):
    """The layout cannot be read through mmap; HDF5 reads it instead."""


def map_chunks(
    dataset: h5py.Dataset, path: Path, info: FieldInfo, memory: list[np.memmap[Any, Any]]
) -> MappedChunks | None:
    if info.filtered or info.chunks is None or not hasattr(dataset.id, "chunk_iter"):
        return None
    try:
        if not memory:
            memory.append(np.memmap(path, mode="r", dtype=np.uint8))
        return MappedChunks(dataset, memory[0], info)
    except (NotMappable, OSError, ValueError):
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


def cache_request(value: Any) -> int | Literal["split"] | None:
    """``cache_bytes`` checked: None, ``"split"`` or a byte count >= 0."""
    if value is None:
        return None
    if isinstance(value, str):
        if value == "split":
            return "split"
        raise ValueError(f"cache_bytes must be an int, 'split' or None, got {value!r}")
    if isinstance(value, bool):
        raise TypeError(f"cache_bytes must be an int, 'split' or None, got {value!r}")
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(
            f"cache_bytes must be an int, 'split' or None, got {type(value).__name__} {value!r}"
        ) from None
    if count < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {count}")
    return count
