"""Mask validation: one channel, labels inside the field's ``values``, 0/255 read as 0/1.

A mask that breaks the rule is a reject with a reason, never a write.
"""

from __future__ import annotations

import numpy as np

from h5etl.errors import RejectError


def check_mask(mask: np.ndarray, values: tuple[int, ...], *, path: str) -> np.ndarray:
    """Return the mask with labels in ``values``; a binary 0/255 mask becomes 0/1.

    Raises:
        RejectError: reason ``mask_not_single_channel`` or ``mask_values``.
    """
    if mask.ndim != 2:
        raise RejectError(
            "mask_not_single_channel",
            f"mask must have one channel after conversion, got shape {mask.shape}",
            path=path,
        )
    # Fast answers for the usual masks (labels 0..k, or binary 0/255): two vector passes
    # instead of a histogram. Anything else gets the histogram and a precise message.
    top = int(mask.max(initial=0))
    if top < len(values) and set(values) == set(range(len(values))):
        return mask
    if top == 255 and set(values) == {0, 1}:
        ones = mask == 255
        if np.count_nonzero(ones) == np.count_nonzero(mask):
            binary_view: np.ndarray = ones.view(np.uint8)
            return binary_view
    allowed = np.zeros(256, dtype=bool)
    allowed[list(values)] = True
    present = np.flatnonzero(np.bincount(mask.ravel(), minlength=256))
    if allowed[present].all():
        return mask
    if set(values) == {0, 1} and set(present.tolist()) <= {0, 255}:
        binary: np.ndarray = (mask == 255).astype(np.uint8)
        return binary
    # a 0/255 mask with one stray value: name the stray value, not the 255s it would accept
    reads_as_255 = set(values) == {0, 1} and 1 not in present
    bad = [int(v) for v in present if not allowed[v] and not (reads_as_255 and v == 255)]
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    raise RejectError(
        "mask_values",
        f"mask values must be a subset of {list(values)}, got {shown}",
        path=path,
    )
