"""builtin: the transforms h5etl ships, named by their short name in a config (``crop``).

Each is an ordinary transform (the value first, keyword arguments after), resolved, checked,
versioned and run exactly as a user's function is; its docstring is what users read. A
function that cannot do what it is asked on one sample raises ``ValueError`` (the sample is
rejected as ``transform_error``) or, for values the result cannot hold, ``RejectError``
``transform_output``: nothing wraps around or is cut silently.

``size`` lists count from the first axis: ``[h, w]`` on an (h, w, 3) image leaves the
channels alone, ``[d, h, w]`` sizes a volume. Centring follows the field's own padding: the
odd pixel goes to the end of the axis (bottom, right).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import pixels

__all__ = [
    "BUILTINS",
    "Builtin",
    "cast",
    "clip",
    "crop",
    "normalise",
    "pad",
    "resample",
    "resize",
    "window",
]

Rounding = Literal["nearest", "floor", "trunc"]
_ROUNDINGS: tuple[str, ...] = get_args(Rounding)
_FILTERS: tuple[str, ...] = get_args(pixels.ResizeFilter)


def resize(
    value: np.ndarray, *, size: Sequence[int], filter: pixels.ResizeFilter = "lanczos"
) -> np.ndarray:
    """Resize an image (h, w) or (h, w, 3) to ``size`` ``[h, w]`` with a Pillow filter.

    ``filter``: ``nearest`` (masks: labels stay labels), ``bilinear``, ``bicubic``,
    ``lanczos`` (the default, for images) or ``area`` (the mean of the pixels each output
    pixel covers). The dtype is kept: uint8 as Pillow resizes it; uint16, int16 and float32
    through float32, integers then rounded half to even and clipped to their range (the same
    resize as a field's ``resize:`` derivation).
    """
    return pixels.resize_to(np.asarray(value), (int(size[0]), int(size[1])), filter)


def resample(value: np.ndarray, *, shape: Sequence[int], labels: bool = False) -> np.ndarray:
    """Resample a volume (z, y, x) to ``shape`` ``[z, y, x]`` voxels (scipy, ``h5etl[medical]``):
    linear interpolation on a grid whose voxel centres sit where their areas say, rounded back
    to the dtype and clipped to its range; ``labels: true`` takes the nearest voxel (labels
    stay labels). The same resampling as a volume field's ``resample:``; the spacing and
    affine a field stores follow that option only (a transform changes values, not geometry).
    """
    from h5etl.inputs.volumes import resample as resampling  # scipy: imported when used

    array = np.asarray(value)
    if array.ndim != 3:
        raise ValueError(f"resample takes a (z, y, x) volume, got {array.ndim} axes")
    return resampling.zoomed(array, [int(n) for n in shape], labels=bool(labels))


def crop(
    value: np.ndarray, *, size: Sequence[int], start: Sequence[int] | None = None
) -> np.ndarray:
    """Cut a window of at most ``size`` from the first ``len(size)`` axes.

    ``start``: where the window begins on each axis; left out, the window is centred (the odd
    pixel left over goes to the end). An axis shorter than its ``size`` is kept whole, so
    ``crop`` then ``pad`` to the same size gives exactly ``size``; a window that starts past
    an axis's end is a ``ValueError``.
    """
    array = np.asarray(value)
    _leading(array, size, "crop")
    cut = []
    for axis, want in enumerate(size):
        have = array.shape[axis]
        begin = (max(have - want, 0) // 2) if start is None else int(start[axis])
        if begin >= have and have > 0:
            raise ValueError(f"crop starts at {begin} on axis {axis}, which has {have}")
        cut.append(slice(begin, begin + want))
    return array[tuple(cut)]


def pad(value: np.ndarray, *, size: Sequence[int], fill: float = 0) -> np.ndarray:
    """Centre the value on ``fill`` in an array of ``size`` on the first ``len(size)`` axes.

    The odd pixel goes to the end of the axis, as the field's own padding places an image.
    An axis already longer than its ``size`` is a ``ValueError`` (``crop`` it first); the
    dtype is kept, and a ``fill`` it cannot hold exactly is a ``ValueError``.
    """
    array = np.asarray(value)
    _leading(array, size, "pad")
    filled = np.asarray(fill).astype(array.dtype)
    if filled != fill:
        raise ValueError(f"pad: fill {fill} does not fit a {array.dtype} array exactly")
    widths = []
    for axis, want in enumerate(size):
        have = array.shape[axis]
        if have > want:
            raise ValueError(f"pad: axis {axis} has {have}, more than size {want}: crop it first")
        before = (want - have) // 2
        widths.append((before, want - have - before))
    widths += [(0, 0)] * (array.ndim - len(size))
    return np.pad(array, widths, constant_values=filled)


def clip(value: np.ndarray, *, low: float, high: float) -> np.ndarray:
    """Values below ``low`` become ``low``, above ``high`` become ``high``; the dtype is kept."""
    array = np.asarray(value)
    if array.dtype.kind in "iu":
        info = np.iinfo(array.dtype)
        # bounds the dtype cannot hold would overflow numpy's scalar conversion (NEP 50)
        low = min(max(math.ceil(low), info.min), info.max)
        high = min(max(math.floor(high), info.min), info.max)
    clipped: np.ndarray = np.clip(array, low, high).astype(array.dtype, copy=False)
    return clipped


def window(value: np.ndarray, *, low: float, high: float, scale: float = 1.0) -> np.ndarray:
    """An intensity window: ``low`` maps to 0, ``high`` to ``scale``, linearly, as float32;
    values outside the window are clipped to it (a CT's ``low: -200, high: 300`` for soft
    tissue; ``scale: 255`` then ``cast: uint8`` for 8-bit images)."""
    array = np.asarray(value, dtype=np.float64)
    out = (np.clip(array, low, high) - low) * (scale / (high - low))
    return out.astype(np.float32)


def normalise(
    value: np.ndarray,
    *,
    method: Literal["minmax", "meanstd"] = "minmax",
    mean: float | Sequence[float] | None = None,
    std: float | Sequence[float] | None = None,
) -> np.ndarray:
    """Values as float32: ``minmax`` maps each sample's own minimum to 0 and maximum to 1 (a
    constant sample becomes 0); ``meanstd`` computes ``(v - mean) / std`` with the ``mean``
    and ``std`` given (numbers, or one per channel: the last axis)."""
    array = np.asarray(value, dtype=np.float64)
    if method == "meanstd":
        if mean is None or std is None:  # validate refuses such a config; a direct call too
            raise ValueError("normalise: method meanstd needs both mean and std")
        out = (array - np.asarray(mean, dtype=np.float64)) / np.asarray(std, dtype=np.float64)
        return out.astype(np.float32)
    if array.size == 0:
        return array.astype(np.float32)
    low, high = float(array.min()), float(array.max())
    span = high - low
    scaled = (array - low) / span if span > 0 else np.zeros_like(array)
    return scaled.astype(np.float32)


def cast(value: np.ndarray, *, dtype: str, round: Rounding = "nearest") -> np.ndarray:
    """The value in ``dtype``, rounded as ``round`` says when it goes from float to integer:
    ``nearest`` (half to even, numpy's ``rint``), ``floor`` or ``trunc`` (towards zero).

    Values the target cannot hold (below or above its range, NaN or infinity for an integer
    dtype, beyond float32's range) reject the sample as ``transform_output``: a cast never
    wraps around or saturates silently. Integers into float32 round to its 24-bit significand.
    """
    array = np.asarray(value)
    target = np.dtype(dtype)
    if target.kind in "iu":
        if array.dtype.kind == "f":
            if not np.isfinite(array).all():
                raise _refused(dtype, "NaN or infinity")
            array = {"nearest": np.rint, "floor": np.floor, "trunc": np.trunc}[round](array)
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            found = f"values {_number(array.min())}..{_number(array.max())}"
            raise _refused(dtype, f"{found} outside {info.min}..{info.max}")
        return array.astype(target)
    with np.errstate(over="ignore"):  # overflow is refused below, by name
        out = array.astype(target)
    if array.size and np.isfinite(array).all() and not np.isfinite(out).all():
        raise _refused(dtype, f"values beyond its range (up to {np.finfo(target).max:.4g})")
    return out


def _number(value: Any) -> str:
    if isinstance(value, np.floating):
        return np.format_float_positional(value + 0.0, trim="-")  # + 0.0: no "-0"
    return str(value)


def _refused(dtype: str, found: str) -> RejectError:
    return RejectError("transform_output", f"cast to {dtype}: {found} (never wrapped or clipped)")


def _leading(array: np.ndarray, size: Sequence[int], name: str) -> None:
    if len(size) > array.ndim:
        raise ValueError(f"{name}: size has {len(size)} axes, the value has shape {array.shape}")


# --- arguments a signature cannot check, refused at validate ------------------------------


def _sizes(size: Sequence[int], *, axes: int | None = None) -> None:
    if not isinstance(size, list) or not size or not all(_count(n) for n in size):
        raise ValueError(f"size must be a list of positive integers, got {size!r}")
    if axes is not None and len(size) != axes:
        raise ValueError(f"size must be [h, w], got {size!r}")


def _count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def _real(**numbers: object) -> None:
    for name, n in numbers.items():
        if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n):
            raise ValueError(f"{name} must be a finite number, got {n!r}")


def _check_resize(*, size: Sequence[int], filter: str = "lanczos") -> None:
    _sizes(size, axes=2)
    if filter not in _FILTERS:
        raise ValueError(f"filter must be one of {', '.join(_FILTERS)}, got {filter!r}")


def _check_resample(*, shape: Sequence[int], labels: bool = False) -> None:
    if not isinstance(shape, list) or len(shape) != 3 or not all(_count(n) for n in shape):
        raise ValueError(f"shape must be [z, y, x], positive integers, got {shape!r}")
    if not isinstance(labels, bool):
        raise ValueError(f"labels is true or false, got {labels!r}")


def _check_crop(*, size: Sequence[int], start: Sequence[int] | None = None) -> None:
    _sizes(size)
    if start is not None and (
        not isinstance(start, list)
        or len(start) != len(size)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in start)
    ):
        raise ValueError(f"start must be {len(size)} integers >= 0, one per size, got {start!r}")


def _check_pad(*, size: Sequence[int], fill: float = 0) -> None:
    _sizes(size)
    _real(fill=fill)


def _check_bounds(*, low: float, high: float, scale: float = 1.0) -> None:
    _real(low=low, high=high, scale=scale)
    if not low < high:
        raise ValueError(f"low must be below high, got low {low}, high {high}")


def _check_normalise(*, method: str = "minmax", mean: object = None, std: object = None) -> None:
    if method == "minmax":
        if mean is not None or std is not None:
            raise ValueError("method minmax takes no mean or std (method: meanstd does)")
        return
    if method != "meanstd":
        raise ValueError(f"method must be minmax or meanstd, got {method!r}")
    if mean is None or std is None:
        raise ValueError("method meanstd needs both mean and std")
    stds: list[float] = std if isinstance(std, list) else [std]  # type: ignore[list-item]
    _real(**{f"mean[{i}]": m for i, m in enumerate(mean if isinstance(mean, list) else [mean])})
    _real(**{f"std[{i}]": s for i, s in enumerate(stds)})
    if any(s <= 0 for s in stds):  # _real made them numbers
        raise ValueError(f"std must be above 0, got {std!r}")


def _check_cast(*, dtype: str, round: str = "nearest") -> None:
    try:
        target = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"dtype {dtype!r} is not a numpy dtype") from exc
    if target.kind not in "iuf" or target.itemsize > 8:
        raise ValueError(
            f"dtype must be an integer or float dtype (uint8, float32...), got {dtype}"
        )
    if round not in _ROUNDINGS:
        raise ValueError(f"round must be one of {', '.join(_ROUNDINGS)}, got {round!r}")


@dataclass(frozen=True, slots=True)
class Builtin:
    """A built-in transform and the check of its arguments (raises ``ValueError``)."""

    function: Callable[..., np.ndarray]
    check: Callable[..., None]


BUILTINS: dict[str, Builtin] = {
    "cast": Builtin(cast, _check_cast),
    "clip": Builtin(clip, _check_bounds),
    "crop": Builtin(crop, _check_crop),
    "normalise": Builtin(normalise, _check_normalise),
    "pad": Builtin(pad, _check_pad),
    "resample": Builtin(resample, _check_resample),
    "resize": Builtin(resize, _check_resize),
    "window": Builtin(window, _check_bounds),
}
