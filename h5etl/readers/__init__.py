"""Read a release fast from PyTorch, Keras or plain numpy.

``iter_batches``, ``ChunkSampler``, ``BatchSampler``, ``Release`` and ``cache_size`` need
only h5py, numpy and imagecodecs (which decodes compressed chunks outside HDF5, in parallel).
``H5Dataset`` (PyTorch) and ``KerasDataset`` (Keras 3) import their framework on first use,
so ``import h5etl.readers`` works without either installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from h5etl.errors import ReaderError
from h5etl.readers._batches import iter_batches
from h5etl.readers._core import CacheBytes, Release
from h5etl.readers._layout import CacheSize, cache_size
from h5etl.readers._sampler import BatchSampler, ChunkSampler

if TYPE_CHECKING:
    from h5etl.readers.keras import KerasDataset
    from h5etl.readers.torch import H5Dataset

_LAZY = {"H5Dataset": "h5etl.readers.torch", "KerasDataset": "h5etl.readers.keras"}

__all__ = [
    "BatchSampler",
    "CacheBytes",
    "CacheSize",
    "ChunkSampler",
    "H5Dataset",
    "KerasDataset",
    "ReaderError",
    "Release",
    "cache_size",
    "iter_batches",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
