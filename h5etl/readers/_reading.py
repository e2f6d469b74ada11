"""Reading rows of a release: slices, gathers, background prefetch and ``iter_batches``.

``_Reading`` is a mixin of ``Release`` (see ``_core``), which holds the open handles it reads.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING

import h5py
import numpy as np

from h5etl.format.contract import LayoutRecord
from h5etl.readers import _fork
from h5etl.readers._ahead import prefetched
from h5etl.readers._chunks import ChunkStore
from h5etl.readers._fields import as_int64, channel_fields
from h5etl.readers._fields import channels_last as _channels_last
from h5etl.readers._fork import _gated
from h5etl.readers._layout import FieldInfo, MappedChunks, runs
from h5etl.readers._ragged import ragged_gather, ragged_slice
from h5etl.readers._sampler import ChunkSampler


class _Reading:
    """The read methods of ``Release``; the attributes below are set by ``Release``."""

    if TYPE_CHECKING:
        length: int
        batch_size: int
        layout: LayoutRecord
        fields: tuple[str, ...]
        info: dict[str, FieldInfo]
        ragged: dict[str, str]
        _widen: frozenset[str]
        _offsets: dict[str, np.ndarray]

        @property
        def chunk_rows(self) -> int: ...

        def __len__(self) -> int: ...

        def _handles(
            self,
        ) -> tuple[dict[str, h5py.Dataset], dict[str, MappedChunks], dict[str, ChunkStore]]: ...

    @_gated
    def read_slice(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``start:stop`` of every field, one contiguous read per field.

        The bounds work as Python slicing of a sequence of ``len(self)`` rows does: a negative
        value counts from the end, values past either end are clipped to it, and ``stop`` at or
        before ``start`` gives zero rows. Every field comes back with the same number of rows,
        whatever the codec, so ``read_slice(0, n)`` reads at most the whole split.

        Parameters:
            start: the first row (negative: from the end).
            stop: the row after the last (negative: from the end).

        Returns:
            Field name -> array of ``len(range(len(self))[start:stop])`` rows.

        Raises:
            TypeError: ``start`` or ``stop`` is not an integer.
        """
        start, stop, _ = slice(start, stop).indices(self.length)
        stop = max(start, stop)  # slice.indices leaves stop < start for an empty slice
        out = {}
        datasets, maps, stores = self._handles()
        for name, dataset in datasets.items():
            info = self.info[name]
            if info.text:
                out[name] = dataset.asstr()[start:stop]
                continue
            if name in self.ragged:
                out[name] = ragged_slice(dataset, self._offsets[name], start, stop)
                continue
            block = np.empty((stop - start, *info.shape), dtype=info.dtype)
            reader = maps.get(name) or stores.get(name)
            if reader is not None:
                reader.read_into(block, start, stop, 0)
            elif stop > start:
                dataset.read_direct(block, np.s_[start:stop])
            out[name] = block
        return as_int64(out, self._widen)

    @_gated
    def read(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``indices`` (any order, repeats allowed), returned in that order.

        Unfiltered fields are gathered straight from the mapped chunks (one copy); compressed
        fields from their decoded chunks (each chunk decoded once, several in parallel, kept
        in a small cache), or, for a few rows of a Blosc chunk the full cache does not hold,
        from just the blocks holding them (a random sample costs two or three blocks, not its
        chunk). Fields neither path understands go through HDF5: the indices are sorted and
        cut into contiguous runs, each run one slice read.
        """
        wanted = self._checked(indices)
        datasets, maps, stores = self._handles()
        out = {n: m.gather(wanted, self.info[n]) for n, m in maps.items()}
        out.update((n, s.gather(wanted)) for n, s in stores.items())
        out.update((n, ragged_gather(datasets[n], self._offsets[n], wanted)) for n in self.ragged)
        rest = [n for n in self.fields if n not in out]
        if not rest:
            return as_int64(out, self._widen)
        if len(wanted) == 1:  # one sample: no sorting to do (a random read's usual case)
            unique, inverse, in_order = wanted, wanted, True
            pieces = [(0, int(wanted[0]), int(wanted[0]) + 1)]
        else:
            unique, inverse = np.unique(wanted, return_inverse=True)
            pieces = runs(unique)
            in_order = len(unique) == len(wanted) and bool(np.array_equal(unique, wanted))
        batch = self._read_runs(datasets, pieces, len(unique), rest)
        for name in rest:
            out[name] = batch[name] if in_order else batch[name][inverse]
        return as_int64({n: out[n] for n in self.fields}, self._widen)

    @_gated
    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Start decoding the compressed chunks holding ``indices`` in the background.

        Returns at once; a later ``read`` of those rows finds them decoded (or waits for the
        decode already running). A no-op for fields read through mmap or HDF5.
        """
        wanted = self._checked(indices)
        for store in self._handles()[2].values():
            store.prefetch(wanted)

    def iter_batches(
        self,
        batch_size: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
        drop_last: bool = False,
        prefetch: int = 4,
        channels_last: bool = False,
    ) -> Generator[dict[str, np.ndarray], None, None]:
        """Yield one epoch of this split as dicts of numpy arrays; the release stays open.

        Batches follow the chunk-aware order (``shuffle``) or the file order and are cut on
        chunk boundaries (see ``ChunkSampler.batches``), so each costs one contiguous read per
        field. Text fields come back as object arrays of ``str``. With ``prefetch`` > 0,
        background threads (at most one per CPU) read up to that many batches ahead while you
        use the current one, so memory holds ``prefetch`` more batches; compressed chunks
        decode in parallel there. Batches still come in order, a reading error is raised
        here, and the threads stop when the iterator is closed or dropped. ``prefetch=0``
        reads on demand, as does a release whose fields are all uncompressed (mmap copies are
        faster in one thread). Decoded chunks stay in this reader's cache for later epochs
        as far as ``cache_bytes`` allows. ``batch_size`` defaults to the reader's, which
        sized its cache: a larger one may decode chunks twice. Images and masks come as
        stored, channels first (N, C, H, W); ``channels_last=True`` gives them as
        (N, H, W, C), a transposed view of the same rows (JAX/Flax and Keras take those).
        """
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        sampler = ChunkSampler(len(self), self.chunk_rows, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        batches = sampler.batches(batch_size, drop_last=drop_last)
        with _fork._GATE.reading():  # this may open the file: a fork must not copy it half-open
            mapped = self._handles()[1]
        read: Iterator[dict[str, np.ndarray]]
        if prefetch and len(mapped) < len(self.fields):  # mmap alone gains nothing from it
            read = prefetched(self.read, batches, prefetch)
        else:
            read = map(self.read, batches)
        if not channels_last:
            yield from read
            return
        moved = channel_fields(self.layout, self.fields)
        for batch in read:
            yield _channels_last(batch, moved)

    def _checked(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        if wanted.size and (wanted.min() < -self.length or wanted.max() >= self.length):
            raise IndexError(f"index out of range for {self.length} samples")
        return np.where(wanted < 0, wanted + self.length, wanted)

    def _read_runs(
        self,
        datasets: dict[str, h5py.Dataset],
        pieces: list[tuple[int, int, int]],
        total: int,
        names: list[str],
    ) -> dict[str, np.ndarray]:
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
