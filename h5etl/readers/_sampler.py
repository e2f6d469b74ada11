"""Chunk-aware epoch orders: shuffled enough to train on, local enough to read fast.

Pure numpy; no file is opened here. A release stores samples in chunks of ``chunk_rows``
(the last one possibly short); reading one sample of a compressed chunk costs decompressing
the whole chunk, so an order that keeps each chunk's rows together costs one decompression
per chunk per epoch instead of one per sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np


class ChunkSampler:
    """Epoch orders that keep each chunk's rows together, seeded per epoch.

    With ``shuffle`` the chunks come in a random order and the rows inside each chunk in a
    random order (both drawn from ``(seed, epoch)``); without it the order is the file order,
    which is a valid epoch order for a release shuffled at write time. Iterating yields this
    rank's sample indices (a ``torch`` ``sampler=``); ``batches()`` and ``batch_sampler()``
    cut them into batches on chunk boundaries.

    Distributed: with ``world_size > 1`` every rank gets an equal, contiguous share of the
    epoch (padded by wrapping around like ``DistributedSampler``, or trimmed with
    ``drop_last``), so all ranks run the same number of batches. All ranks must use the same
    ``seed`` and call ``set_epoch(n)`` before each epoch.
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
    def for_release(cls, release: Any, **kwargs: Any) -> ChunkSampler:
        """A sampler for a ``Release`` (or anything with a ``release``, like ``H5Dataset``)."""
        source = getattr(release, "release", release)
        return cls(len(source), source.chunk_rows, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields."""
        self.epoch = epoch

    def chunks(self) -> list[np.ndarray]:
        """The epoch's chunks in visiting order, each as its row indices in visiting order."""
        starts = range(0, self.length, self.chunk_rows)
        if not self.shuffle:
            return [np.arange(s, min(s + self.chunk_rows, self.length)) for s in starts]
        rng = np.random.default_rng([self.seed, self.epoch])
        out = []
        for start in rng.permutation(len(starts)) * self.chunk_rows:
            stop = min(int(start) + self.chunk_rows, self.length)
            out.append(int(start) + rng.permutation(stop - int(start)))
        return out

    def epoch_order(self) -> np.ndarray:
        """The whole epoch's order, before it is shared out between ranks."""
        parts = self.chunks()
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    @property
    def per_rank(self) -> int:
        """Samples each rank yields per epoch when iterated."""
        if self.drop_last:
            return self.length // self.world_size
        return math.ceil(self.length / self.world_size)

    def __len__(self) -> int:
        return self.per_rank

    def indices(self) -> np.ndarray:
        """This rank's share of the epoch order."""
        return _share(self.epoch_order(), self.rank, self.world_size, self.per_rank)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def batches(self, batch_size: int, *, drop_last: bool | None = None) -> list[np.ndarray]:
        """This rank's batches for the epoch, cut so that no batch straddles the short chunk.

        Batches are cut every ``batch_size`` rows of the epoch order, except that the file's
        last, short chunk ends its batch early: otherwise every later batch would straddle two
        chunks, and with several loader workers each straddled chunk is decompressed twice.
        With ``batch_size`` a multiple (or divisor) of ``chunk_rows`` every batch then reads
        whole chunks. Ranks share out whole batches, the same number each.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        drop = self.drop_last if drop_last is None else drop_last
        out: list[np.ndarray] = []
        pending = np.zeros(0, dtype=np.int64)
        for rows in self.chunks():
            pending = np.concatenate([pending, rows])
            while len(pending) >= batch_size:
                out.append(pending[:batch_size])
                pending = pending[batch_size:]
            if len(rows) < self.chunk_rows and len(pending):
                out.append(pending)
                pending = pending[:0]
        if len(pending):
            out.append(pending)
        if drop:
            out = [b for b in out if len(b) == batch_size]
        per = len(out) // self.world_size if drop else math.ceil(len(out) / self.world_size)
        picked = _share(np.arange(len(out)), self.rank, self.world_size, per)
        return [out[i] for i in picked.tolist()]

    def batch_sampler(self, batch_size: int, *, drop_last: bool | None = None) -> BatchSampler:
        """An iterable of index lists for ``DataLoader(batch_sampler=...)``."""
        return BatchSampler(self, batch_size, drop_last=drop_last)


def _share(order: np.ndarray, rank: int, world_size: int, per: int) -> np.ndarray:
    """Rank ``rank``'s contiguous ``per`` items of ``order``, wrapping around to pad."""
    total = per * world_size
    if total > len(order) and len(order):
        order = np.resize(order, total)
    return order[rank * per : (rank + 1) * per]


class BatchSampler:
    """Chunk-aligned batches of a :class:`ChunkSampler`, as lists (a torch ``batch_sampler``).

    Its length can change by one between epochs (where the short chunk falls decides whether
    it shares a batch); every rank always gets the same number of batches.
    """

    def __init__(self, sampler: ChunkSampler, batch_size: int, *, drop_last: bool | None = None):
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches the next iteration yields."""
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.sampler.batches(self.batch_size, drop_last=self.drop_last):
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.sampler.batches(self.batch_size, drop_last=self.drop_last))
