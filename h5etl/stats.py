"""Normalisation statistics: exact per-channel sums and value histograms, merged in any order.

Contract: a worker summarises one sample's unpadded pixels with ``ChannelStats.of`` or
``Histogram.of``; the parent merges the partial results with ``merge`` in whatever grouping and
order tasks finish; ``attrs()`` gives the dataset attributes (``fileformat.STAT_ATTRS``,
``fileformat.HISTOGRAM_ATTRS``). Every sum is kept exactly, as a Python int on a fixed binary
scale, and rounded once in ``attrs()``: the result is bit-identical for any ``--jobs`` and any
cut of samples into tasks. numpy and the standard library only (decode workers import this).

Exactness: a sample is summed in blocks of values per channel, each block exactly in numpy,
the blocks in Python ints. uint8 (and bool): squares fit uint16, 2**16 of them fit a uint32 sum
(2**16 * 255**2 < 2**32). 16-bit integers: int64 sums of at most ``_BLOCK`` = 2**20 squares,
each below 2**32 (total below 2**52). float32: each value is split into its 24-bit integer
significand and its exponent; ``np.bincount`` sums significands (and the two 24-bit halves of
their 48-bit squares) per (channel, exponent) bin in float64, exact because a bin stays below
2**20 * 2**24 = 2**44 < 2**53; the bins are shifted into Python ints on the 2**-149 grid on which
every float32 is an integer. Wider integers and float64 take an exact pure-Python path (slow:
meant for scalar value fields, not images).

Decisions: NaN and +-Inf are counted per channel in ``nonfinite`` and excluded from every
statistic (``count`` is the number of finite values); a channel without a finite value has NaN
mean, std, min and max and count 0. ``ChannelStats()`` (no sample seen) is the identity of
``merge`` and its ``attrs()`` is None: write no statistics. -0.0 is recorded as 0.0 so min and
max do not depend on which of two equal zeros came first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ChannelStats", "Histogram"]

# values per channel summed in one float64 step (see the module docstring for why it is exact)
_BLOCK = 2**20
# float32 steps over this many values in all channels: its many temporaries stay small
_F32_STEP = 2**14
# fractional bits of the fixed scale: every float32 is a multiple of 2**-149, float64 of 2**-1074
_F32_SCALE = 149
_F64_SCALE = 1074
_EXP_BINS = 256  # float32 biased exponent field: 0 subnormal, 255 Inf/NaN


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """Exact per-channel count, sum, sum of squares, min and max of one or more samples.

    ``total[c] / 2**scale`` is the exact sum of channel ``c``'s finite values and
    ``squares[c] / 2**(2 * scale)`` the exact sum of their squares.
    """

    count: tuple[int, ...] = ()
    total: tuple[int, ...] = ()
    squares: tuple[int, ...] = ()
    minimum: tuple[float, ...] = ()  # +inf where a channel has no finite value yet
    maximum: tuple[float, ...] = ()  # -inf likewise
    nonfinite: tuple[int, ...] = ()  # NaN and +-Inf values seen, excluded from the rest
    scale: int = 0  # fractional bits: 0 for integer inputs, 149 float32, 1074 float64

    @property
    def channels(self) -> int:
        """The number of channels; 0 for the empty stats of no sample."""
        return len(self.count)

    @classmethod
    def of(cls, array: np.ndarray, *, channel_axis: int | None) -> ChannelStats:
        """The statistics of one sample's (unpadded) values.

        Parameters:
            array: any shape; bool, integer or float dtype.
            channel_axis: the axis holding the channels (-1 for ``(h, w, 3)``, 0 for
                ``(c, h, w)``), or None to treat every value as one channel.

        Raises:
            TypeError: the dtype is not bool, integer or float (complex, object, ...).
        """
        array = np.asarray(array)
        if channel_axis is None:
            planar = array.reshape(1, -1)
        elif channel_axis == 0:  # (c, h, w) as stored: no axis to move (the common case)
            planar = array.reshape(array.shape[0], -1)
        else:
            channels = array.shape[channel_axis]
            planar = np.moveaxis(array, channel_axis, 0).reshape(channels, -1)
        # one copy to (channels, values) rows: numpy reduces contiguous rows many times faster
        return _planar_stats(np.ascontiguousarray(planar))

    @classmethod
    def of_windows(cls, windows: Sequence[np.ndarray]) -> ChannelStats:
        """The statistics of several samples' (c, h, w) windows at once: the same bits as
        merging ``of(window, channel_axis=0)`` of each, with one object per task instead of
        one per sample (this runs for every sample of every build)."""
        if not windows:
            return cls()
        if any(w.dtype != np.uint8 for w in windows):
            total_stats = cls()
            for window in windows:
                total_stats = total_stats.merge(cls.of(window, channel_axis=0))
            return total_stats
        channels = windows[0].shape[0]
        total = [0] * channels
        squares = [0] * channels
        low = [math.inf] * channels
        high = [-math.inf] * channels
        count = 0
        for window in windows:
            # one copy of the strided window, widened: squares of uint8 fit uint16
            values = window.astype(np.uint16).reshape(channels, -1)
            mins, maxs = values.min(axis=1).tolist(), values.max(axis=1).tolist()
            if values.shape[1] > 2**16:  # beyond what uint32 sums of squares hold exactly
                part = _small_ints(window.reshape(channels, -1))
                sums, squared = list(part.total), list(part.squares)
            else:
                sums = values.sum(axis=1, dtype=np.uint32).tolist()
                np.multiply(values, values, out=values)
                squared = values.sum(axis=1, dtype=np.uint32).tolist()
            planar = values
            for c in range(channels):
                total[c] += sums[c]
                squares[c] += squared[c]
                low[c] = min(low[c], mins[c])
                high[c] = max(high[c], maxs[c])
            count += planar.shape[1]
        return cls(
            count=(count,) * channels,
            total=tuple(total),
            squares=tuple(squares),
            minimum=tuple(float(v) + 0.0 for v in low),
            maximum=tuple(float(v) + 0.0 for v in high),
            nonfinite=(0,) * channels,
        )

    def merge(self, other: ChannelStats) -> ChannelStats:
        """The statistics of both; exact, so associative and commutative bit for bit.

        Raises:
            ValueError: the two have different channel counts (neither being empty).
        """
        if not other.count:
            return self
        if not self.count:
            return other
        if self.channels != other.channels:
            raise ValueError(
                f"cannot merge statistics of {self.channels} channels with {other.channels}"
            )
        scale = max(self.scale, other.scale)
        a, b = self._rescaled(scale), other._rescaled(scale)
        return ChannelStats(
            count=_add(a.count, b.count),
            total=_add(a.total, b.total),
            squares=_add(a.squares, b.squares),
            minimum=tuple(map(min, a.minimum, b.minimum)),
            maximum=tuple(map(max, a.maximum, b.maximum)),
            nonfinite=_add(a.nonfinite, b.nonfinite),
            scale=scale,
        )

    def attrs(self) -> dict[str, np.ndarray] | None:
        """``fileformat.STAT_ATTRS`` as arrays of one value per channel; None if no sample.

        mean and std (population) are the correctly rounded float64 of the exact values; min
        and max float64; count int64. A channel with count 0 has NaN mean, std, min and max.
        """
        if not self.count:
            return None
        mean, std, low, high = [], [], [], []
        for n, total, squares, lo, hi in zip(
            self.count, self.total, self.squares, self.minimum, self.maximum, strict=True
        ):
            if n == 0:
                mean.append(math.nan)
                std.append(math.nan)
                low.append(math.nan)
                high.append(math.nan)
                continue
            mean.append(total / (n << self.scale))  # int / int is correctly rounded
            # population variance (n * squares - total**2) / (n**2 * 2**(2 * scale)), exactly
            std.append(_sqrt_ratio(n * squares - total * total, (n * n) << (2 * self.scale)))
            low.append(lo)
            high.append(hi)
        return {
            "mean": np.array(mean, np.float64),
            "std": np.array(std, np.float64),
            "min": np.array(low, np.float64),
            "max": np.array(high, np.float64),
            "count": np.array(self.count, np.int64),
        }

    def _rescaled(self, scale: int) -> ChannelStats:
        shift = scale - self.scale
        if shift == 0:
            return self
        return ChannelStats(
            count=self.count,
            total=tuple(t << shift for t in self.total),
            squares=tuple(q << (2 * shift) for q in self.squares),
            minimum=self.minimum,
            maximum=self.maximum,
            nonfinite=self.nonfinite,
            scale=scale,
        )


@dataclass(frozen=True, slots=True)
class Histogram:
    """Exact value -> count of integer data (masks, labels): ``(value, count)`` pairs, sorted."""

    counts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, array: np.ndarray) -> Histogram:
        """The histogram of one sample's values.

        Raises:
            TypeError: the dtype is not bool or integer.
            ValueError: a value does not fit the int64 attributes.
        """
        array = np.asarray(array)
        if array.dtype.kind not in "biu":
            raise TypeError(f"a histogram needs integer values, got {array.dtype} (float?)")
        flat = array.reshape(-1)
        if flat.size == 0:
            return cls()
        if array.dtype.kind == "b":
            flat = flat.view(np.uint8)
        if array.dtype.kind == "u" and array.dtype.itemsize <= 2:
            return cls._from_bincount(np.bincount(flat), 0)
        low, high = int(flat.min()), int(flat.max())
        if high >= 2**63:
            raise ValueError(f"histogram value {high} does not fit the int64 attributes")
        if high - low < 2**16:  # small range (labels, signed masks): a bincount beats a sort
            return cls._from_bincount(np.bincount(flat.astype(np.intp) - low), low)
        values, counts = np.unique(flat, return_counts=True)
        return cls(tuple(zip(values.tolist(), counts.tolist(), strict=True)))

    @classmethod
    def _from_bincount(cls, bins: np.ndarray, offset: int) -> Histogram:
        present = np.flatnonzero(bins)
        return cls(tuple(zip((present + offset).tolist(), bins[present].tolist(), strict=True)))

    def merge(self, other: Histogram) -> Histogram:
        """The histogram of both; exact, so associative and commutative."""
        if not other.counts:
            return self
        if not self.counts:
            return other
        merged = dict(self.counts)
        for value, n in other.counts:
            merged[value] = merged.get(value, 0) + n
        return Histogram(tuple(sorted(merged.items())))

    def attrs(self) -> dict[str, np.ndarray] | None:
        """``fileformat.HISTOGRAM_ATTRS``: sorted int64 values and their int64 counts.

        None if no value was counted (no sample, or only empty ones): write no histogram.
        """
        if not self.counts:
            return None
        values, counts = zip(*self.counts, strict=True)
        return {
            "histogram_values": np.array(values, np.int64),
            "histogram_counts": np.array(counts, np.int64),
        }


def _add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _sqrt_ratio(num: int, den: int) -> float:
    """The correctly rounded float of sqrt(num / den), for integers num >= 0 and den > 0."""
    if num == 0:
        return 0.0
    # scale so that the integer root has at least 55 bits, then fold the remainder into a
    # sticky low bit: rounding that integer to 53 bits is then the correct rounding
    k = max(0, (112 - num.bit_length() + den.bit_length()) // 2 + 1)
    scaled = (num << (2 * k)) // den
    root = math.isqrt(scaled)
    if root * root * den != num << (2 * k):
        root |= 1
    return root / (1 << k)


def _planar_stats(planar: np.ndarray) -> ChannelStats:
    """Dispatch a (channels, values) array to the exact path of its dtype."""
    dtype = planar.dtype
    if dtype.kind == "b":
        planar = planar.view(np.uint8)
    if dtype.kind in "biu" and dtype.itemsize <= 2:
        return _small_ints(planar)
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


def _small_ints(planar: np.ndarray) -> ChannelStats:
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
        total = _add(total, values.sum(axis=1, dtype=accumulate).tolist())
        np.multiply(values, values, out=values)
        squares = _add(squares, values.sum(axis=1, dtype=accumulate).tolist())
    low, high = _extremes(planar)
    return ChannelStats(
        count=(planar.shape[1],) * channels,
        total=total,
        squares=squares,
        minimum=low,
        maximum=high,
        nonfinite=(0,) * channels,
    )


def _float32s(planar: np.ndarray) -> ChannelStats:
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
    return ChannelStats(
        count=tuple(planar.shape[1] - b for b in bad.tolist()),
        total=tuple(total),
        squares=tuple(squares),
        minimum=extremes[0],
        maximum=extremes[1],
        nonfinite=tuple(bad.tolist()),
        scale=_F32_SCALE,
    )


def _bins(index: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per-(channel, exponent) sums of integer weights below 2**24: exact in float64 (_BLOCK)."""
    channels = weights.shape[0]
    summed = np.bincount(index, weights=weights.ravel(), minlength=channels * _EXP_BINS)
    return summed.reshape(channels, _EXP_BINS)


def _python_ints(planar: np.ndarray) -> ChannelStats:
    """Wide integers (32/64 bit): Python ints, exact and slow."""
    rows = [row.tolist() for row in planar]
    return ChannelStats(
        count=tuple(len(r) for r in rows),
        total=tuple(sum(r) for r in rows),
        squares=tuple(sum(v * v for v in r) for r in rows),
        minimum=tuple(float(min(r)) if r else math.inf for r in rows),
        maximum=tuple(float(max(r)) if r else -math.inf for r in rows),
        nonfinite=(0,) * len(rows),
    )


def _python_floats(planar: np.ndarray) -> ChannelStats:
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
    return ChannelStats(
        count=tuple(count),
        total=tuple(total_),
        squares=tuple(squares_),
        minimum=tuple(low_),
        maximum=tuple(high_),
        nonfinite=tuple(bad),
        scale=_F64_SCALE,
    )
