"""Mask validation: one channel, labels inside the field's ``values``, 0/255 read as 0/1.

Colour-coded masks become labels through the field's ``colors`` table first (``map_colors``).
A mask that breaks the rule is a reject with a reason, never a write.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import DTypeLike

from h5etl.errors import RejectError


def check_mask(mask: np.ndarray, values: tuple[int, ...], *, path: str) -> np.ndarray:
    """Return the mask with labels in ``values``; a binary 0/255 mask becomes 0/1.

    Any labels (``(0, 1, 2, 3)``, ``(0, 7, 255)``) of a uint8 or uint16 mask (up to 65535);
    the result keeps the mask's dtype.

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
    unsigned = mask.dtype.kind == "u" or int(mask.min(initial=0)) >= 0
    if unsigned and top < len(values) and set(values) == set(range(len(values))):
        return mask
    if top == 255 and set(values) == {0, 1}:
        ones = mask == 255
        if np.count_nonzero(ones) == np.count_nonzero(mask):
            binary_view: np.ndarray = ones.view(np.uint8)
            return binary_view if mask.dtype == np.uint8 else ones.astype(mask.dtype)
    present = _present(mask)
    allowed = np.isin(present, values)
    if allowed.all():
        return mask
    if set(values) == {0, 1} and set(present.tolist()) <= {0, 255}:
        binary: np.ndarray = (mask == 255).astype(mask.dtype)
        return binary
    # a 0/255 mask with one stray value: name the stray value, not the 255s it would accept
    reads_as_255 = set(values) == {0, 1} and 1 not in present
    bad = [v for v in present[~allowed].tolist() if not (reads_as_255 and v == 255)]
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    raise RejectError(
        "mask_values",
        f"mask values must be a subset of {list(values)}, got {shown}",
        path=path,
    )


def _present(mask: np.ndarray) -> np.ndarray:
    """The distinct values of a mask, sorted: a histogram for 8 and 16 bits, else a sort."""
    if mask.dtype in (np.uint8, np.uint16):
        return np.flatnonzero(np.bincount(mask.ravel(), minlength=1))
    return np.unique(mask)


def map_colors(
    rgb: np.ndarray,
    colors: Mapping[tuple[int, int, int], int],
    *,
    path: str,
    dtype: DTypeLike = np.uint8,
    what: str = "the colour table",
) -> np.ndarray:
    """Map an (h, w, 3) uint8 colour mask to (h, w) labels of ``dtype`` through ``colors``.

    Each pixel is packed into one uint32 and looked up by a perfect hash of the table's
    colours (``np.searchsorted`` for tables too large for one): no Python loop over pixels, a
    512x512 mask in a few milliseconds. ``what`` names the table in messages
    (``"fields.seg.colors"``).

    Raises:
        RejectError: ``unknown_color``, naming the first unknown colour in reading order, how
            many pixels have it, its first pixel and how many other unknown colours there are.
        ValueError: ``rgb`` is not (h, w, 3) uint8, or a label does not fit ``dtype`` (the
            caller's bug: the config checks labels).
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"map_colors takes (h, w, 3) uint8 colours, got {rgb.dtype} {rgb.shape}")
    out = np.dtype(dtype)
    keys = np.array([(r << 16) | (g << 8) | b for r, g, b in colors], np.uint32)
    labels = np.array(list(colors.values()), np.int64)
    if out.kind in "iu" and labels.size:
        info = np.iinfo(out)
        if labels.min() < info.min or labels.max() > info.max:
            raise ValueError(f"labels {labels.min()}..{labels.max()} do not fit {out}")
    packed = rgb[..., 0].astype(np.uint32)
    packed <<= 8
    packed |= rgb[..., 1]
    packed <<= 8
    packed |= rgb[..., 2]
    slot = _lookup(keys, packed)
    # slot keys.size is "no such colour": its key is no 24-bit colour
    known = np.append(keys, np.uint32(0xFFFFFFFF))[slot] == packed
    if not known.all():
        raise _unknown_colour(rgb, packed, known, what, path)
    mapped: np.ndarray = np.append(labels, 0).astype(out)[slot]
    return mapped


# Knuth's multiplicative hashing: a prime near 2**32 / golden ratio
_FIBONACCI = np.uint32(0x9E3779B1)


def _lookup(keys: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """Per pixel, the index in ``keys`` of its colour if it is there, else any index or k.

    A perfect hash of the few table colours (the top bits of key * _FIBONACCI, as few as make
    them distinct) costs one multiply, shift and gather per pixel: half of np.searchsorted's
    time for 25 colours. Tables it cannot separate in 16 bits use np.searchsorted.
    """
    for bits in range(max(1, int(keys.size).bit_length()), 17):
        shift = np.uint32(32 - bits)
        hashed = (keys * _FIBONACCI) >> shift
        if np.unique(hashed).size == keys.size:
            table = np.full(1 << bits, keys.size, np.min_scalar_type(keys.size))
            table[hashed] = np.arange(keys.size)
            index = packed * _FIBONACCI
            index >>= shift
            slots: np.ndarray = table[index]
            return slots
    order = np.argsort(keys)
    index = np.minimum(np.searchsorted(keys[order], packed), keys.size - 1)
    return np.append(order, keys.size)[index]


def _unknown_colour(
    rgb: np.ndarray, packed: np.ndarray, known: np.ndarray, what: str, path: str
) -> RejectError:
    first = int(np.argmax(~known.ravel()))
    row, col = divmod(first, packed.shape[1])
    colour = packed[row, col]
    count = int(np.count_nonzero(packed == colour))
    others = int(np.unique(packed[~known]).size) - 1
    where = f"{count} pixel{'s' if count != 1 else ''}, first at row {row}, col {col}"
    if others:
        where += f"; {others} more unknown colour{'s' if others != 1 else ''}"
    return RejectError(
        "unknown_color",
        f"colour {rgb[row, col].tolist()} is not in {what} ({where}): "
        f"add {'them' if others else 'it'} to the table or fix the mask",
        path=path,
    )
