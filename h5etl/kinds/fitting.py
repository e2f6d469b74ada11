"""Fitting decoded pixels into an array field's shape: the oversize policy, shared by kinds."""

from __future__ import annotations

import numpy as np

from h5etl import geometry, images
from h5etl.chunkcodec import ChunkLayout
from h5etl.errors import RejectError


def fit(
    array: np.ndarray, layout: ChunkLayout, oversize: str, *, path: str, is_mask: bool
) -> np.ndarray:
    """``array`` (h, w[, c]) cut or resized to fit the field's (H, W), per ``pad.oversize``;
    a smaller one is returned as it is (placing it centred is the decoder's job)."""
    target = (layout.shape[1], layout.shape[2])
    size = (array.shape[0], array.shape[1])
    if not geometry.is_oversize(size, target):
        return array
    if oversize == "resize":
        with images.rejecting_surprises(path, oversize):  # resize runs Pillow
            return images.resize(array, geometry.fit_within(size, target), is_mask=is_mask)
    if oversize == "crop":
        return geometry.center_crop(array, target)
    raise RejectError(
        "oversize", f"{size[0]}x{size[1]} is larger than {target[0]}x{target[1]}", path=path
    )


def size_text(array: np.ndarray) -> str:
    return f"{array.shape[0]}x{array.shape[1]}"
