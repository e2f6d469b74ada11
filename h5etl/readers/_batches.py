"""``iter_batches``: one epoch of a split as dicts of numpy arrays, the reader opened and
closed around it (for JAX, NumPy or anything else)."""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence

import numpy as np

from h5etl.readers._core import Release
from h5etl.readers._source import CacheDir

__all__ = ["iter_batches"]


def iter_batches(
    path: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    fields: Sequence[str] | None = None,
    cache_dir: CacheDir = None,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
    prefetch: int = 4,
    channels_last: bool = False,
) -> Generator[dict[str, np.ndarray], None, None]:
    """Yield one epoch of a split as dicts of numpy arrays (for JAX, NumPy or anything else).

    Opens the release, reads one epoch with :meth:`Release.iter_batches` (which see for the
    arguments) and closes it. For several epochs that should share decoded chunks, keep one
    ``Release(path, split, cache_bytes="split")`` and call its ``iter_batches`` per epoch.

    Raises:
        ReaderError: the split or a field is missing.
    """
    release = Release(path, split, fields=fields, batch_size=batch_size, cache_dir=cache_dir)
    with release:
        yield from release.iter_batches(
            batch_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            drop_last=drop_last,
            prefetch=prefetch,
            channels_last=channels_last,
        )
