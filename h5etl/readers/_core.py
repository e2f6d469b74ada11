"""The framework-free core of the readers: a per-process handle and ``iter_batches``.

A reader holds a *recipe* for opening a release (its resolved path, a split, field names and
cache sizes), never an open file across processes: the HDF5 handle is opened lazily, at most
once per process (checked by pid), so fork, spawn and persistent workers each open their own.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, SupportsIndex

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc/Zstd filters for reading)
import numpy as np

from h5etl.format.contract import LayoutRecord
from h5etl.format.reader_hints import hints_of
from h5etl.readers import _fork
from h5etl.readers._chunks import (
    ChunkCache,
    ChunkStore,
    open_stores,
)
from h5etl.readers._fields import resolve
from h5etl.readers._fork import _INHERITED
from h5etl.readers._layout import (
    CacheSize,
    MappedChunks,
    available_memory,
    cache_request,
    cache_size,
    decoded_nbytes,
    map_chunks,
    open_dataset,
    widened,
)
from h5etl.readers._reading import _Reading
from h5etl.readers._source import CacheDir, ReleaseFile
from h5etl.remote.reading import RemoteFile

logger = logging.getLogger(__name__)

CacheBytes = SupportsIndex | Literal["split"] | None  # numpy integers count as bytes too
_PER_PROCESS = frozenset(
    {"_file", "_datasets", "_maps", "_stores", "_decoded", "_finalizer", "_offsets"}
)


def __getattr__(name: str) -> Any:
    """``_LOCK`` and ``_GATE`` live in ``_fork``, which a fork rebinds them in: looked up there."""
    if name in ("_LOCK", "_GATE"):
        return getattr(_fork, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Release(_Reading):
    """A picklable recipe for reading one split of a release, opened lazily once per process.

    Parameters:
        path: the release file or its link; the link is resolved once, here, so a reader keeps
            reading the release it started with even if the link is swapped meanwhile. Or a
            release on object storage, ``s3://bucket/releases/cells.h5`` (its pointer
            ``cells.h5.json`` read once, here, and the file it names pinned likewise) or a
            versioned ``.../cells-v0007.h5``: read by range reads, in blocks kept in memory
            (``_source.REMOTE_BLOCKS`` of ``REMOTE_BLOCK_SIZE`` per process).
        split: the split to read, e.g. ``"train"``.
        fields: the fields to read; default every field the release's layout record lists
            (the ``source_sha256`` lineage is none, but may be asked for by name). Each is
            read from the dataset the record names (``/train/image``, or ``/x_train`` for
            the template ``{field}_{split}``).
        batch_size: the largest batch you will ask for; sizes the chunk cache.
        cache_bytes: decoded chunks of the compressed array fields kept per process.
            ``None`` (the default): the chunks one batch touches, so every epoch decodes every
            chunk again. Once the cache is full, reading a few rows of a chunk it does not
            hold decodes only their part where the codec allows it (Blosc, the default: the
            blocks holding them) and keeps nothing; a chunk met again within the next read
            is decoded whole and kept, so rows read in order still cost a decode a chunk.
            ``"split"``: the whole split decoded (``decoded_nbytes``), so each chunk is
            decoded once per process and later epochs read at memory speed; but at
            most half the memory available (cgroup limits included) divided among
            ``processes``, worked out in each process when it opens the file, with a warning
            when that is less. Every process that reads holds its own cache (each DataLoader
            worker; keep them with ``persistent_workers``). An ``int``: that many bytes per
            process, never fewer than the default. Below the split's size the least recently
            used chunks go first, which gains nothing for epochs read in file order.
        cache_dir: for a release on object storage, a directory to keep the blocks read in
            (``h5etl.remote.cache.DiskCache``; a path gets the default bound, 16 GiB), named
            by the release's SHA-256 and shared by every process and later reader; least
            recently used blocks go first. Ignored for a local file.

    Attributes:
        layout: the release's ``fileformat.LayoutRecord`` (inferred for older releases).
        classes: label field -> its class names (the int64 values index them).
        stats: field -> its statistics attributes (``fileformat.STAT_ATTRS``: per-channel
            mean, std, min, max, count; ``HISTOGRAM_ATTRS`` for masks and labels); empty
            when the release stores none. Normalise with them without a pass over the data.

    Label fields come back as int64 arrays of shape ``(batch,)``, text fields as ``str``.

    Raises:
        ReaderError: the file, split or a field is missing, its layout record is damaged or
            newer than this h5etl reads, or the fields differ in length; a URL names no
            release, or the server failed a read however often it was asked
            (``RemoteReadFailed``, later, from a read).
        ValueError: ``cache_bytes`` is negative or a word other than ``"split"``.
        TypeError: ``cache_bytes`` is not an int, ``"split"`` or None.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | ReleaseFile,
        split: str,
        *,
        fields: Sequence[str] | None = None,
        batch_size: int = 32,
        cache_bytes: CacheBytes = None,
        cache_dir: CacheDir = None,
    ):
        self.cache_bytes = cache_request(cache_bytes)
        # Processes reading this recipe at once (a loader's workers and their parent): the
        # memory cap of "split" is shared among them. H5Dataset sets it in its workers.
        self.processes = 1
        self.source = ReleaseFile.of(path, cache_dir)
        # the resolved file: a local Path, or the pinned file's URL
        self.path: Path | str = self.source.path or self.source.name
        self.split = split
        self.batch_size = batch_size
        with self.source.open() as handle:
            found = resolve(handle, self.path, split, fields)
        self.layout: LayoutRecord = found.layout
        self.paths = found.paths
        self.info = found.info
        self.length = found.length
        self.classes = found.classes
        self.stats = found.stats
        self._widen = found.widen
        self.ragged = found.ragged  # ragged column -> its offsets' path
        self.fields = tuple(found.paths)
        self.caches = {
            n: cache_size(
                i.chunks,
                i.dtype.itemsize,
                batch_size=batch_size,
                shape=i.shape,
                filtered=i.filtered,
            )
            for n, i in self.info.items()
            if not i.text and n not in self.ragged  # ragged values: HDF5's own cache
        }
        self._decoded: tuple[int, ChunkCache] | None = None  # (pid, cache): kept over a fork
        self._pid: int | None = None
        self._file: h5py.File | None = None
        # Closes _file at process exit; at most one per Release, cancelled when _file closes.
        self._finalizer: multiprocessing.util.Finalize | None = None
        self._datasets: dict[str, h5py.Dataset] = {}
        self._offsets: dict[str, np.ndarray] = {}  # ragged column -> its (N+1,) offsets
        self._maps: dict[str, MappedChunks] = {}
        self._stores: dict[str, ChunkStore] = {}
        self.use_mmap = True  # unfiltered chunks through mmap
        self.use_decoder = True  # filtered chunks decoded by imagecodecs, outside HDF5

    def _decoded_sizes(self) -> dict[str, int]:
        """Bytes of every decoded chunk, per compressed array field (those with a cache)."""
        return {
            n: decoded_nbytes(i.chunks, i.dtype.itemsize, (self.length, *i.shape))
            for n, i in self.info.items()
            if n in self.caches and self.caches[n].nbytes
        }

    @property
    def decoded_nbytes(self) -> int:
        """Bytes of every decoded chunk of the compressed array fields (``"split"`` asks this)."""
        return sum(self._decoded_sizes().values())

    def process_caches(self) -> dict[str, CacheSize]:
        """The cache of each array field in this process: the sized default, or ``cache_bytes``."""
        if self.cache_bytes is None:
            return self.caches
        budget = self._split_budget() if self.cache_bytes == "split" else self.cache_bytes
        return self._share(budget)

    def _split_budget(self) -> int:
        """The decoded split, or this process's share of half the free memory if less."""
        wanted = self.decoded_nbytes
        free = available_memory()
        if free is None:
            return wanted
        cap = free // 2 // max(1, self.processes)
        if wanted <= cap:
            return wanted
        logger.warning(
            "%s: the decoded %s split takes %.1f GiB, more than this process's share of half "
            "the %.1f GiB of memory available (%d reading processes); caching %.1f GiB: "
            "least recently used chunks go first, which gains nothing for sequential epochs",
            self.path,
            self.split,
            wanted / 2**30,
            free / 2**30,
            self.processes,
            cap / 2**30,
        )
        return cap

    def _share(self, budget: int) -> dict[str, CacheSize]:
        """The compressed fields' caches widened to ``budget`` bytes in all, by field size."""
        sizes = self._decoded_sizes()
        total = sum(sizes.values()) or 1
        return {
            n: widened(
                c, budget * sizes[n] // total, self.info[n].chunks, self.info[n].dtype.itemsize
            )
            if n in sizes
            else c
            for n, c in self.caches.items()
        }

    @property
    def chunk_rows(self) -> int:
        """The largest rows-per-chunk of the compressed fields and of the images and masks:
        the unit the sampler keeps together (1 when there are none: any order reads alike).

        The small columns (labels, values, a volume's spacing, ...) are chunked by bytes, up
        to thousands of rows a chunk, and never compressed: read through mmap, their rows
        cost the same in any order, so they do not widen the unit (nor Keras's batches).
        """
        columns = self.layout.storage
        rows = [
            i.chunks[0]
            for n, i in self.info.items()
            if i.chunks
            and not i.text
            and n not in self.ragged  # (those are rows of values)
            and (i.filtered or (n in columns and hints_of(columns[n]).channels_first))
        ]
        return max(rows, default=1)

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _PER_PROCESS}
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._file, self._datasets, self._maps, self._stores = None, {}, {}, {}
        self._decoded, self._finalizer, self._offsets = None, None, {}

    def datasets(self) -> dict[str, h5py.Dataset]:
        """The open datasets of this process, opening the file on first use after a fork."""
        if self._file is not None and self._pid == os.getpid():
            return self._datasets
        with _fork._LOCK:
            if self._file is not None and self._pid == os.getpid():
                return self._datasets
            return self._open()

    def _open(self) -> dict[str, h5py.Dataset]:
        pid = os.getpid()
        if self._file is not None:  # inherited through fork: the parent's, not ours
            _INHERITED.append((self._file, self._datasets, self._maps, self._stores))
        self._forget_finalizer()  # an inherited one would only be skipped here, at exit
        self._file, self._datasets, self._maps, self._stores = None, {}, {}, {}
        handle, remote = self.source.open_with_bytes()
        caches = self.process_caches()
        try:
            datasets = {n: open_dataset(handle, self.paths[n], caches.get(n)) for n in self.fields}
            offsets = {n: np.asarray(handle[p][...], np.int64) for n, p in self.ragged.items()}
            memory: list[np.memmap[Any, Any]] = []
            maps = {
                n: m
                for n, d in datasets.items()
                if self.use_mmap
                and self.source.path is not None
                and n not in self.ragged
                and (m := map_chunks(d, self.source.path, self.info[n], memory))
            }
            stores = self._open_stores(datasets, maps, caches, remote)
        except BaseException:
            handle.close()
            raise
        self._file, self._datasets, self._maps, self._pid = handle, datasets, maps, pid
        self._stores, self._offsets = stores, offsets
        _fork._OPEN.add(self)
        # Worker processes end through os._exit, which skips atexit; multiprocessing's own
        # finalizers still run there, so teardown closes the file in every process. Closing
        # cancels it: a reader reopened after every fork keeps one entry, not one per epoch.
        self._finalizer = multiprocessing.util.Finalize(
            self, Release._close_file, args=(handle,), exitpriority=10
        )
        return datasets

    def _open_stores(
        self,
        datasets: dict[str, h5py.Dataset],
        maps: dict[str, MappedChunks],
        caches: dict[str, CacheSize],
        remote: RemoteFile | None,
    ) -> dict[str, ChunkStore]:
        names = [
            n for n in datasets if n not in maps and not self.info[n].text and n not in self.ragged
        ]
        if not self.use_decoder or not names:
            return {}
        pid = os.getpid()
        if self._decoded is None or self._decoded[0] != pid:  # a forked child starts empty
            self._decoded = (pid, ChunkCache(0))
        cache = self._decoded[1]
        stores = open_stores(datasets, names, self.source.chunks(remote), cache)
        # As large as the HDF5 caches it stands in for; fields h5py reads keep their own.
        cache.nbytes = sum(caches[n].nbytes for n in stores)
        return stores

    def _handles(
        self,
    ) -> tuple[dict[str, h5py.Dataset], dict[str, MappedChunks], dict[str, ChunkStore]]:
        """This process's datasets, mapped and decoded fields, taken together.

        A read works on these references, so a ``close()`` from another thread (or before a
        fork) cannot swap them out halfway through a batch.
        """
        datasets = self.datasets()
        return datasets, self._maps, self._stores

    @staticmethod
    def _close_file(handle: h5py.File) -> None:
        if handle.id.valid:
            handle.close()

    @property
    def is_open(self) -> bool:
        """Whether this process holds an open handle."""
        return self._file is not None and self._pid == os.getpid() and bool(self._file.id.valid)

    def close(self) -> None:
        """Close this process's handle and drop its decoded chunks (a later read reopens)."""
        self._close_handles()
        self._decoded = None

    def _close_handles(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._close_file(self._file)
        self._forget_finalizer()
        # The decoded fields' mapping ends once no reading thread holds a view of it.
        for store in self._stores.values():
            store.closed = True
        self._file, self._datasets, self._maps, self._stores = None, {}, {}, {}
        self._offsets = {}
        self._pid = None
        _fork._OPEN.discard(self)

    def _forget_finalizer(self) -> None:
        """Take this reader's exit finalizer out of multiprocessing's registry."""
        if self._finalizer is not None:
            self._finalizer.cancel()
            self._finalizer = None

    def __enter__(self) -> Release:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
