"""Fitting decoded pixels into an array field's shape: the oversize policy, shared by kinds."""

from __future__ import annotations

import numpy as np

from h5etl.errors import RejectError
from h5etl.format.codec import ChunkLayout
from h5etl.inputs import pixels
from h5etl.kinds import placement as geometry


def fit(
    array: np.ndarray,
    layout: ChunkLayout,
    oversize: str,
    *,
    path: str,
    is_mask: bool,
    grid: int = 1,
) -> np.ndarray:
    """``array`` (h, w[, c]) cut or resized to fit the field's (H, W), per ``pad.oversize``;
    a smaller one is returned as it is (placing it centred is the decoder's job).

    ``resize`` keeps the aspect ratio: Lanczos for images, nearest for masks (labels stay
    labels), in the array's own dtype (``pixels.resize_to``: uint8 through Pillow's 8-bit
    path, uint16, int16 and float32 plane by plane in float32, integers rounded back).
    """
    target = (layout.shape[1], layout.shape[2])
    size = (array.shape[0], array.shape[1])
    if not geometry.is_oversize(size, target):
        return array
    if oversize == "resize":
        with pixels.rejecting_surprises(path, oversize):  # resize runs Pillow
            size = geometry.fit_within(size, target)
            return pixels.resize_to(array, size, "nearest" if is_mask else "lanczos")
    if oversize == "crop":
        return geometry.center_crop(array, target, grid)
    raise RejectError(
        "oversize", f"{size[0]}x{size[1]} is larger than {target[0]}x{target[1]}", path=path
    )


def size_text(array: np.ndarray) -> str:
    return f"{array.shape[0]}x{array.shape[1]}"
