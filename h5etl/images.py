"""Every use of Pillow (and libpng): header probes, decoding to a field's mode, resizing, PNGs.

All format quirks live here (EXIF orientation, palettes, alpha, 16-bit, 1-bit, CMYK), so the
stages above see plain numpy arrays and ``RejectError`` with a stable reason code.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import imagecodecs
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from h5etl import inputs
from h5etl.errors import RejectError

Mode = Literal["RGB", "L"]
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
_SWAPS_AXES = frozenset({5, 6, 7, 8})  # EXIF orientations that rotate by 90 degrees
_EXIF_ORIENTATION = 0x0112
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunks that cannot change the pixels Pillow returns: colour-management metadata it ignores.
# Anything else (a palette, transparency, EXIF or text that may carry an XMP orientation)
# sends the file down Pillow's path.
_INERT_PNG_CHUNKS = frozenset(
    {b"IHDR", b"IDAT", b"IEND", b"sRGB", b"gAMA", b"pHYs", b"cHRM", b"sBIT", b"bKGD", b"tIME"}
)
_PNG_CHANNELS = {0: 1, 2: 3, 6: 4}  # 8-bit colour types: grey, RGB, RGBA
_PNG_MODES = {1: "L", 3: "RGB", 4: "RGBA"}  # Pillow's mode for those channel counts
_PROBE_BYTES = 4096  # a plain PNG's pixels start long before this


@dataclass(frozen=True, slots=True)
class ImageHeader:
    height: int
    width: int
    mode: str
    format: str


def _open_error(path: str, exc: BaseException) -> RejectError:
    if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
        return RejectError(
            "decompression_bomb",
            f"more pixels than the limit of {Image.MAX_IMAGE_PIXELS} (Pillow MAX_IMAGE_PIXELS)",
            path=path,
        )
    if isinstance(exc, OSError) and (linked := inputs.link_problem(path, exc)) is not None:
        return linked
    if "truncated" in str(exc):
        return RejectError("truncated", "file ends before the image does", path=path)
    if isinstance(exc, UnidentifiedImageError):
        size = os.path.getsize(path) if os.path.exists(path) else 0
        what = "empty file" if size == 0 else "not an image Pillow can identify"
        return RejectError("unreadable", what, path=path)
    return RejectError("unreadable", f"{type(exc).__name__}: {exc}", path=path)


def probe(path: str) -> ImageHeader:
    """Read the header only (no pixel decode): size after EXIF orientation, mode, format.

    Raises:
        RejectError: missing, dangling, looping, not a regular file, empty, unidentifiable,
            undecodable or too large.
    """
    plain = _probe_plain_png(path)
    if plain is not None:
        return plain
    with inputs.opened(path) as handle:
        return _probe_with_pillow(handle, path)


def _probe_plain_png(path: str) -> ImageHeader | None:
    """The header of a plain PNG from its first bytes (a tenth of Pillow's cost), or None."""
    try:
        with inputs.opened(path) as handle:
            head = handle.read(_PROBE_BYTES)
    except (RejectError, OSError):
        return None  # Pillow's probe words the error
    shape = plain_png_shape(head, header_only=True)
    if shape is None:
        return None
    return ImageHeader(shape[0], shape[1], _PNG_MODES[shape[2]], "PNG")


def _probe_with_pillow(handle: BinaryIO, path: str) -> ImageHeader:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(handle) as image:
                width, height = image.size
                # Image.getexif reads only EXIF met before the pixels; PngImageFile.getexif
                # decodes the whole image to look for a chunk after them (25x slower).
                orientation = Image.Image.getexif(image).get(_EXIF_ORIENTATION, 1)
                header = ImageHeader(height, width, image.mode, image.format or "")
    except (
        OSError,
        ValueError,
        SyntaxError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as exc:
        raise _open_error(path, exc) from exc
    except MemoryError:
        raise
    except Exception as exc:  # a plugin's or the EXIF parser's own error: see decode
        raise _unexpected(path, exc) from exc
    if height == 0 or width == 0:
        raise RejectError("empty_image", "image has zero width or height", path=path)
    if orientation in _SWAPS_AXES:
        return ImageHeader(width, height, header.mode, header.format)
    return header


def _scale_sixteen_bit(image: Image.Image, *, is_mask: bool) -> np.ndarray:
    values = np.asarray(image)
    top = int(values.max(initial=0))
    if values.min(initial=0) < 0 or top > 0xFFFF:
        raise RejectError("unsupported_mode", f"{image.mode} values outside 0..65535")
    if not is_mask:
        return (values >> 8).astype(np.uint8)
    if top <= 0xFF:
        # Labels stored in 16 bits (0/1, 0/255, 0..k) keep their values, so that
        # validate.check_mask judges them: under v >> 8 they would all become 0, a valid mask.
        return values.astype(np.uint8)
    scaled = values >> 8
    # 8-bit labels widened to 16 bits (0/65535 is 255 * 257; 256 is 1 << 8) shift back
    # exactly; any other value above 255 would merge with its neighbours, so say which.
    inexact = values[(values != scaled * 257) & (values != scaled << 8)]
    if inexact.size:
        bad = np.unique(inexact)
        shown = ", ".join(map(str, bad[:5].tolist())) + (", ..." if bad.size > 5 else "")
        raise RejectError(
            "mask_values",
            f"16-bit mask values must be labels up to 255 or 8-bit labels widened to 16 bits "
            f"(v * 257 or v * 256), got {shown}",
        )
    return scaled.astype(np.uint8)


def _single_channel(rgb: np.ndarray, path: str) -> np.ndarray:
    if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])):
        raise RejectError(
            "mask_not_single_channel",
            "mask has colour: its R, G and B channels differ",
            path=path,
        )
    return np.ascontiguousarray(rgb[..., 0])


def _without_palette(image: Image.Image) -> Image.Image:
    if image.mode == "P":
        return image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode == "PA":
        return image.convert("RGBA")
    return image


def to_array(
    image: Image.Image, mode: Mode, *, mask_labels: frozenset[int] | None, path: str
) -> np.ndarray:
    """Convert a loaded image to (h, w, 3) uint8 for RGB or (h, w) uint8 for L.

    ``mask_labels`` marks a mask: colour is refused instead of blended into grey.
    """
    image = _without_palette(image)
    if image.mode in SIXTEEN_BIT_MODES:
        grey = _scale_sixteen_bit(image, is_mask=mask_labels is not None)
        return np.repeat(grey[..., None], 3, axis=2) if mode == "RGB" else grey
    if image.mode in {"F", "I;32", "BGR;24"}:
        raise RejectError(
            "unsupported_mode", f"pixel mode {image.mode} is not supported", path=path
        )
    if image.mode == mode:
        return np.asarray(image)  # convert() to the same mode would copy the pixels
    if mode == "RGB":
        return np.asarray(image.convert("RGB"))
    if image.mode in {"1", "LA"}:
        return np.asarray(image.convert("L"))
    rgb = np.asarray(image.convert("RGB"))
    if mask_labels is not None:
        return _single_channel(rgb, path)
    return np.asarray(image.convert("RGB").convert("L"))


def plain_png_shape(data: bytes, *, header_only: bool = False) -> tuple[int, int, int] | None:
    """``(height, width, channels)`` of a PNG that libpng decodes to exactly Pillow's pixels.

    That is an 8-bit, non-interlaced grey, RGB or RGBA PNG within Pillow's pixel limit whose
    chunks are all inert (see ``_INERT_PNG_CHUNKS``), with valid CRCs outside the pixel data,
    ending at IEND. Anything else returns None and is Pillow's to decode, or to reject.
    With ``header_only``, ``data`` is the file's start and the walk stops at the pixels: the
    answer Pillow's header parse would give, orientation included (there is no EXIF).
    """
    if not data.startswith(_PNG_SIGNATURE):
        return None
    pos, end, shape = len(_PNG_SIGNATURE), len(data), None
    while pos + 12 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        stop = pos + 12 + length
        if kind not in _INERT_PNG_CHUNKS:
            return None
        if header_only and kind == b"IDAT":
            return shape
        if stop > end:
            return None
        if kind != b"IDAT":  # libpng checks the pixel chunks' CRCs itself
            (crc,) = struct.unpack_from(">I", data, stop - 4)
            if zlib.crc32(data[pos + 4 : stop - 4]) != crc:
                return None
        if kind == b"IHDR" and shape is None and pos == len(_PNG_SIGNATURE) and length == 13:
            shape = _plain_ihdr(data, pos + 8)
        if shape is None or (kind == b"IHDR" and pos != len(_PNG_SIGNATURE)):
            return None
        if kind == b"IEND":
            return shape if stop == end else None
        pos = stop
    return None


def _plain_ihdr(data: bytes, at: int) -> tuple[int, int, int] | None:
    width, height, depth, colour, method, filtering, interlace = struct.unpack_from(
        ">IIBBBBB", data, at
    )
    if (depth, method, filtering, interlace) != (8, 0, 0, 0) or colour not in _PNG_CHANNELS:
        return None
    if not 0 < width * height <= (Image.MAX_IMAGE_PIXELS or width * height):
        return None
    return (height, width, _PNG_CHANNELS[colour])


def _decode_plain_png(
    data: bytes, mode: Mode, *, path: str, mask_labels: frozenset[int] | None
) -> np.ndarray | None:
    """libpng's decode of a plain PNG (about 1.7x faster than Pillow's), or None.

    Returns exactly what Pillow's path returns for that file and ``mode`` (the tests compare
    the two); None where the conversion would need Pillow (colour to grey for an image).
    """
    shape = plain_png_shape(data)
    if shape is None or (mode == "L" and shape[2] > 1 and mask_labels is None):
        return None
    try:
        pixels = imagecodecs.png_decode(data)
    except imagecodecs.PngError:
        return None  # Pillow decides what is wrong with it, and says so
    expected = shape if shape[2] > 1 else shape[:2]
    if pixels.shape != expected or pixels.dtype != np.uint8:
        return None
    if shape[2] == 1:
        return pixels if mode == "L" else np.repeat(pixels[..., None], 3, axis=2)
    rgb = pixels[..., :3]  # Pillow's RGBA -> RGB drops alpha without compositing
    if mode == "RGB":
        return rgb if shape[2] == 3 else np.ascontiguousarray(rgb)
    return _single_channel(rgb, path)


def decode(
    data: bytes, mode: Mode, *, path: str, mask_labels: frozenset[int] | None = None
) -> np.ndarray:
    """Decode file bytes with EXIF orientation applied, converted to ``mode``.

    Plain PNGs go through libpng (``plain_png_shape``); everything else through Pillow.

    Raises:
        RejectError: undecodable, truncated, too large or of an unsupported pixel mode.
    """
    try:
        array = _decode_plain_png(data, mode, path=path, mask_labels=mask_labels)
        if array is None:
            array = _decode_with_pillow(data, mode, path=path, mask_labels=mask_labels)
    except RejectError as exc:
        exc.path = path
        raise
    except MemoryError:
        raise  # the decode stage rejects the sample as memory_error
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _open_error(path, exc) from exc
    except UnidentifiedImageError as exc:
        raise _open_error(path, exc) from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        if "truncated" in str(exc):
            raise _open_error(path, exc) from exc
        raise RejectError("decode_error", f"cannot decode: {exc}", path=path) from exc
    if array.size == 0:
        raise RejectError("empty_image", "image has zero width or height", path=path)
    return array


def _decode_with_pillow(
    data: bytes, mode: Mode, *, path: str, mask_labels: frozenset[int] | None
) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with _opened_and_loaded(data, path) as opened:
            return to_array(opened, mode, mask_labels=mask_labels, path=path)


# What Pillow raises by design for a bad file; decode words each of them.
_PILLOW_ERRORS = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    MemoryError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)


def _opened_and_loaded(data: bytes, path: str) -> Image.Image:
    """Pillow's open, load and EXIF orientation, upright.

    Plugins and the EXIF parser also raise ``struct.error``, ``KeyError``,
    ``ZeroDivisionError``... for a malformed file: those become a ``decode_error`` of that
    file. Only these calls are guarded, so a bug in h5etl's own conversion keeps its traceback.
    """
    try:
        opened = Image.open(io.BytesIO(data))
    except _PILLOW_ERRORS:
        raise
    except Exception as exc:
        raise _unexpected(path, exc) from exc
    try:
        opened.load()
        ImageOps.exif_transpose(opened, in_place=True)  # no copy when upright
    except BaseException as exc:
        opened.close()
        if isinstance(exc, Exception) and not isinstance(exc, _PILLOW_ERRORS):
            raise _unexpected(path, exc) from exc
        raise
    return opened


def _unexpected(path: str, exc: Exception, doing: str = "decode") -> RejectError:
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return RejectError("decode_error", f"cannot {doing}: {name}: {exc}", path=path)


@contextlib.contextmanager
def rejecting_surprises(path: str, doing: str) -> Iterator[None]:
    """Any exception the block raises on ``path``'s pixels becomes its ``decode_error``.

    For the steps after decoding that still see what a file holds (Pillow's resize, the mask
    check): a crafted file must cost its sample, not the build. ``RejectError`` and
    ``MemoryError`` pass through: the decode stage words them.
    """
    try:
        yield
    except (RejectError, MemoryError):
        raise
    except Exception as exc:
        raise _unexpected(path, exc, doing) from exc


def resize(array: np.ndarray, size: tuple[int, int], *, is_mask: bool) -> np.ndarray:
    """Resize to (h, w): Lanczos for images; nearest for masks so labels stay labels."""
    resample = Image.Resampling.NEAREST if is_mask else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(array).resize((size[1], size[0]), resample))


def save_png(path: Path, array: np.ndarray, *, mode: str | None = None) -> None:
    """Write an (h, w) or (h, w, 3) array as PNG; for demos, benchmarks and tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array, mode=mode) if mode else Image.fromarray(array)
    image.save(path, format="PNG")
