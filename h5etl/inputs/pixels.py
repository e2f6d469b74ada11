"""pixels: decoded values into a field's dtype and layout, and resizing arrays of any dtype.

``images`` reads a file into its native array (uint8; uint16 for 16-bit; int32 for Pillow's
mode I; float32 for mode F); this module applies the field's rules: what is exact, what is
scaled and reported with a conversion code, and what is refused (``lossy_conversion``).
Only this module and ``images`` import Pillow.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import numpy as np
from PIL import Image

from h5etl.errors import RejectError

Mode = Literal["RGB", "L"]
FieldDtype = Literal["uint8", "uint16", "int16", "float32"]
Role = Literal["image", "mask"]
Palette = Literal["index", "color"]
ResizeFilter = Literal["nearest", "bilinear", "bicubic", "lanczos", "area"]

SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
SIXTEEN_TO_EIGHT = "16_to_8_bits"
CONVERSIONS = frozenset({SIXTEEN_TO_EIGHT})  # every code ``Decoded.conversion`` may hold

# The integers each field dtype holds exactly (float32: its 24-bit significand).
_EXACT: dict[str, tuple[int, int]] = {
    "uint8": (0, 0xFF),
    "uint16": (0, 0xFFFF),
    "int16": (-0x8000, 0x7FFF),
    "float32": (-(2**24), 2**24),
}
_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    # Pillow's BOX filter has a support of 0.5 (Image.py's filter table; Resample.c's
    # box_filter): each source pixel an output pixel covers weighs the same, pixels cut by
    # the output pixel's edge by the part covered. Pillow's handbook: "Each pixel of source
    # image contributes to one pixel of the destination image with identical weights."
    # For an integer factor that is the block mean (tests/inputs/test_images_dtypes.py checks it).
    "area": Image.Resampling.BOX,
}


@dataclass(frozen=True, slots=True)
class Decoded:
    """A field's pixels and how they were converted: ``""`` when exact, else a code."""

    array: np.ndarray
    conversion: str


def convert(
    native: np.ndarray,
    *,
    source: str,
    mode: Mode,
    dtype: FieldDtype,
    role: Role,
    palette: Palette,
    path: str,
) -> Decoded:
    """Apply ``images.decode_field``'s table to a file's native pixels.

    ``native`` is (h, w) or (h, w, c) with c in 2 (grey + alpha), 3 or 4 (RGBA) of dtype uint8,
    uint16, int32 (mode I) or float32 (mode F); ``source`` names its mode in messages.
    """
    colour_table = role == "mask" and palette == "color"
    channels = 3 if mode == "RGB" or colour_table else 1
    try:
        reduced = _reduce(native, channels, role=role, path=path)
        array, conversion = to_dtype(
            reduced, "uint8" if colour_table else dtype, source=source, role=role, path=path
        )
    except RejectError as exc:
        exc.path = path
        raise
    if channels == 3 and array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=2)
    return Decoded(array, conversion)


def _reduce(native: np.ndarray, channels: int, *, role: Role, path: str) -> np.ndarray:
    """Drop alpha; for one channel, a mask's single channel or an image's luma."""
    if native.ndim == 2:
        return native
    if native.shape[2] == 2:
        return np.ascontiguousarray(native[..., 0])  # grey + alpha
    colour = native[..., :3]  # alpha dropped without compositing, as Pillow's RGBA -> RGB
    if channels == 3:
        return colour
    if role == "mask":
        return single_channel(colour, path)
    return _luma(colour)


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma exactly as Pillow's convert("L") computes it (Convert.c, fixed point:
    (19595 R + 38470 G + 7471 B + 0x8000) >> 16); float pixels keep their fraction."""
    if rgb.dtype.kind == "f":
        grey = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
        return grey.astype(rgb.dtype)
    wide = rgb.astype(np.int64)
    fixed = (wide[..., 0] * 19595 + wide[..., 1] * 38470 + wide[..., 2] * 7471 + 0x8000) >> 16
    return fixed.astype(rgb.dtype)


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
        values = np.asarray(image)
        grey = scale_sixteen_bit(values, image.mode, is_mask=mask_labels is not None)
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
        return single_channel(rgb, path)
    return np.asarray(image.convert("RGB").convert("L"))


def single_channel(rgb: np.ndarray, path: str) -> np.ndarray:
    """The one channel of a mask whose R, G and B are equal; a colour mask is a reject."""
    if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2])):
        raise RejectError(
            "mask_not_single_channel",
            "mask has colour: its R, G and B channels differ",
            path=path,
        )
    return np.ascontiguousarray(rgb[..., 0])


def to_dtype(
    values: np.ndarray, dtype: FieldDtype, *, source: str, role: Role, path: str
) -> tuple[np.ndarray, str]:
    """``values`` in ``dtype`` and the conversion code; see ``images.decode_field``."""
    if values.dtype == np.uint8:
        # 8-bit values are stored as they are in every dtype, also uint16 (no << 8): they
        # are exact there, and a rescale would change what a value means
        return (values if dtype == "uint8" else values.astype(dtype)), ""
    if values.dtype == np.uint16 and dtype == "uint8":
        if role == "mask":
            scaled = scale_sixteen_bit(values, source, is_mask=True)
            return scaled, SIXTEEN_TO_EIGHT if int(values.max(initial=0)) > 0xFF else ""
        return (values >> 8).astype(np.uint8), SIXTEEN_TO_EIGHT
    if values.dtype == np.dtype(dtype):
        return values, ""
    return _exact_cast(values, dtype, source=source, path=path), ""


def _exact_cast(values: np.ndarray, dtype: FieldDtype, *, source: str, path: str) -> np.ndarray:
    low, high = _EXACT[dtype]
    if values.size == 0:
        return values.astype(dtype)
    integral = values.dtype.kind in "iu" or bool(np.array_equal(values, np.rint(values)))
    if integral and low <= values.min() and values.max() <= high:
        return values.astype(dtype)
    raise _lossy(values, dtype, source=source, integral=integral, path=path)


def _lossy(
    values: np.ndarray, dtype: FieldDtype, *, source: str, integral: bool, path: str
) -> RejectError:
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    fits: list[str] = []
    if finite.size:
        low, high = finite.min(), finite.max()
        found = f"values {_shown(low)}..{_shown(high)}"
        if integral:
            fits = [n for n, (lo, hi) in _EXACT.items() if n != dtype and lo <= low <= high <= hi]
    else:
        found = "no finite values"
    if finite.size < values.size:
        found += " (with NaN or infinity)"
    elif not integral:
        found += " (not all integers)"
    if not integral:
        fix = "use a float32 field"
    elif fits:
        fix = f"use {_article(fits[0])} {fits[0]} field"
    else:
        fix = "no field dtype stores them exactly; rescale the images"
    exact = _EXACT[dtype]
    holds = f"integers {exact[0]}..{exact[1]}" if dtype != "float32" else "integers up to ±2**24"
    return RejectError(
        "lossy_conversion",
        f"mode {source} {found} do not fit {_article(dtype)} {dtype} field exactly "
        f"({holds}): {fix}",
        path=path,
    )


def _article(dtype: str) -> str:
    return "an" if dtype == "int16" else "a"


def _shown(value: object) -> str:
    if isinstance(value, np.floating):
        return np.format_float_positional(value, trim="-")
    return str(value)


def scale_sixteen_bit(values: np.ndarray, mode: str, *, is_mask: bool) -> np.ndarray:
    """16-bit values as 8 bits: ``v >> 8`` for images; for masks, labels kept or shifted back.

    Raises:
        RejectError: ``unsupported_mode`` for values outside 0..65535; ``mask_values`` for a
            mask value above 255 that is not an 8-bit label widened to 16 bits.
    """
    top = int(values.max(initial=0))
    if values.min(initial=0) < 0 or top > 0xFFFF:
        raise RejectError("unsupported_mode", f"{mode} values outside 0..65535")
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


# EXIF orientation -> the numpy form of Pillow's transpose that ImageOps.exif_transpose
# applies for it (2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
# 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90; Pillow rotates counter-clockwise).
def orient(array: np.ndarray, orientation: int) -> np.ndarray:
    """``array`` (h, w, ...) upright, as Pillow shows an image of that EXIF orientation."""
    if orientation == 2:
        array = array[:, ::-1]
    elif orientation == 3:
        array = array[::-1, ::-1]
    elif orientation == 4:
        array = array[::-1]
    elif orientation == 5:
        array = array.swapaxes(0, 1)
    elif orientation == 6:
        array = np.rot90(array, -1)
    elif orientation == 7:
        array = array[::-1, ::-1].swapaxes(0, 1)
    elif orientation == 8:
        array = np.rot90(array, 1)
    return np.ascontiguousarray(array)


def unexpected(path: str, exc: Exception, doing: str = "decode") -> RejectError:
    """A plugin's or h5etl's surprise on ``path``'s pixels as its ``decode_error``."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    return RejectError("decode_error", f"cannot {doing}: {name}: {exc}", path=path)


def rejecting_surprises(path: str, doing: str) -> contextlib.AbstractContextManager[None]:
    """Any exception the block raises on ``path``'s pixels becomes its ``decode_error``.

    For the steps after decoding that still see what a file holds (Pillow's resize, the mask
    check): a crafted file must cost its sample, not the build. ``RejectError`` and
    ``MemoryError`` pass through: the decode stage words them.
    """
    return _Surprises(path, doing)


class _Surprises(contextlib.AbstractContextManager[None]):
    """``rejecting_surprises``' context: a class, not a generator, because every mask of
    every build passes through one (a generator's context costs 1 us more a sample)."""

    __slots__ = ("doing", "path")

    def __init__(self, path: str, doing: str):
        self.path, self.doing = path, doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, RejectError | MemoryError):
            raise unexpected(self.path, exc, self.doing) from exc


def resize(array: np.ndarray, size: tuple[int, int], *, is_mask: bool) -> np.ndarray:
    """Resize to (h, w): Lanczos for images; nearest for masks so labels stay labels."""
    resample = Image.Resampling.NEAREST if is_mask else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(array).resize((size[1], size[0]), resample))


def resize_to(array: np.ndarray, size: tuple[int, int], filter: ResizeFilter) -> np.ndarray:
    """Resize an (h, w) or (h, w, 3) array to ``size`` (h, w) with a named Pillow filter.

    uint8 goes through Pillow's 8-bit L/RGB path, which rounds half up after each of its two
    passes (columns, then rows). uint16, int16 and
    float32 are resized channel by channel as mode F (float32, exact for 16-bit integers);
    integer dtypes are then rounded half to even (``np.rint``) and clipped to the dtype's
    range (bicubic and lanczos overshoot at edges). ``area`` is Pillow's BOX filter: the mean
    of the source pixels each output pixel covers.

    Raises:
        ValueError: another dtype or layout (a caller's bug: fields have these dtypes).
    """
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"resize_to takes (h, w) or (h, w, 3) arrays, got shape {array.shape}")
    resample = _FILTERS[filter]
    box = (size[1], size[0])
    if array.dtype == np.uint8:
        return np.asarray(Image.fromarray(array).resize(box, resample))
    if array.dtype.name not in ("uint16", "int16", "float32"):
        raise ValueError(f"resize_to takes uint8, uint16, int16 or float32, got {array.dtype}")
    planes = [array] if array.ndim == 2 else [array[..., c] for c in range(3)]
    resized = [
        np.asarray(Image.fromarray(plane.astype(np.float32)).resize(box, resample))
        for plane in planes
    ]
    out: np.ndarray = resized[0] if array.ndim == 2 else np.stack(resized, axis=2)
    if array.dtype == np.float32:
        return out
    info = np.iinfo(array.dtype)
    rounded: np.ndarray = np.clip(np.rint(out), info.min, info.max).astype(array.dtype)
    return rounded
