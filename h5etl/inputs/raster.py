"""Every use of Pillow: header probes, decoding to a field's mode, resizing, PNGs.

All format quirks live here (EXIF orientation, palettes, alpha, 16-bit, 1-bit, CMYK), so the
stages above see plain numpy arrays and ``RejectError`` with a stable reason code. The value
rules of field dtypes (``decode_field``) and ``resize_to`` are in ``h5etl.inputs.pixels``; plain
8-bit PNGs, the common case, are decoded by libpng first (``h5etl.inputs.plainpng``).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import imagecodecs
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs
from h5etl.inputs import pixels, plainpng, reasons
from h5etl.inputs.pixels import (
    SIXTEEN_BIT_MODES,
    Decoded,
    FieldDtype,
    Mode,
    Palette,
    Role,
    unexpected,
)
from h5etl.inputs.pixels import (
    to_array as to_array,  # decode calls images.to_array (tests patch it)
)

_SWAPS_AXES = frozenset({5, 6, 7, 8})  # EXIF orientations that rotate by 90 degrees
_EXIF_ORIENTATION = 0x0112
_PROBE_BYTES = 4096  # a plain PNG's pixels start long before this
_NO_LABELS: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """A file's header. ``mode`` is Pillow's; ``bits`` per sample is what decode_field reads:
    8, 16 (I;16 modes, 16-bit PGMs, 16-bit colour PNGs that Pillow opens as 8-bit) or 32 (I, F).
    """

    height: int
    width: int
    mode: str
    format: str
    bits: int = 8


def _damage(path: str, exc: BaseException, data: bytes | None) -> RejectError:
    """What a file Pillow or libpng could not open or decode is called: one rule for the
    header probe and the decoders (``h5etl.inputs.reasons``); ``data`` None reads the file."""
    if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
        return RejectError(
            "decompression_bomb",
            f"more pixels than the limit of {Image.MAX_IMAGE_PIXELS} (Pillow MAX_IMAGE_PIXELS)",
            path=path,
        )
    if isinstance(exc, OSError) and (linked := inputs.link_problem(path, exc)) is not None:
        return linked
    if data is None:  # a probe's error path: the whole file says whether it was cut short
        try:
            data = inputs.read_file(path)
        except RejectError as problem:
            return problem
    unidentified = isinstance(exc, UnidentifiedImageError)
    reason, detail = reasons.damaged(data, str(exc), unidentified=unidentified)
    return RejectError(reason, detail, path=path)


def probe(path: str) -> ImageHeader:
    """Read the header only (no pixel decode): size after EXIF orientation, mode, format.

    A file whose last bytes are not where its format ends (``reasons.looks_whole``) is
    decoded too, so that a dry run finds a file cut anywhere, as a build does.

    Raises:
        RejectError: missing, dangling, looping, not a regular file, empty, unidentifiable,
            truncated, undecodable or too large.
    """
    with inputs.opened(path) as handle:
        try:
            head = handle.read(_PROBE_BYTES)
            size = handle.seek(0, os.SEEK_END)
            if size > len(head):
                handle.seek(-min(size, 16), os.SEEK_END)
            tail = handle.read() if size > len(head) else head
            handle.seek(0)
        except OSError as exc:
            problem = f"cannot read: {exc.strerror or exc}"
            raise RejectError("unreadable", problem, path=path) from exc
        header = _probe_plain_png(head)
        if header is None:
            header = _probe_with_pillow(handle, path)
    if not reasons.looks_whole(head, tail, size):
        _decodes_whole(path)
    return header


def _probe_plain_png(head: bytes) -> ImageHeader | None:
    """The header of a plain PNG from its first bytes (a tenth of Pillow's cost), or None."""
    shape = plainpng.shape_of(head, header_only=True)
    if shape is None:
        return None
    return ImageHeader(shape[0], shape[1], plainpng.MODES[shape[2]], "PNG")


def _decodes_whole(path: str) -> None:
    """Decode a file that may be cut short, as a build would (the rare case: its end is not
    where its format ends); raises its reject if it does not decode."""
    data = inputs.read_file(path)
    with _rejecting(path, data), _pillow_image(data, path):
        pass


def _probe_with_pillow(handle: BinaryIO, path: str) -> ImageHeader:
    try:
        head = handle.read(26)  # a PNG's IHDR: its bit depth
        handle.seek(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(handle) as image:
                width, height = image.size
                # Image.getexif reads only EXIF met before the pixels; PngImageFile.getexif
                # decodes the whole image to look for a chunk after them (25x slower).
                orientation = Image.Image.getexif(image).get(_EXIF_ORIENTATION, 1)
                bits = _bits(image, head)
                header = ImageHeader(height, width, image.mode, image.format or "", bits)
    except (
        OSError,
        ValueError,
        SyntaxError,
        Image.DecompressionBombError,
        Image.DecompressionBombWarning,
    ) as exc:
        raise _damage(path, exc, None) from exc
    except MemoryError:
        raise
    except Exception as exc:  # a plugin's or the EXIF parser's own error: see decode
        raise unexpected(path, exc) from exc
    if height == 0 or width == 0:
        raise RejectError("empty_image", "image has zero width or height", path=path)
    if orientation in _SWAPS_AXES:
        return ImageHeader(width, height, header.mode, header.format, header.bits)
    return header


def _sixteen_bit_colour_png(head: bytes) -> bool:
    """A 16-bit grey+alpha, RGB or RGBA PNG, which Pillow opens as 8-bit (see decode_field)."""
    ihdr = head.startswith(plainpng.SIGNATURE) and head[12:16] == b"IHDR"
    return ihdr and head[24:26] in (b"\x10\x02", b"\x10\x04", b"\x10\x06")


def _bits(image: Image.Image, head: bytes) -> int:
    if image.mode in {"I", "F"}:
        return 16 if image.format == "PPM" else 32  # Pillow reads 16-bit PGMs as mode I
    if image.mode in SIXTEEN_BIT_MODES or _sixteen_bit_colour_png(head):
        return 16
    return 8


def decode(
    data: bytes, mode: Mode, *, path: str, mask_labels: frozenset[int] | None = None
) -> np.ndarray:
    """Decode file bytes with EXIF orientation applied, converted to ``mode``.

    Plain PNGs go through libpng (``h5etl.inputs.plainpng``); everything else through Pillow.

    Raises:
        RejectError: undecodable, truncated, too large or of an unsupported pixel mode.
    """
    with _rejecting(path, data):
        array = plainpng.decode(data, mode, path=path, mask_labels=mask_labels)
        if array is None:
            with _pillow_image(data, path) as (opened, _):
                array = to_array(opened, mode, mask_labels=mask_labels, path=path)
    return _nonempty(array, path)


def decode_field(
    data: bytes,
    *,
    path: str,
    mode: Mode,
    dtype: FieldDtype,
    role: Role,
    palette: Palette = "index",
) -> Decoded:
    """Decode file bytes (EXIF orientation applied) into a field's ``mode`` and ``dtype``.

    ``array`` is (h, w, 3) for RGB, (h, w) for L; ``conversion`` is "" when exact, else a code
    of ``pixels.CONVERSIONS`` the build counts. The input's values by field dtype:

    ====================  =========  ===========  ==============  =============
    input (Pillow mode)   uint8      uint16       int16           float32
    ====================  =========  ===========  ==============  =============
    8-bit (L, RGB, P...)  as is      as is (no    as is           as is
                                     << 8: exact)
    16-bit (I;16, 16-bit  v >> 8,    as is        reject above    as is
    PGM, 16-bit PNG)      reported                32767
    32-bit int (I)        reject     reject       reject outside  reject beyond
                          outside    outside      -32768..32767   +-2**24
                          0..255     0..65535
    float (F)             reject unless integers in the dtype's   as is
                          range (NaN, 0.5 are rejected)
    ====================  =========  ===========  ==============  =============

    "reported" is conversion ``16_to_8_bits``; "reject" is ``lossy_conversion``, naming the
    values found and a dtype that holds them. A grey input of an RGB field repeats its channel;
    alpha is dropped; 16-bit colour PNGs, which Pillow opens as 8-bit, are read with libpng.
    ``role="mask"`` (mode L only): a palette file gives its indices (``palette="index"``);
    16-bit into uint8 keeps the mask rules (labels up to 255 kept; 8-bit labels widened to
    16 bits shifted back and reported), an RGB file must have equal channels. With
    ``palette="color"`` the array is the (h, w, 3) uint8 colours of any mask file, grey ones
    too, whatever ``dtype``: ``mask_values.map_colors`` makes them labels of that dtype.

    Raises:
        RejectError: as ``decode`` (truncated, too large, undecodable, EXIF or plugin
            errors), ``lossy_conversion``, ``mask_not_single_channel``, ``mask_values``.
    """
    if role == "mask" and mode != "L":
        raise ValueError(f"a mask is decoded in mode L, not {mode}")
    colour_table = role == "mask" and palette == "color"
    # the 8-bit path: what decode returns for these, colours for a colour table
    eight_bit: Mode = "RGB" if colour_table else mode
    labels = _NO_LABELS if role == "mask" and not colour_table else None
    with _rejecting(path, data):
        native = plainpng.decode(data, eight_bit, path=path, mask_labels=labels)
        source: str = eight_bit
        if native is None:
            native, source = _native_with_pillow(data, eight_bit, role, palette, labels, path)
    native = _nonempty(native, path)
    channels = (3,) if eight_bit == "RGB" else ()  # the trailing axis of the field's pixels
    if dtype == "uint8" and native.dtype == np.uint8 and native.shape[2:] == channels:
        return Decoded(native, "")  # already the field's pixels: nothing to convert
    return pixels.convert(
        native, source=source, mode=mode, dtype=dtype, role=role, palette=palette, path=path
    )


def _native_with_pillow(
    data: bytes,
    eight_bit: Mode,
    role: Role,
    palette: Palette,
    labels: frozenset[int] | None,
    path: str,
) -> tuple[np.ndarray, str]:
    """The file's pixels at their own depth (uint8, uint16, int32 for I, float32 for F)."""
    # Pillow opens a 16-bit RGB(A) or grey+alpha PNG as 8-bit RGB/RGBA: PngImagePlugin's
    # _MODES maps (16, 2) to mode "RGB" with rawmode "RGB;16B" (also (16, 4), (16, 6) to
    # RGBA), whose unpacker keeps each sample's high byte (Pillow 13.0; the tests check it).
    # libpng gives all 16 bits; the orientation is applied here as Pillow would.
    sixteen_colour = _sixteen_bit_colour_png(data)
    with _pillow_image(data, path, upright=not sixteen_colour) as (image, orientation):
        if sixteen_colour:
            return pixels.orient(imagecodecs.png_decode(data), orientation), f"{image.mode};16"
        if image.mode in {"P", "PA"} and role == "mask" and palette == "index":
            indices = np.asarray(image)  # a palette mask's indices are its labels
            return (indices[..., 0] if indices.ndim == 3 else indices), image.mode
        if image.mode in SIXTEEN_BIT_MODES or image.mode == "F":
            values = np.asarray(image)
            if values.dtype.kind == "u" or (image.mode == "I" and image.format == "PPM"):
                values = values.astype(np.uint16)  # a 16-bit PGM is mode I, scaled 0..65535
            elif values.dtype.kind == "i":
                values = values.astype(np.int32)
            return values, image.mode
        return to_array(image, eight_bit, mask_labels=labels, path=path), image.mode


def _nonempty(array: np.ndarray, path: str) -> np.ndarray:
    if array.size == 0:
        raise RejectError("empty_image", "image has zero width or height", path=path)
    return array


# What a file that Pillow or libpng cannot decode raises; ``_damage`` words each of them.
_DAMAGE = (
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    imagecodecs.PngError,  # libpng refused what Pillow read
)


def _rejecting(path: str, data: bytes) -> contextlib.AbstractContextManager[None]:
    """What decoding ``data`` (the bytes of ``path``) raises, as that file's ``RejectError``
    named by ``_damage`` (``MemoryError`` passes)."""
    return _Rejecting(path, data)


class _Rejecting(contextlib.AbstractContextManager[None]):
    """``_rejecting``'s context: a class, not a generator, because every file of every build
    is decoded inside one (a generator's context costs 1 us more a file)."""

    __slots__ = ("data", "path")

    def __init__(self, path: str, data: bytes):
        self.path, self.data = path, data

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, RejectError):
            exc.path = self.path  # raised on, with the path of the file it was decoding
        elif isinstance(exc, _DAMAGE):  # a MemoryError passes: the decode stage words it
            raise _damage(self.path, exc, self.data) from exc


@contextlib.contextmanager
def _pillow_image(
    data: bytes, path: str, *, upright: bool = True
) -> Iterator[tuple[Image.Image, int]]:
    """The loaded image and its EXIF orientation (1 once applied, as it is if ``upright``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        opened, orientation = _opened_and_loaded(data, path, upright=upright)
        with opened:
            yield opened, orientation


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


def _opened_and_loaded(data: bytes, path: str, *, upright: bool) -> tuple[Image.Image, int]:
    """Pillow's open, load and EXIF orientation: applied if ``upright``, else returned.

    Plugins and the EXIF parser also raise ``struct.error``, ``KeyError``,
    ``ZeroDivisionError``... for a malformed file: those become a ``decode_error`` of that
    file. Only these calls are guarded, so a bug in h5etl's own conversion keeps its traceback.
    """
    try:
        opened = Image.open(io.BytesIO(data))
    except _PILLOW_ERRORS:
        raise
    except Exception as exc:
        raise unexpected(path, exc) from exc
    try:
        opened.load()
        if upright:
            ImageOps.exif_transpose(opened, in_place=True)  # no copy when upright
            return opened, 1
        return opened, opened.getexif().get(_EXIF_ORIENTATION, 1)
    except BaseException as exc:
        opened.close()
        if isinstance(exc, Exception) and not isinstance(exc, _PILLOW_ERRORS):
            raise unexpected(path, exc) from exc
        raise


def save_png(path: Path, array: np.ndarray, *, mode: str | None = None) -> None:
    """Write an (h, w) or (h, w, 3) array as PNG; for demos, benchmarks and tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array, mode=mode) if mode else Image.fromarray(array)
    image.save(path, format="PNG")
