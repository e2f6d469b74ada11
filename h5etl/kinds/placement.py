"""Pure placement rules: where a smaller image sits in its field, how a larger one is cut."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def pad_offsets(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """(top, left) that centre ``size`` in ``target``; the odd pixel goes bottom/right."""
    return (target[0] - size[0]) // 2, (target[1] - size[1]) // 2


def crop_offsets(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """(top, left) of the centred window of ``target`` cut from a larger ``size``."""
    return max(size[0] - target[0], 0) // 2, max(size[1] - target[1], 0) // 2


def is_oversize(size: tuple[int, int], target: tuple[int, int]) -> bool:
    return size[0] > target[0] or size[1] > target[1]


def fit_within(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The largest (h, w) with the same aspect ratio that fits ``target``; at least 1 px."""
    scale = min(target[0] / size[0], target[1] / size[1], 1.0)
    return (
        min(target[0], max(1, round(size[0] * scale))),
        min(target[1], max(1, round(size[1] * scale))),
    )


def center_crop(array: np.ndarray, target: tuple[int, int], grid: int = 1) -> np.ndarray:
    """Cut the centred ``target`` window (or less, per axis) from an (h, w, ...) array; with
    ``grid`` the cut starts on multiples of it (a field paired with one ``grid`` times
    smaller stays aligned with it)."""
    size = (array.shape[0], array.shape[1])
    top, left = _on_grid(crop_offsets, size, target, grid)
    return array[top : top + target[0], left : left + target[1]]


def _on_grid(
    rule: Callable[[tuple[int, int], tuple[int, int]], tuple[int, int]],
    size: tuple[int, int],
    target: tuple[int, int],
    grid: int,
) -> tuple[int, int]:
    """``rule``'s offsets, computed on a ``grid`` times coarser grid when every size is a
    multiple of it: a pair's fields then pad and crop by the same amount at their scales."""
    if grid > 1 and not any(n % grid for n in (*size, *target)):
        coarse = rule((size[0] // grid, size[1] // grid), (target[0] // grid, target[1] // grid))
        return coarse[0] * grid, coarse[1] * grid
    return rule(size, target)


def place(array: np.ndarray, out: np.ndarray, grid: int = 1) -> np.ndarray:
    """Copy an (h, w) or (h, w, c) array centred into a pre-filled (c, H, W) slot (offsets on
    multiples of ``grid``, see ``center_crop``); return the (c, h, w) window it fills."""
    height, width = array.shape[0], array.shape[1]
    top, left = _on_grid(pad_offsets, (height, width), (out.shape[1], out.shape[2]), grid)
    window = out[:, top : top + height, left : left + width]
    if array.ndim == 2:
        window[0] = array
    else:
        window[...] = array.transpose(2, 0, 1)
    return window


def pad(array: np.ndarray, shape: tuple[int, int, int], fill: int) -> np.ndarray:
    """A new (c, H, W) array holding ``array`` centred on ``fill``; the rule, for tests and docs."""
    out = np.full(shape, fill, dtype=array.dtype)
    place(array, out)
    return out
