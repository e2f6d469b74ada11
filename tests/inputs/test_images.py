"""images: every pixel mode the design names, EXIF orientation, symlinks, broken files."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import save
from PIL import Image, ImageOps

from h5etl.errors import RejectError
from h5etl.inputs import pixels
from h5etl.inputs import raster as images
from h5etl.kinds import mask_values

MASK = frozenset({0, 1})
rng = np.random.default_rng(11)


def encode(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def rgb_array(height: int = 6, width: int = 5) -> np.ndarray:
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_rgb_round_trip() -> None:
    array = rgb_array()
    out = images.decode(encode(Image.fromarray(array)), "RGB", path="x.png")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, array)


def test_palette_goes_through_its_palette() -> None:
    palette = Image.new("P", (4, 3))
    palette.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    palette.putdata([0, 1, 1, 0] * 3)
    out = images.decode(encode(palette), "RGB", path="p.png")
    expected = np.array([[10, 20, 30], [200, 100, 50], [200, 100, 50], [10, 20, 30]])
    np.testing.assert_array_equal(out, np.broadcast_to(expected, (3, 4, 3)))


def test_palette_with_transparency_drops_alpha() -> None:
    palette = Image.new("P", (2, 2))
    palette.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    palette.putdata([0, 1, 1, 0])
    data = encode(palette, transparency=0)
    with Image.open(io.BytesIO(data)) as reopened:
        assert "transparency" in reopened.info
    out = images.decode(data, "RGB", path="p.png")
    # the transparent entry keeps its colour: alpha is dropped, not composited onto black
    np.testing.assert_array_equal(out[0, 0], [10, 20, 30])
    np.testing.assert_array_equal(out[0, 1], [200, 100, 50])


def test_rgba_drops_alpha() -> None:
    rgba = np.concatenate([rgb_array(), np.zeros((6, 5, 1), np.uint8)], axis=2)
    rgba[0, 0, 3] = 255
    out = images.decode(encode(Image.fromarray(rgba, mode="RGBA")), "RGB", path="a.png")
    np.testing.assert_array_equal(out, rgba[..., :3])


def test_la_to_rgb_and_l() -> None:
    la = np.stack([np.arange(12, dtype=np.uint8).reshape(3, 4) * 20, np.zeros((3, 4), np.uint8)], 2)
    data = encode(Image.fromarray(la, mode="LA"))
    np.testing.assert_array_equal(images.decode(data, "L", path="la.png"), la[..., 0])
    rgb = images.decode(data, "RGB", path="la.png")
    np.testing.assert_array_equal(rgb, np.repeat(la[..., :1], 3, axis=2))


def test_grayscale_to_rgb_repeats_the_channel() -> None:
    grey = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    out = images.decode(encode(Image.fromarray(grey)), "RGB", path="l.png")
    assert out.shape == (5, 7, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], grey)


def test_cmyk_converts_to_rgb() -> None:
    cmyk = Image.new("CMYK", (3, 1))
    cmyk.putdata([(255, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 255)])  # cyan, white, black
    out = images.decode(encode(cmyk, "TIFF"), "RGB", path="c.tif")
    np.testing.assert_array_equal(out[0], [[0, 255, 255], [255, 255, 255], [0, 0, 0]])


def test_one_bit_mask() -> None:
    bits = Image.fromarray(np.array([[0, 255, 0], [255, 255, 0]], np.uint8)).convert("1")
    assert bits.mode == "1"
    out = images.decode(encode(bits), "L", path="m.png", mask_labels=MASK)
    np.testing.assert_array_equal(
        mask_values.check_mask(out, (0, 1), path="m.png"), [[0, 1, 0], [1, 1, 0]]
    )


def sixteen_bit(values: np.ndarray) -> bytes:
    image = Image.fromarray(values.astype(np.uint16))
    data = encode(image)
    with Image.open(io.BytesIO(data)) as reopened:
        assert reopened.mode in pixels.SIXTEEN_BIT_MODES
    return data


def test_sixteen_bit_image_is_shifted_never_clipped() -> None:
    values = np.array([[0, 255, 256, 40000], [65535, 1000, 32768, 65280]])
    data = sixteen_bit(values)
    out = images.decode(data, "L", path="g16.png")
    np.testing.assert_array_equal(out, values >> 8)
    rgb = images.decode(data, "RGB", path="g16.png")
    np.testing.assert_array_equal(rgb, np.repeat((values >> 8)[..., None], 3, axis=2))


def test_sixteen_bit_full_range() -> None:
    values = rng.integers(0, 65536, (16, 16))
    out = images.decode(sixteen_bit(values), "L", path="g16.png")
    # clipping would pile values at 255; a shift spreads them
    np.testing.assert_array_equal(out, values >> 8)


def test_sixteen_bit_mask_0_65535() -> None:
    values = np.array([[0, 65535], [65535, 0]])
    out = images.decode(sixteen_bit(values), "L", path="m16.png", mask_labels=MASK)
    np.testing.assert_array_equal(mask_values.check_mask(out, (0, 1), path="m"), [[0, 1], [1, 0]])


def test_sixteen_bit_mask_already_labels() -> None:
    # a 16-bit mask holding 0/1 would become all zeros under v >> 8
    values = np.array([[0, 1], [1, 1]])
    out = images.decode(sixteen_bit(values), "L", path="m16.png", mask_labels=MASK)
    np.testing.assert_array_equal(mask_values.check_mask(out, (0, 1), path="m"), values)


def decode_mask(data: bytes, *, path: str) -> np.ndarray:
    """What the decode stage does with a mask file: decode, then validate."""
    out = images.decode(data, "L", path=path, mask_labels=MASK)
    return mask_values.check_mask(out, (0, 1), path=path)


@pytest.mark.parametrize(
    ("values", "stored"),
    [
        pytest.param([[0, 1], [1, 0]], [[0, 1], [1, 0]], id="0-1"),
        pytest.param([[0, 255], [255, 0]], [[0, 1], [1, 0]], id="0-255"),
        pytest.param([[0, 65535], [65535, 0]], [[0, 1], [1, 0]], id="0-65535"),
        pytest.param([[0, 256], [256, 0]], [[0, 1], [1, 0]], id="labels-shifted-by-8"),
    ],
)
def test_sixteen_bit_mask_keeps_its_labels(
    values: list[list[int]], stored: list[list[int]]
) -> None:
    # a 16-bit 0/255 mask went through v >> 8 and was stored as all zeros
    np.testing.assert_array_equal(decode_mask(sixteen_bit(np.array(values)), path="m"), stored)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        pytest.param([[0, 1], [2, 1]], "got 2", id="label-out-of-set"),
        pytest.param([[0, 1], [65535, 1]], "got 1", id="labels-and-65535"),
        pytest.param([[0, 300], [300, 0]], "got 300", id="not-a-widened-label"),
    ],
)
def test_sixteen_bit_mask_with_wrong_labels_is_rejected(
    values: list[list[int]], named: str
) -> None:
    # a 16-bit {0, 1, 2} mask became all zeros under v >> 8 and passed as an empty mask
    with pytest.raises(RejectError) as caught:
        decode_mask(sixteen_bit(np.array(values)), path="m16.png")
    assert caught.value.reason == "mask_values"
    assert named in caught.value.message
    assert caught.value.path == "m16.png"


def test_rgb_mask_with_equal_channels_is_accepted() -> None:
    grey = np.array([[0, 255], [255, 0]], np.uint8)
    data = encode(Image.fromarray(np.repeat(grey[..., None], 3, axis=2)))
    out = images.decode(data, "L", path="m.png", mask_labels=MASK)
    np.testing.assert_array_equal(out, grey)


def test_rgb_mask_with_colour_is_rejected() -> None:
    colour = np.zeros((2, 2, 3), np.uint8)
    colour[0, 0] = [255, 0, 0]
    with pytest.raises(RejectError) as caught:
        images.decode(encode(Image.fromarray(colour)), "L", path="m.png", mask_labels=MASK)
    assert caught.value.reason == "mask_not_single_channel"
    assert caught.value.path == "m.png"


def test_palette_mask() -> None:
    palette = Image.new("P", (2, 2))
    palette.putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    palette.putdata([0, 1, 1, 1])
    out = images.decode(encode(palette), "L", path="m.png", mask_labels=MASK)
    np.testing.assert_array_equal(out, [[0, 255], [255, 255]])


def test_colour_image_to_l_is_blended() -> None:
    out = images.decode(encode(Image.new("RGB", (2, 2), (255, 0, 0))), "L", path="x.png")
    assert out.shape == (2, 2)
    assert 0 < int(out[0, 0]) < 255


def with_orientation(array: np.ndarray, orientation: int, fmt: str) -> bytes:
    image = Image.fromarray(array)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, fmt, exif=exif.tobytes())


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_exif_orientation_is_honoured(tmp_path: Path, fmt: str) -> None:
    # a gradient survives JPEG well enough to tell the rotation apart
    rows = np.linspace(0, 250, 16, dtype=np.uint8)[:, None]
    grey = np.repeat(rows, 24, axis=1)  # 16 high, 24 wide; bright at the bottom
    data = with_orientation(grey, 6, fmt)
    out = images.decode(data, "L", path="o")
    # orientation 6: the stored image is shown rotated 90 degrees clockwise
    expected = np.rot90(grey, k=-1)
    assert out.shape == (24, 16)
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= (0 if fmt == "PNG" else 12)
    path = tmp_path / f"o.{fmt.lower()}"
    path.write_bytes(data)
    header = images.probe(str(path))
    assert (header.height, header.width) == (24, 16)


def test_probe_reads_the_header(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    save(path, rgb_array(7, 9))
    header = images.probe(str(path))
    assert (header.height, header.width, header.mode, header.format) == (7, 9, "RGB", "PNG")


def test_symlink_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.png"
    save(target, rgb_array(3, 4))
    link = tmp_path / "link.png"
    os.symlink(target, link)
    assert images.probe(str(link)).width == 4


def test_dangling_symlink_is_rejected(tmp_path: Path) -> None:
    link = tmp_path / "link.png"
    os.symlink(tmp_path / "gone.png", link)
    with pytest.raises(RejectError) as caught:
        images.probe(str(link))
    assert caught.value.reason == "dangling_symlink"


def test_symlink_loop_is_rejected(tmp_path: Path) -> None:
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    os.symlink(two, one)
    os.symlink(one, two)
    with pytest.raises(RejectError) as caught:
        images.probe(str(one))
    assert caught.value.reason == "symlink_loop"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"", "unreadable", id="empty"),
        pytest.param(b"not an image", "unreadable", id="text"),
        pytest.param("half", "truncated", id="truncated"),
    ],
)
def test_broken_files(tmp_path: Path, content: bytes | str, reason: str) -> None:
    if content == "half":
        data = encode(Image.fromarray(rgb_array(20, 20)))
        content = data[: len(data) // 2]
    assert isinstance(content, bytes)
    path = tmp_path / "bad.png"
    path.write_bytes(content)
    # the probe reads headers and the file's last bytes: a file cut short is decoded there
    # too (and only such a file), so a dry run names it as a build does
    with pytest.raises(RejectError) as probed:
        images.probe(str(path))
    assert probed.value.reason == reason
    with pytest.raises(RejectError) as decoded:
        images.decode(content, "RGB", path=str(path))
    assert decoded.value.reason == reason
    assert decoded.value.path == str(path)


@pytest.mark.parametrize(
    "limit",
    [
        pytest.param(300, id="warning"),  # over the limit: Pillow warns
        pytest.param(100, id="error"),  # over twice the limit: Pillow raises
    ],
)
def test_decompression_bomb_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    # probe let Pillow's DecompressionBombError (not an OSError) escape and crash the build
    path = tmp_path / "big.png"
    save(path, rgb_array(20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)
    with pytest.raises(RejectError) as caught:
        images.probe(str(path))
    assert caught.value.reason == "decompression_bomb"
    with pytest.raises(RejectError) as decoded:
        images.decode(path.read_bytes(), "RGB", path=str(path))
    assert decoded.value.reason == "decompression_bomb"


def test_resize_mask_keeps_labels() -> None:
    mask = (rng.random((30, 50)) < 0.5).astype(np.uint8)
    out = pixels.resize(mask, (14, 24), is_mask=True)
    assert out.shape == (14, 24)
    assert set(np.unique(out).tolist()) <= {0, 1}
    image = pixels.resize(rgb_array(30, 50), (14, 24), is_mask=False)
    assert image.shape == (14, 24, 3)


def test_save_png_round_trip(tmp_path: Path) -> None:
    array = rgb_array()
    images.save_png(tmp_path / "sub" / "x.png", array)
    with Image.open(tmp_path / "sub" / "x.png") as image:
        np.testing.assert_array_equal(np.asarray(image), array)


def _raise_for(size: tuple[int, int], exc: BaseException) -> object:
    """A stand-in for a Pillow call that fails, as a plugin might, on images of ``size``."""

    def fail(image: Image.Image, *, in_place: bool = False) -> Image.Image | None:
        if image.size == size:
            raise exc
        return original(image, in_place=True) if in_place else original(image)

    original = ImageOps.exif_transpose
    return fail


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        pytest.param(
            struct.error("unpack requires a buffer of 4 bytes"), "struct.error", id="struct"
        ),
        pytest.param(KeyError(274), "KeyError", id="key"),
        pytest.param(ZeroDivisionError("division by zero"), "ZeroDivisionError", id="zero-div"),
        pytest.param(NotImplementedError("plugin"), "NotImplementedError", id="not-implemented"),
    ],
)
def test_any_decoder_error_is_a_reject(
    monkeypatch: pytest.MonkeyPatch, exc: Exception, name: str
) -> None:
    # struct.error from a plugin escaped images.decode and ended the whole build
    monkeypatch.setattr(ImageOps, "exif_transpose", _raise_for((5, 6), exc))
    data = encode(Image.fromarray(rgb_array(6, 5)), "BMP")  # not a PNG: Pillow decodes it
    with pytest.raises(RejectError) as caught:
        images.decode(data, "RGB", path="bad.bmp")
    assert caught.value.reason == "decode_error"
    assert caught.value.path == "bad.bmp"
    assert caught.value.message.startswith(f"cannot decode: {name}: ")
    assert images.decode(encode(Image.fromarray(rgb_array(4, 4)), "BMP"), "RGB", path="ok").shape


def test_a_bug_in_our_own_conversion_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # only Pillow's open, load and EXIF steps are guarded: h5etl's own errors are not rejects
    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("a bug in to_array")

    monkeypatch.setattr(images, "to_array", broken)
    with pytest.raises(TypeError, match="a bug in to_array"):
        images.decode(encode(Image.fromarray(rgb_array(6, 5)), "BMP"), "RGB", path="b.bmp")


def test_memory_error_is_not_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # the decode stage rejects it as memory_error itself
    monkeypatch.setattr(ImageOps, "exif_transpose", _raise_for((5, 6), MemoryError()))
    with pytest.raises(MemoryError):
        images.decode(encode(Image.fromarray(rgb_array(6, 5)), "BMP"), "RGB", path="m.bmp")


def test_any_header_error_is_a_reject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bad.bmp"
    path.write_bytes(encode(Image.fromarray(rgb_array(6, 5)), "BMP"))

    def broken_exif(image: Image.Image) -> Image.Exif:
        raise struct.error("bad EXIF")

    monkeypatch.setattr(Image.Image, "getexif", broken_exif)
    with pytest.raises(RejectError) as caught:
        images.probe(str(path))
    assert caught.value.reason == "decode_error"
    assert caught.value.message == "cannot decode: struct.error: bad EXIF"
    assert caught.value.path == str(path)
