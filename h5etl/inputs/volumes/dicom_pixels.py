"""The pixels of one DICOM slice, from the file's bytes read once.

The header pass (``dicom.open_series``) reads each file only up to its Pixel Data element
(``stop_before_pixels``) and notes where that element starts and how its pixels are stored.
The pixel pass then reads each file once, whole (its SHA-256 is the lineage), and takes native
pixel data (uncompressed little-endian, one grey sample) straight from those bytes, exactly as
pydicom's native decoder does (the bits above Bits Stored ignored: masked, or sign-extended for
signed pixels). Anything else (compressed or big-endian transfer syntaxes, a file whose Pixel
Data is no longer where the header pass found it) is decoded by pydicom from the same bytes.

Parsing each slice's header a second time inside pydicom's pixel decoding cost as much as
decoding and hashing its pixels (0.4 of a 512 x 512 CT slice's decode time).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5etl.inputs.pixels import rejecting_surprises

IMPLICIT_LITTLE = "1.2.840.10008.1.2"
EXPLICIT_LITTLE = "1.2.840.10008.1.2.1"
PIXEL_DATA_TAG = b"\xe0\x7f\x10\x00"  # (7FE0,0010), little endian
UNDEFINED_LENGTH = 0xFFFFFFFF
_INTEGERS = {(8, 0): "u1", (8, 1): "i1", (16, 0): "<u2", (16, 1): "<i2"}
_INTEGERS |= {(32, 0): "<u4", (32, 1): "<i4"}


@dataclass(frozen=True, slots=True)
class NativePixels:
    """Where a slice's native pixel data sits in its file, and how to read it."""

    offset: int  # of the Pixel Data element (its tag), in the file
    explicit: bool  # explicit VR: the element header is 12 bytes, else 8
    dtype: str  # numpy dtype of one stored value (Bits Allocated, Pixel Representation)
    unused_bits: int  # Bits Allocated - Bits Stored: the high bits to ignore
    shape: tuple[int, int]  # rows, columns


def native_pixels(ds: Any, offset: int) -> NativePixels | None:
    """How to take the pixels of the header ``ds`` (read up to its Pixel Data element, which
    starts at byte ``offset`` of the file) straight from the file, or None: pydicom decodes."""
    syntax = str(getattr(ds.get("file_meta"), "TransferSyntaxUID", "") or "")
    if syntax not in (IMPLICIT_LITTLE, EXPLICIT_LITTLE) or offset <= 0:
        return None
    try:
        allocated, stored = int(ds.BitsAllocated), int(ds.BitsStored)
        representation = int(ds.PixelRepresentation)
        shape = (int(ds.Rows), int(ds.Columns))
        grey = int(ds.get("SamplesPerPixel", 1)) == 1 and str(
            ds.get("PhotometricInterpretation", "")
        ) in ("MONOCHROME1", "MONOCHROME2")
    except (AttributeError, TypeError, ValueError):
        return None
    dtype = _INTEGERS.get((allocated, representation))
    if dtype is None or not grey or not 1 <= stored <= allocated:
        return None
    return NativePixels(offset, syntax == EXPLICIT_LITTLE, dtype, allocated - stored, shape)


def _native_array(data: bytes, where: NativePixels) -> np.ndarray | None:
    """The pixels at ``where`` in ``data``, or None if the element is not found as expected."""
    at = where.offset
    if data[at : at + 4] != PIXEL_DATA_TAG:
        return None
    if where.explicit:
        if data[at + 4 : at + 6] not in (b"OW", b"OB"):
            return None
        (length,), start = struct.unpack_from("<I", data, at + 8), at + 12
    else:
        (length,), start = struct.unpack_from("<I", data, at + 4), at + 8
    count = where.shape[0] * where.shape[1]
    size = count * np.dtype(where.dtype).itemsize
    if length == UNDEFINED_LENGTH or length < size or start + size > len(data):
        return None
    pixels = np.frombuffer(data, dtype=where.dtype, count=count, offset=start)
    pixels = pixels.reshape(where.shape)
    if where.unused_bits:  # as pydicom: shift the unused high bits out and back
        pixels = pixels << where.unused_bits
        pixels >>= where.unused_bits
    return pixels.astype(pixels.dtype.newbyteorder("="), copy=False)


def slice_pixels(pydicom: Any, data: bytes, where: NativePixels | None, path: str) -> np.ndarray:
    """The pixel array of the DICOM file whose bytes are ``data`` (``where``: from its header
    pass, None to let pydicom decode).

    Raises:
        RejectError: ``decode_error`` for pixels pydicom cannot decode.
    """
    pixels = _native_array(data, where) if where is not None else None
    if pixels is not None:
        return pixels
    with rejecting_surprises(path, "decode the DICOM pixels"):
        decoded: np.ndarray = pydicom.dcmread(io.BytesIO(data)).pixel_array
    return decoded
