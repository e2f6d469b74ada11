"""Resampling a case to a fixed spacing or shape (an option of the volume kind, never default).

scipy.ndimage.zoom with ``grid_mode=True``: voxel centres of the new grid sit where their
areas say (a 2x coarser grid's first voxel covers the old voxels 0 and 1), so the affine is
exact: new voxel v maps to old voxel ``(v + 0.5) * old / new - 0.5`` on each axis. Linear
interpolation for images (rounded back to the integer dtype, clipped to its range), nearest
for labels. After resampling to a spacing, every slice is centred in ``plane`` (cropped, or
padded with ``fill``), the affine following.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from h5etl.errors import RejectError

Triple = tuple[float, float, float]


def _scipy_zoom() -> Any:
    try:
        from scipy import ndimage
    except ImportError as exc:
        raise RejectError(
            "missing_dependency", "resampling needs scipy: pip install 'h5etl[medical]'"
        ) from exc
    return ndimage.zoom


def target_shape(
    shape: Sequence[int],
    spacing: Triple,
    *,
    to_spacing: Triple | None,
    to_shape: Sequence[int] | None,
) -> tuple[int, int, int]:
    """The (z, y, x) a case of ``shape`` and ``spacing`` has after resampling."""
    if to_shape is not None:
        return (int(to_shape[0]), int(to_shape[1]), int(to_shape[2]))
    assert to_spacing is not None
    found = [max(1, round(n * s / t)) for n, s, t in zip(shape, spacing, to_spacing, strict=True)]
    return (found[0], found[1], found[2])


def resample(
    volume: np.ndarray,
    spacing: Triple,
    affine: np.ndarray,
    *,
    shape: tuple[int, int, int],
    labels: bool,
    path: str,
) -> tuple[np.ndarray, Triple, np.ndarray]:
    """``volume`` (z, y, x) on a grid of ``shape``: the voxels, their spacing and affine."""
    out = zoomed(volume, shape, labels=labels, path=path)
    return (out, *regrid(spacing, affine, volume.shape, out.shape))


def zoomed(volume: np.ndarray, shape: Sequence[int], *, labels: bool, path: str = "") -> np.ndarray:
    """The voxels of ``volume`` (z, y, x) on a grid of ``shape``: linear for an image
    (rounded back to its dtype), nearest for labels (the built-in transform ``resample``)."""
    zoom = _scipy_zoom()
    factors = [new / old for new, old in zip(shape, volume.shape, strict=True)]
    try:
        if labels:
            out: np.ndarray = zoom(volume, factors, order=0, mode="nearest", grid_mode=True)
            return out
        smooth = zoom(volume.astype(np.float32), factors, order=1, mode="nearest", grid_mode=True)
        return _back_to(smooth, volume.dtype)
    except (ValueError, RuntimeError, MemoryError) as exc:
        raise RejectError("resample_failed", f"cannot resample: {exc}", path=path) from exc


def regrid(
    spacing: Triple, affine: np.ndarray, before: Sequence[int], after: Sequence[int]
) -> tuple[Triple, np.ndarray]:
    """The spacing and affine of a case resampled from ``before`` to ``after`` voxels."""
    ratios = [old / new for old, new in zip(before, after, strict=True)]
    new_spacing = (spacing[0] * ratios[0], spacing[1] * ratios[1], spacing[2] * ratios[2])
    # affine columns are x, y, z: the ratios reversed
    step = np.diag([ratios[2], ratios[1], ratios[0], 1.0])
    step[:3, 3] = [(ratios[2] - 1) / 2, (ratios[1] - 1) / 2, (ratios[0] - 1) / 2]
    return new_spacing, affine @ step


def _back_to(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind == "f":
        return values.astype(dtype)
    info = np.iinfo(dtype)
    rounded: np.ndarray = np.clip(np.rint(values), info.min, info.max).astype(dtype)
    return rounded


def centre_plane(
    volume: np.ndarray, affine: np.ndarray, plane: tuple[int, int], fill: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every slice centred in ``plane`` (y, x): cropped or padded with ``fill``."""
    z, y, x = volume.shape
    if (y, x) == tuple(plane):
        return volume, affine
    out = np.full((z, *plane), fill, dtype=volume.dtype)
    starts = []
    for size, target in zip((y, x), plane, strict=True):
        starts.append((target - size) // 2)  # > 0: padding before; < 0: cropped before
    oy, ox = starts
    src_y, dst_y = max(0, -oy), max(0, oy)
    src_x, dst_x = max(0, -ox), max(0, ox)
    h = min(y - src_y, plane[0] - dst_y)
    w = min(x - src_x, plane[1] - dst_x)
    out[:, dst_y : dst_y + h, dst_x : dst_x + w] = volume[:, src_y : src_y + h, src_x : src_x + w]
    shift = np.eye(4)
    shift[:3, 3] = [-ox, -oy, 0]  # stored voxel (x, y) was voxel (x - ox, y - oy) before
    return out, affine @ shift
