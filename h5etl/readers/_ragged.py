"""Reading ragged columns: sample i is ``values[offsets[i]:offsets[i + 1]]``, one slice.

A ragged column comes back as an object ndarray of shape (batch,) holding one array per
sample, ``(length, *trailing)`` in the column's dtype (a length of 0 gives an empty array).
Batching samples of different lengths is the training code's choice (pad, bucket, crop): a
collate does it (``h5etl.readers.series`` pads a batch and returns the lengths).
"""

from __future__ import annotations

from collections.abc import Sequence

import h5py
import numpy as np


def samples_array(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """An object array of ``pieces``, one element each (never broadcast into a 2-D array)."""
    out = np.empty(len(pieces), dtype=object)
    for i, piece in enumerate(pieces):
        out[i] = piece
    return out


def ragged_slice(values: h5py.Dataset, offsets: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Samples ``start:stop`` (``start <= stop``): one contiguous read of their values,
    split into per-sample views of it."""
    low, high = int(offsets[start]), int(offsets[stop])
    block = values[low:high] if high > low else np.empty((0, *values.shape[1:]), values.dtype)
    cuts = offsets[start + 1 : stop] - low
    return samples_array(np.split(block, cuts) if stop > start else [])


def ragged_gather(values: h5py.Dataset, offsets: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Samples at ``indices`` (any order, repeats allowed): one contiguous read each."""
    empty = np.empty((0, *values.shape[1:]), values.dtype)
    pieces = []
    for index in indices.tolist():
        low, high = int(offsets[index]), int(offsets[index + 1])
        pieces.append(values[low:high] if high > low else empty.copy())
    return samples_array(pieces)


def lengths(offsets: np.ndarray) -> np.ndarray:
    """Each sample's length (rows of values) from a ragged column's offsets."""
    return np.diff(np.asarray(offsets, dtype=np.int64))
