"""Fixed-size series for fixed-size models: crop or pad to a duration, or cut windows.

Pure rules over sample counts (no files): how many samples a duration is at a channel's rate,
how a channel is cropped or padded to it, how many windows of a length and a stride a
recording holds and which samples each covers. Every channel of a recording is cut at the
same instants, so a window is the same stretch of time in each channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from h5etl.errors import RejectError


def samples_in(seconds: float, rate_hz: float) -> int | None:
    """``seconds`` as a whole number of samples at ``rate_hz``, or None when it is not one."""
    exact = seconds * rate_hz
    count = round(exact)
    return count if abs(exact - count) <= 1e-9 * max(1.0, exact) else None


@dataclass(frozen=True, slots=True)
class FixedDuration:
    """Every recording cropped or padded to ``seconds``: each channel a fixed array."""

    seconds: float
    shorter: str = "pad"  # pad | reject
    fill: float = 0.0


def fit_fixed(
    values: np.ndarray, count: int, rule: FixedDuration, *, name: str, path: str
) -> tuple[np.ndarray, int]:
    """``values`` (n, ...) as exactly ``count`` samples: the first ``count`` of a longer
    channel, a shorter one followed by ``rule.fill``; and how many samples are real."""
    n = len(values)
    if n >= count:
        return values[:count], count
    if rule.shorter == "reject":
        raise RejectError(
            "too_short",
            f"channel {name} has {n} samples, fewer than the {count} of {rule.seconds:g} s "
            "(fixed.shorter: reject; pad to keep it)",
            path=path,
        )
    out = np.full((count, *values.shape[1:]), rule.fill, dtype=values.dtype)
    out[:n] = values
    return out, n


@dataclass(frozen=True, slots=True)
class Windowing:
    """Windows of ``seconds`` every ``stride`` seconds: one stored sample per window."""

    seconds: float
    stride: float

    def lengths(self, rate_hz: float) -> tuple[int, int]:
        """(window, stride) in samples at ``rate_hz`` (the config checked they are whole)."""
        window, stride = samples_in(self.seconds, rate_hz), samples_in(self.stride, rate_hz)
        assert window is not None
        assert stride is not None
        return window, stride

    def count(self, lengths: Mapping[str, int], rates: Mapping[str, float]) -> int:
        """How many whole windows every channel holds (0: the recording is too short)."""
        counts = []
        for name, n in lengths.items():
            window, stride = self.lengths(rates[name])
            counts.append(0 if n < window else (n - window) // stride + 1)
        return min(counts, default=0)

    def span(self, index: int, rate_hz: float) -> slice:
        """The samples of window ``index`` at ``rate_hz``."""
        window, stride = self.lengths(rate_hz)
        return slice(index * stride, index * stride + window)

    def offset_s(self, index: int) -> float:
        """Where window ``index`` starts, in seconds from the recording's start."""
        return index * self.stride


def too_short(lengths: Mapping[str, int], rates: Mapping[str, float], rule: Windowing) -> str:
    """Why a recording holds no whole window, naming its shortest channel."""
    name = min(lengths, key=lambda channel: lengths[channel] / rates[channel])
    window, _ = rule.lengths(rates[name])
    return (
        f"channel {name} has {lengths[name]} samples ({lengths[name] / rates[name]:g} s), "
        f"fewer than one window of {rule.seconds:g} s ({window} samples)"
    )
