"""plainpng: plain 8-bit PNGs decoded by libpng (imagecodecs), the common case, exactly as Pillow
would decode them.

A PNG qualifies when libpng's pixels are Pillow's by construction: 8-bit, non-interlaced grey,
RGB or RGBA, every chunk inert, valid CRCs, ending at IEND (``shape_of``). Anything else returns
None here and goes to Pillow in ``h5etl.inputs.raster``, which words every reject.
"""

from __future__ import annotations

import struct
import zlib

import imagecodecs
import numpy as np
from PIL import Image

from h5etl.inputs import pixels
from h5etl.inputs.pixels import Mode

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunks that cannot change the pixels Pillow returns: colour-management metadata it ignores.
# Anything else (a palette, transparency, EXIF or text that may carry an XMP orientation)
# sends the file down Pillow's path.
INERT_CHUNKS = frozenset(
    {b"IHDR", b"IDAT", b"IEND", b"sRGB", b"gAMA", b"pHYs", b"cHRM", b"sBIT", b"bKGD", b"tIME"}
)
CHANNELS = {0: 1, 2: 3, 6: 4}  # 8-bit colour types: grey, RGB, RGBA
MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # Pillow's mode for those channel counts
# compiled once: every file of every build is walked (a format string is parsed per call)
_CHUNK_HEAD, _CRC, _IHDR = struct.Struct(">I4s"), struct.Struct(">I"), struct.Struct(">IIBBBBB")


def shape_of(data: bytes, *, header_only: bool = False) -> tuple[int, int, int] | None:
    """``(height, width, channels)`` of a PNG that libpng decodes to exactly Pillow's pixels.

    That is an 8-bit, non-interlaced grey, RGB or RGBA PNG within Pillow's pixel limit whose
    chunks are all inert (see ``INERT_CHUNKS``), with valid CRCs outside the pixel data,
    ending at IEND. Anything else returns None and is Pillow's to decode, or to reject.
    With ``header_only``, ``data`` is the file's start and the walk stops at the pixels: the
    answer Pillow's header parse would give, orientation included (there is no EXIF).
    """
    if not data.startswith(SIGNATURE):
        return None
    pos, end, shape = len(SIGNATURE), len(data), None
    while pos + 12 <= end:
        length, kind = _CHUNK_HEAD.unpack_from(data, pos)
        stop = pos + 12 + length
        if kind not in INERT_CHUNKS:
            return None
        if header_only and kind == b"IDAT":
            return shape
        if stop > end:
            return None
        if kind != b"IDAT":  # libpng checks the pixel chunks' CRCs itself
            (crc,) = _CRC.unpack_from(data, stop - 4)
            if zlib.crc32(data[pos + 4 : stop - 4]) != crc:
                return None
        if kind == b"IHDR" and shape is None and pos == len(SIGNATURE) and length == 13:
            shape = _plain_ihdr(data, pos + 8)
        if shape is None or (kind == b"IHDR" and pos != len(SIGNATURE)):
            return None
        if kind == b"IEND":
            return shape if stop == end else None
        pos = stop
    return None


def _plain_ihdr(data: bytes, at: int) -> tuple[int, int, int] | None:
    width, height, depth, colour, method, filtering, interlace = _IHDR.unpack_from(data, at)
    if (depth, method, filtering, interlace) != (8, 0, 0, 0) or colour not in CHANNELS:
        return None
    if not 0 < width * height <= (Image.MAX_IMAGE_PIXELS or width * height):
        return None
    return (height, width, CHANNELS[colour])


def decode(
    data: bytes, mode: Mode, *, path: str, mask_labels: frozenset[int] | None
) -> np.ndarray | None:
    """libpng's decode of a plain PNG (about 1.7x faster than Pillow's), or None.

    Returns exactly what Pillow's path returns for that file and ``mode`` (the tests compare
    the two); None where the conversion would need Pillow (colour to grey for an image).
    """
    found = shape_of(data)
    if found is None or (mode == "L" and found[2] > 1 and mask_labels is None):
        return None
    try:
        values = imagecodecs.png_decode(data)
    except imagecodecs.PngError:
        return None  # Pillow decides what is wrong with it, and says so
    expected = found if found[2] > 1 else found[:2]
    if values.shape != expected or values.dtype != np.uint8:
        return None
    if found[2] == 1:
        return values if mode == "L" else np.repeat(values[..., None], 3, axis=2)
    rgb = values[..., :3]  # Pillow's RGBA -> RGB drops alpha without compositing
    if mode == "RGB":
        return rgb if found[2] == 3 else np.ascontiguousarray(rgb)
    return pixels.single_channel(rgb, path)
