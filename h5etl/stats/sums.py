"""Exact sums of one sample's values per channel, per dtype: the kernels of
``h5etl.stats.normalisation``.

Exactness: a sample is summed in blocks of values per channel, each block exactly in numpy,
the blocks in Python ints. uint8 (and bool): squares fit uint16, 2**16 of them fit a uint32 sum
(2**16 * 255**2 < 2**32). 16-bit integers: int64 sums of at most ``_BLOCK`` = 2**20 squares,
each below 2**32 (total below 2**52). float32: each value is split into its 24-bit integer
significand and its exponent; ``np.bincount`` sums significands (and the two 24-bit halves of
their 48-bit squares) per (channel, exponent) bin in float64, exact because a bin stays below
2**20 * 2**24 = 2**44 < 2**53; the bins are shifted into Python ints on the 2**-149 grid on which
every float32 is an integer. Wider integers and float64 take an exact pure-Python path (slow:
meant for scalar value fields, not images).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# values per channel summed in one float64 step (see the module docstring for why it is exact)
_BLOCK = 2**20
# float32 steps over this many values in all channels: its many temporaries stay small
_F32_STEP = 2**14
# fractional bits of the fixed scale: every float32 is a multiple of 2**-149, float64 of 2**-1074
_F32_SCALE = 149
_F64_SCALE = 1074
_EXP_BINS = 256  # float32 biased exponent field: 0 subnormal, 255 Inf/NaN


# What ``ChannelStats`` holds, in its field order (``ChannelStats(*sums)``): count, total,
# squares, minimum, maximum, nonfinite per channel, and the scale. A plain tuple: this runs
# for every sample of every build.
Sums = tuple[
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[float, ...],
    tuple[float, ...],
    tuple[int, ...],
    int,
]


def add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def planar_sums(planar: np.ndarray) -> Sums:
    """Dispatch a (channels, values) array to the exact path of its dtype."""
    dtype = planar.dtype
    if dtype.kind == "b":
        planar = planar.view(np.uint8)
    if dtype.kind in "biu" and dtype.itemsize <= 2:
        return small_ints(planar)
    if dtype.kind in "iu":
        return _python_ints(planar)
    if dtype.kind == "f" and dtype.itemsize <= 4:
        return _float32s(planar.astype(np.float32, copy=False))
    if dtype == np.float64:
        return _python_floats(planar)
    raise TypeError(f"statistics need bool, integer or float values, got {dtype}")


def _blocks(planar: np.ndarray, size: int) -> list[np.ndarray]:
    """Column slices of at most ``size`` (and ``_BLOCK``) values per channel, as views."""
    size = max(1, min(size, _BLOCK))
    return [planar[:, i : i + size] for i in range(0, max(planar.shape[1], 1), size)]


def _extremes(planar: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if planar.shape[1] == 0:
        return (math.inf,) * planar.shape[0], (-math.inf,) * planar.shape[0]
    low, high = planar.min(axis=1).tolist(), planar.max(axis=1).tolist()
    return tuple(float(v) + 0.0 for v in low), tuple(float(v) + 0.0 for v in high)


def small_ints(planar: np.ndarray) -> Sums:
    """Integers of at most 16 bits: numpy integer sums, exact within a block."""
    channels = planar.shape[0]
    total, squares = (0,) * channels, (0,) * channels
    work: type[np.integer[Any]]
    accumulate: type[np.integer[Any]]
    if planar.dtype == np.uint8:
        # squares fit uint16 and 2**16 of them fit a uint32 sum: small, fast temporaries
        work, accumulate, size = np.uint16, np.uint32, 2**16
    else:  # 16 bits: squares below 2**32, so 2**20 of them stay far below 2**63
        work, accumulate, size = np.int64, np.int64, _BLOCK
    for block in _blocks(planar, size):
        values = block.astype(work)
        total = add(total, values.sum(axis=1, dtype=accumulate).tolist())
        np.multiply(values, values, out=values)
        squares = add(squares, values.sum(axis=1, dtype=accumulate).tolist())
    low, high = _extremes(planar)
    return (
        (planar.shape[1],) * channels,
        total,
        squares,
        low,
        high,
        (0,) * channels,
        0,
    )


def _float32s(planar: np.ndarray) -> Sums:
    """float32 values: significands summed per (channel, exponent) bin, bins scaled exactly."""
    channels = planar.shape[0]
    total, squares = [0] * channels, [0] * channels
    bad = np.zeros(channels, np.int64)
    offsets = (np.arange(channels, dtype=np.intp) * _EXP_BINS)[:, None]
    for block in _blocks(planar, _F32_STEP // max(channels, 1)):
        bits = block.view(np.uint32)
        field = (bits >> 23) & 0xFF
        bad += np.count_nonzero(field == 255, axis=1)
        # the 24-bit significand: |value| = significand * 2**(max(field, 1) - 150)
        significand = ((bits & 0x7FFFFF) + (np.minimum(field, 1) << 23)).astype(np.float64)
        square = significand * significand  # exact, below 2**48: two 24-bit halves
        high = np.floor(square * 2.0**-24)
        index = (field + offsets).ravel()
        sums = _bins(index, np.copysign(significand, block))
        highs = _bins(index, high)
        lows = _bins(index, square - high * 2.0**24)
        for c, e in zip(*np.nonzero(highs[:, :255] + lows[:, :255]), strict=True):
            shift = max(int(e), 1) - 1  # on the 2**-149 grid every float32 is an integer
            total[c] += int(sums[c, e]) << shift
            squares[c] += ((int(highs[c, e]) << 24) + int(lows[c, e])) << (2 * shift)
    if bad.any():
        finite = np.isfinite(planar)
        low = np.where(finite, planar, np.inf).min(axis=1).tolist()
        high = np.where(finite, planar, -np.inf).max(axis=1).tolist()
        extremes = tuple(v + 0.0 for v in low), tuple(v + 0.0 for v in high)
    else:
        extremes = _extremes(planar)
    return (
        tuple(planar.shape[1] - b for b in bad.tolist()),
        tuple(total),
        tuple(squares),
        extremes[0],
        extremes[1],
        tuple(bad.tolist()),
        _F32_SCALE,
    )


def _bins(index: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per-(channel, exponent) sums of integer weights below 2**24: exact in float64 (_BLOCK)."""
    channels = weights.shape[0]
    summed = np.bincount(index, weights=weights.ravel(), minlength=channels * _EXP_BINS)
    return summed.reshape(channels, _EXP_BINS)


def _python_ints(planar: np.ndarray) -> Sums:
    """Wide integers (32/64 bit): Python ints, exact and slow."""
    rows = [row.tolist() for row in planar]
    return (
        tuple(len(r) for r in rows),
        tuple(sum(r) for r in rows),
        tuple(sum(v * v for v in r) for r in rows),
        tuple(float(min(r)) if r else math.inf for r in rows),
        tuple(float(max(r)) if r else -math.inf for r in rows),
        (0,) * len(rows),
        0,
    )


def _python_floats(planar: np.ndarray) -> Sums:
    """float64 values: Python ints on the 2**-1074 grid, exact and slow (scalar fields)."""
    count, total_, squares_, low_, high_, bad = [], [], [], [], [], []
    for row in planar.tolist():
        finite = [v for v in row if math.isfinite(v)]
        total = squares = 0
        for v in finite:
            num, den = v.as_integer_ratio()
            shift = _F64_SCALE - (den.bit_length() - 1)
            total += num << shift
            squares += (num * num) << (2 * shift)
        count.append(len(finite))
        total_.append(total)
        squares_.append(squares)
        low_.append(min(finite, default=math.inf) + 0.0)
        high_.append(max(finite, default=-math.inf) + 0.0)
        bad.append(len(row) - len(finite))
    return (
        tuple(count),
        tuple(total_),
        tuple(squares_),
        tuple(low_),
        tuple(high_),
        tuple(bad),
        _F64_SCALE,
    )
