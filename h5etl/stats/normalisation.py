"""Normalisation statistics: exact per-channel sums and value histograms, merged in any order.

Contract: a worker summarises one sample's unpadded pixels with ``ChannelStats.of`` or
``Histogram.of``; the parent merges the partial results with ``merge`` in whatever grouping and
order tasks finish; ``attrs()`` gives the dataset attributes (``fileformat.STAT_ATTRS``,
``fileformat.HISTOGRAM_ATTRS``). Every sum is kept exactly, as a Python int on a fixed binary
scale, and rounded once in ``attrs()``: the result is bit-identical for any ``--jobs`` and any
cut of samples into tasks. numpy and the standard library only (decode workers import this).

Exactness: ``h5etl.stats.sums`` (how each dtype is summed exactly).

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

import numpy as np

from h5etl.stats.sums import add, planar_sums, small_ints

__all__ = ["ChannelStats", "Histogram"]


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
        return cls(*planar_sums(np.ascontiguousarray(planar)))

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
                part = small_ints(window.reshape(channels, -1))
                sums, squared = list(part[1]), list(part[2])
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
            count=add(a.count, b.count),
            total=add(a.total, b.total),
            squares=add(a.squares, b.squares),
            minimum=tuple(map(min, a.minimum, b.minimum)),
            maximum=tuple(map(max, a.maximum, b.maximum)),
            nonfinite=add(a.nonfinite, b.nonfinite),
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
