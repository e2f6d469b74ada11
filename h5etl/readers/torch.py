"""PyTorch integration: a map-style ``Dataset`` over one split of a release.

Import this module only when you use PyTorch (``h5etl.readers`` imports it lazily).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from h5etl.readers._core import CacheBytes, Release
from h5etl.readers._sampler import BatchSampler, ChunkSampler
from h5etl.readers._source import CacheDir

Sample = dict[str, Any]


class H5Dataset(torch.utils.data.Dataset[Any]):
    """One split of a release as a PyTorch map-style dataset; each item a dict of fields.

    Safe with ``num_workers > 0`` under fork and spawn and with ``persistent_workers``: the
    dataset pickles as a recipe (path, split, fields) and each process opens the file lazily on
    its first read. ``__getitems__`` lets the ``DataLoader`` fetch a batch with one slice read
    per contiguous run of indices; pair it with ``batch_sampler()`` (chunk-aligned batches) or
    ``sampler()`` (a :class:`ChunkSampler` for ``sampler=`` with the loader's ``batch_size``).

    Parameters:
        path: the release or its link; the link is resolved once, here.
        split: the group to read.
        fields: the datasets to read; default all but the ``source_sha256`` lineage.
        transform: applied to each sample dict (numpy arrays, ``str`` for text fields).
        batch_size: the largest batch the loader asks for; sizes the chunk cache.
        cache_bytes: decoded chunks kept per process (see :class:`Release`). With
            ``"split"`` and ``persistent_workers=True`` each worker decodes a chunk at most
            once over all epochs, as long as the split fits in its share of memory (half
            of what is available, divided among the workers and the main process).
        cache_dir: for a release on object storage (``s3://bucket/releases/cells.h5``), a
            directory that keeps the blocks read, shared by the loader's workers (see
            :class:`Release`). Each worker reads through its own handle.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str,
        *,
        fields: Sequence[str] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        batch_size: int = 32,
        cache_bytes: CacheBytes = None,
        cache_dir: CacheDir = None,
    ):
        self.release = Release(
            path,
            split,
            fields=fields,
            batch_size=batch_size,
            cache_bytes=cache_bytes,
            cache_dir=cache_dir,
        )
        self.transform = transform

    @property
    def path(self) -> str:
        """The release file this dataset reads (the link target, resolved at construction)."""
        return str(self.release.path)

    def __len__(self) -> int:
        return len(self.release)

    def _samples(self, batch: dict[str, np.ndarray], count: int) -> list[Any]:
        samples: list[Any] = [{k: v[i] for k, v in batch.items()} for i in range(count)]
        if self.transform is not None:
            samples = [self.transform(s) for s in samples]
        return samples

    def _read(self, indices: list[int]) -> dict[str, np.ndarray]:
        if not self.release.is_open:  # first read in this process: count who shares memory
            worker = torch.utils.data.get_worker_info()
            self.release.processes = 1 if worker is None else worker.num_workers + 1
        return self.release.read(indices)

    def __getitem__(self, index: int) -> Any:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        return self._samples(self._read([index]), 1)[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return self._samples(self._read(indices), len(indices))

    def sampler(self, **kwargs: Any) -> ChunkSampler:
        """A :class:`ChunkSampler` for this dataset (``shuffle``, ``seed``, ``rank``, ...)."""
        return ChunkSampler.for_release(self.release, **kwargs)

    def batch_sampler(self, batch_size: int, **kwargs: Any) -> BatchSampler:
        """Chunk-aligned batches for ``DataLoader(batch_sampler=...)``; kwargs as ``sampler``."""
        drop_last = kwargs.pop("drop_last", None)
        return self.sampler(**kwargs).batch_sampler(batch_size, drop_last=drop_last)

    def close(self) -> None:
        """Close this process's file handle (the next read reopens it)."""
        self.release.close()

    def __enter__(self) -> H5Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
