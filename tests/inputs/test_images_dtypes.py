"""images.decode_field and pixels.resize_to: every field dtype, nothing lossy is silent.

Inputs are built here with numpy, Pillow and imagecodecs; every expected array is computed
here by hand (shifts, casts, block means, strides), never by h5etl.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any, get_args

import imagecodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from h5etl.errors import RejectError
from h5etl.inputs import pixels
from h5etl.inputs import raster as images

rng = np.random.default_rng(12)
DTYPES: tuple[pixels.FieldDtype, ...] = get_args(pixels.FieldDtype)
FILTERS: tuple[pixels.ResizeFilter, ...] = get_args(pixels.ResizeFilter)


def encode(array: np.ndarray, fmt: str = "PNG", **params: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png16(array: np.ndarray) -> bytes:
    """A 16-bit PNG written by libpng (Pillow cannot write 16-bit colour)."""
    return bytes(imagecodecs.png_encode(array.astype(np.uint16)))


def field(
    data: bytes,
    dtype: pixels.FieldDtype,
    mode: pixels.Mode = "L",
    *,
    path: str = "x.png",
) -> pixels.Decoded:
    return images.decode_field(data, path=path, mode=mode, dtype=dtype, role="image")


def lossy(data: bytes, dtype: pixels.FieldDtype, mode: pixels.Mode = "L") -> RejectError:
    with pytest.raises(RejectError) as caught:
        field(data, dtype, mode, path="bad.tif")
    assert caught.value.reason == "lossy_conversion"
    assert caught.value.path == "bad.tif"
    article = "an" if dtype == "int16" else "a"
    assert f"{article} {dtype} field" in caught.value.message
    return caught.value


# --- 8-bit inputs --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_eight_bit_grey_keeps_its_values_in_every_dtype(dtype: pixels.FieldDtype) -> None:
    grey = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    out = field(encode(grey), dtype)
    assert out.conversion == ""
    assert out.array.dtype == np.dtype(dtype)
    # a uint16 field stores 8-bit values as they are (no << 8): they are exact
    np.testing.assert_array_equal(out.array, grey.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eight_bit_rgb_and_grey_to_rgb(dtype: pixels.FieldDtype) -> None:
    rgb = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
    out = field(encode(rgb), dtype, "RGB")
    np.testing.assert_array_equal(out.array, rgb.astype(dtype))
    grey = rng.integers(0, 256, (4, 6), dtype=np.uint8)
    repeated = field(encode(grey), dtype, "RGB")
    assert repeated.array.shape == (4, 6, 3)
    np.testing.assert_array_equal(repeated.array, np.repeat(grey[..., None], 3, 2).astype(dtype))
    assert out.conversion == repeated.conversion == ""


def test_eight_bit_fields_match_decode() -> None:
    # the uint8 image path of decode_field is today's decode, pixel for pixel
    for array, fmt in [
        (rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "PNG"),
        (rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "BMP"),
        (rng.integers(0, 256, (6, 5), dtype=np.uint8), "PNG"),
    ]:
        data = encode(array, fmt)
        for mode in ("RGB", "L"):
            expected = images.decode(data, mode, path="x")
            np.testing.assert_array_equal(field(data, "uint8", mode).array, expected)


# --- 16-bit grey (Pillow mode I;16) --------------------------------------------------------


def grey16(values: np.ndarray) -> bytes:
    data = encode(values.astype(np.uint16))
    with Image.open(io.BytesIO(data)) as reopened:
        assert reopened.mode == "I;16"
    return data


CT = np.array([[66, 300, 2090], [0, 1024, 65535]])  # the CT slices: 66..2090


def test_sixteen_bit_into_uint8_is_shifted_and_reported() -> None:
    # 16-bit CT slices (66-2090) were stored as uint8 0-8 without a word
    out = field(grey16(CT), "uint8")
    assert out.conversion == "16_to_8_bits"
    np.testing.assert_array_equal(out.array, (CT >> 8).astype(np.uint8))
    rgb = field(grey16(CT), "uint8", "RGB")
    assert rgb.conversion == "16_to_8_bits"
    np.testing.assert_array_equal(rgb.array, np.repeat((CT >> 8)[..., None], 3, 2))


@pytest.mark.parametrize("dtype", ["uint16", "float32"])
def test_sixteen_bit_is_exact_in_uint16_and_float32(dtype: pixels.FieldDtype) -> None:
    values = rng.integers(0, 65536, (9, 8))
    out = field(grey16(values), dtype)
    assert (out.conversion, out.array.dtype) == ("", np.dtype(dtype))
    np.testing.assert_array_equal(out.array, values)


def test_sixteen_bit_into_int16() -> None:
    values = np.array([[0, 32767], [66, 2090]])
    out = field(grey16(values), "int16")
    assert (out.conversion, out.array.dtype) == ("", np.dtype(np.int16))
    np.testing.assert_array_equal(out.array, values)
    error = lossy(grey16(CT), "int16")
    assert "0..65535" in error.message
    assert "use a uint16 field" in error.message


def test_sixteen_bit_pgm_counts_as_sixteen_bit() -> None:
    # Pillow reads a 16-bit PGM (maxval 65535) as mode I (32-bit); its values are 16-bit
    data = encode(CT.astype(np.uint16), "PPM")
    with Image.open(io.BytesIO(data)) as reopened:
        assert reopened.mode == "I"
    out = field(data, "uint8")
    assert out.conversion == "16_to_8_bits"
    np.testing.assert_array_equal(out.array, CT >> 8)
    np.testing.assert_array_equal(field(data, "uint16").array, CT)


# --- 16-bit colour PNGs (Pillow gives 8-bit RGB; libpng gives 16 bits) ----------------------


def test_pillow_reads_sixteen_bit_rgb_as_eight_bit() -> None:
    # why decode_field reads these with libpng: Pillow keeps the high byte only
    values = rng.integers(0, 65536, (3, 4, 3))
    with Image.open(io.BytesIO(png16(values))) as image:
        assert image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), values >> 8)


@pytest.mark.parametrize("channels", [3, 4], ids=["rgb", "rgba"])
def test_sixteen_bit_rgb_png_keeps_sixteen_bits(channels: int) -> None:
    values = rng.integers(0, 65536, (5, 6, channels))
    out = field(png16(values), "uint16", "RGB")
    assert (out.conversion, out.array.dtype) == ("", np.dtype(np.uint16))
    np.testing.assert_array_equal(out.array, values[..., :3])  # alpha dropped, as for 8-bit
    shifted = field(png16(values), "uint8", "RGB")
    assert shifted.conversion == "16_to_8_bits"
    np.testing.assert_array_equal(shifted.array, values[..., :3] >> 8)
    np.testing.assert_array_equal(field(png16(values), "float32", "RGB").array, values[..., :3])


def test_sixteen_bit_grey_alpha_png() -> None:
    values = rng.integers(0, 65536, (4, 5, 2))
    np.testing.assert_array_equal(field(png16(values), "uint16").array, values[..., 0])
    rgb = field(png16(values), "uint16", "RGB").array
    np.testing.assert_array_equal(rgb, np.repeat(values[..., :1], 3, 2))


def test_sixteen_bit_rgb_png_to_grey_is_luma() -> None:
    values = rng.integers(0, 65536, (4, 5, 3))
    r, g, b = (values[..., i] for i in range(3))
    # ITU-R 601-2 in Pillow's own fixed point (Convert.c), as its convert("L") does 8 bits
    luma = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    out = field(png16(values), "uint16")
    np.testing.assert_array_equal(out.array, luma)
    grey = np.repeat(rng.integers(0, 65536, (4, 5, 1)), 3, 2)  # grey content stays exact
    np.testing.assert_array_equal(field(png16(grey), "uint16").array, grey[..., 0])
    assert field(png16(values), "uint8").conversion == "16_to_8_bits"


def with_chunk_after_ihdr(data: bytes, kind: bytes, body: bytes) -> bytes:
    chunk = struct.pack(">I", len(body)) + kind + body
    chunk += struct.pack(">I", zlib.crc32(kind + body))
    return data[:33] + chunk + data[33:]


def oriented(data: bytes, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return with_chunk_after_ihdr(data, b"eXIf", exif.tobytes()[6:])  # PNG stores no "Exif\0\0"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_sixteen_bit_rgb_png_honours_exif_orientation(orientation: int) -> None:
    values = rng.integers(0, 65536, (4, 7, 3))
    data = oriented(png16(values), orientation)
    with Image.open(io.BytesIO(data)) as image:
        assert image.getexif()[0x0112] == orientation
        upright = np.asarray(ImageOps.exif_transpose(image))  # Pillow's 8-bit, upright
    out = field(data, "uint16", "RGB").array
    assert out.shape == upright.shape
    np.testing.assert_array_equal(out >> 8, upright)
    if orientation == 6:  # shown rotated 90 degrees clockwise
        np.testing.assert_array_equal(out, np.rot90(values, k=-1))


# --- mode F and mode I (TIFF) --------------------------------------------------------------


def tiff(values: np.ndarray) -> bytes:
    return encode(values, "TIFF")


def test_float_image_into_float32_is_as_is() -> None:
    values = rng.normal(0, 1000, (5, 6)).astype(np.float32)
    out = field(tiff(values), "float32")
    assert (out.conversion, out.array.dtype) == ("", np.dtype(np.float32))
    np.testing.assert_array_equal(out.array, values)
    rgb = field(tiff(values), "float32", "RGB").array
    np.testing.assert_array_equal(rgb, np.repeat(values[..., None], 3, 2))


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        pytest.param([[0.0, 255.0], [17.0, 3.0]], "uint8", id="uint8"),
        pytest.param([[0.0, 65535.0], [2090.0, 66.0]], "uint16", id="uint16"),
        pytest.param([[-32768.0, 32767.0], [-1.0, 0.0]], "int16", id="int16"),
    ],
)
def test_integral_float_in_range_is_exact(values: list[list[float]], dtype: str) -> None:
    out = field(tiff(np.array(values, np.float32)), dtype)  # type: ignore[arg-type]
    assert (out.conversion, out.array.dtype) == ("", np.dtype(dtype))
    np.testing.assert_array_equal(out.array, values)


@pytest.mark.parametrize(
    ("values", "dtype", "found", "fix"),
    [
        pytest.param([[0.5, 1.0]], "uint8", "0.5..1", "use a float32 field", id="fraction"),
        pytest.param([[0.0, 300.0]], "uint8", "0..300", "use a uint16 field", id="above-255"),
        pytest.param([[-1.0, 3.0]], "uint8", "-1..3", "use an int16 field", id="negative"),
        pytest.param([[-1.0, 70000.0]], "uint16", "-1..70000", "float32", id="wide"),
        pytest.param([[0.0, 40000.0]], "int16", "0..40000", "use a uint16 field", id="int16"),
        pytest.param([[np.nan, 1.0]], "uint8", "NaN", "float32", id="nan"),
    ],
)
def test_lossy_float_is_rejected(
    values: list[list[float]], dtype: pixels.FieldDtype, found: str, fix: str
) -> None:
    error = lossy(tiff(np.array(values, np.float32)), dtype)
    assert "mode F" in error.message
    assert found in error.message
    assert fix in error.message


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        pytest.param([[0, 255]], "uint8", id="uint8"),
        pytest.param([[0, 65535]], "uint16", id="uint16"),
        pytest.param([[-32768, 32767]], "int16", id="int16"),
        pytest.param([[-(2**24), 2**24]], "float32", id="float32-exact-to-2**24"),
    ],
)
def test_int32_in_range_is_exact(values: list[list[int]], dtype: pixels.FieldDtype) -> None:
    out = field(tiff(np.array(values, np.int32)), dtype)
    assert (out.conversion, out.array.dtype) == ("", np.dtype(dtype))
    np.testing.assert_array_equal(out.array, values)


@pytest.mark.parametrize(
    ("values", "dtype", "fix"),
    [
        pytest.param([[0, 256]], "uint8", "use a uint16 field", id="uint8"),
        pytest.param([[-5, 3]], "uint16", "use an int16 field", id="uint16-negative"),
        pytest.param([[0, 40000]], "int16", "use a uint16 field", id="int16"),
        pytest.param([[0, 2**24 + 1]], "float32", "no field dtype", id="float32"),
    ],
)
def test_lossy_int32_is_rejected(
    values: list[list[int]], dtype: pixels.FieldDtype, fix: str
) -> None:
    error = lossy(tiff(np.array(values, np.int32)), dtype)
    assert "mode I" in error.message
    assert f"{values[0][0]}..{values[0][1]}" in error.message
    assert fix in error.message


# --- rejects: the same as decode's ---------------------------------------------------------


def rejected(data: bytes, dtype: pixels.FieldDtype = "uint16") -> tuple[str, str]:
    with pytest.raises(RejectError) as caught:
        field(data, dtype, "RGB", path="b.png")
    assert caught.value.path == "b.png"
    return caught.value.reason, caught.value.message


def decode_rejected(data: bytes) -> tuple[str, str]:
    with pytest.raises(RejectError) as caught:
        images.decode(data, "RGB", path="b.png")
    return caught.value.reason, caught.value.message


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not an image", id="text"),
        pytest.param(encode(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8))[:300], id="cut"),
        pytest.param(png16(rng.integers(0, 65536, (30, 30, 3)))[:400], id="cut-16-bit-rgb"),
        pytest.param(
            encode(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8), "BMP")[:99], id="bmp"
        ),
    ],
)
def test_broken_files_are_rejected_as_decode_does(data: bytes) -> None:
    assert rejected(data) == decode_rejected(data)
    assert rejected(data, "uint8") == decode_rejected(data)


def test_decompression_bomb(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [png16(np.zeros((20, 20, 3))), grey16(np.zeros((20, 20)))]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    for data in files:
        assert rejected(data)[0] == "decompression_bomb"


def test_plugin_surprise_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(image: Image.Image, *, in_place: bool = False) -> None:
        raise struct.error("unpack requires a buffer of 4 bytes")

    monkeypatch.setattr(ImageOps, "exif_transpose", broken)
    data = encode(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), "BMP")
    reason, message = rejected(data)
    assert (reason, message) == decode_rejected(data)
    assert message.startswith("cannot decode: struct.error: ")


# --- probe ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "mode", "bits"),
    [
        pytest.param(encode(np.zeros((3, 4, 3), np.uint8)), "RGB", 8, id="plain-png"),
        pytest.param(encode(np.zeros((3, 4), np.uint8), "BMP"), "L", 8, id="bmp"),
        pytest.param(grey16(np.zeros((3, 4))), "I;16", 16, id="grey16"),
        pytest.param(png16(np.zeros((3, 4, 3))), "RGB", 16, id="rgb16"),
        pytest.param(png16(np.zeros((3, 4, 2))), "RGBA", 16, id="grey-alpha16"),
        pytest.param(encode(np.zeros((3, 4), np.uint16), "PPM"), "I", 16, id="pgm16"),
        pytest.param(tiff(np.zeros((3, 4), np.float32)), "F", 32, id="float"),
        pytest.param(tiff(np.zeros((3, 4), np.int32)), "I", 32, id="int32"),
    ],
)
def test_probe_says_the_mode_and_bits(tmp_path: Path, data: bytes, mode: str, bits: int) -> None:
    path = tmp_path / "x"
    path.write_bytes(data)
    header = images.probe(str(path))
    assert (header.height, header.width, header.mode, header.bits) == (3, 4, mode, bits)


# --- resize_to -----------------------------------------------------------------------------

RANGES = {"uint8": (0, 255), "uint16": (0, 65535), "int16": (-32768, 32767)}


def random_array(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "float32":
        return rng.normal(0, 100, shape).astype(np.float32)
    low, high = RANGES[dtype]
    return rng.integers(low, high + 1, shape).astype(dtype)


def block_mean(array: np.ndarray, k: int) -> np.ndarray:
    h, w = array.shape[0] // k, array.shape[1] // k
    blocks = array.astype(np.float64).reshape(h, k, w, k, *array.shape[2:])
    mean: np.ndarray = blocks.mean(axis=(1, 3))
    return mean


def two_pass_8_bit_mean(array: np.ndarray, k: int) -> np.ndarray:
    """Pillow's 8-bit resample: columns first, rounded half up to 8 bits, then rows."""
    h, w = array.shape[0] // k, array.shape[1] // k
    wide = array.astype(np.float64)
    across = np.floor(wide.reshape(array.shape[0], w, k, *array.shape[2:]).mean(axis=2) + 0.5)
    down: np.ndarray = np.floor(across.reshape(h, k, w, *array.shape[2:]).mean(axis=1) + 0.5)
    return down


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [(), (3,)], ids=["L", "RGB"])
@pytest.mark.parametrize("k", [2, 3])
def test_nearest_integer_factor_takes_the_centre_pixel(
    dtype: str, channels: tuple[int, ...], k: int
) -> None:
    array = random_array(dtype, (4 * k, 5 * k, *channels))
    out = pixels.resize_to(array, (4, 5), "nearest")
    assert out.dtype == array.dtype
    np.testing.assert_array_equal(out, array[k // 2 :: k, k // 2 :: k])
    up = pixels.resize_to(out, (8, 10), "nearest")
    np.testing.assert_array_equal(up, np.repeat(np.repeat(out, 2, 0), 2, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [(), (3,)], ids=["L", "RGB"])
@pytest.mark.parametrize("k", [2, 4])
def test_area_integer_factor_is_the_block_mean(
    dtype: str, channels: tuple[int, ...], k: int
) -> None:
    array = random_array(dtype, (3 * k, 5 * k, *channels))
    out = pixels.resize_to(array, (3, 5), "area")
    assert (out.dtype, out.shape) == (array.dtype, (3, 5, *channels))
    mean = block_mean(array, k)
    if dtype == "float32":
        np.testing.assert_allclose(out, mean, rtol=1e-6, atol=1e-4)
    elif dtype == "uint8":  # Pillow's own 8-bit path rounds halves up, after each pass
        np.testing.assert_array_equal(out, two_pass_8_bit_mean(array, k))
    else:  # through mode F, then np.rint: halves to even
        np.testing.assert_array_equal(out, np.rint(mean))


def test_area_rounds_half_to_even() -> None:
    array = np.array([[1, 2, 2, 3]], np.uint16)  # pair means 1.5 and 2.5
    np.testing.assert_array_equal(pixels.resize_to(array, (1, 2), "area"), [[2, 2]])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16"])
@pytest.mark.parametrize("resize_filter", ["bicubic", "lanczos"])
def test_ringing_is_clipped_to_the_dtype(dtype: str, resize_filter: pixels.ResizeFilter) -> None:
    low, high = RANGES[dtype]
    array = np.repeat(np.array([[low, low, high, high]], dtype), 3, 0)
    floats = Image.fromarray(array.astype(np.float32)).resize((16, 3), Image.Resampling.LANCZOS)
    assert np.asarray(floats).max() > high  # upsampling a step overshoots
    out = pixels.resize_to(array, (3, 16), resize_filter)
    assert out.dtype == array.dtype
    assert (out.min(), out.max()) == (low, high)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.sampled_from([(), (3,)]),
    st.tuples(st.integers(1, 20), st.integers(1, 20)),
    st.tuples(st.integers(1, 20), st.integers(1, 20)),
    st.sampled_from(FILTERS),
)
def test_resize_to_keeps_dtype_and_layout(
    dtype: str,
    channels: tuple[int, ...],
    source: tuple[int, int],
    size: tuple[int, int],
    resize_filter: pixels.ResizeFilter,
) -> None:
    array = random_array(dtype, (*source, *channels))
    out = pixels.resize_to(array, size, resize_filter)
    assert (out.dtype, out.shape) == (array.dtype, (*size, *channels))
    if resize_filter not in {"bicubic", "lanczos"}:  # no negative weights: no overshoot
        assert array.min() <= out.min() <= out.max() <= array.max()


def test_resize_to_refuses_other_dtypes() -> None:
    with pytest.raises(ValueError, match="int32"):
        pixels.resize_to(np.zeros((4, 4), np.int32), (2, 2), "area")
