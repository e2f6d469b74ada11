"""images: the libpng path for plain PNGs returns exactly what Pillow's path returns.

Every case decodes the same bytes twice, once as the build does and once with the libpng path
switched off, and compares the arrays (or the reject reasons).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from h5etl.errors import RejectError
from h5etl.inputs import plainpng
from h5etl.inputs import raster as images
from h5etl.inputs.pixels import Mode

MASK = frozenset({0, 1})


def png(array: np.ndarray, mode: str | None = None, **params: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format="PNG", **params)
    return buffer.getvalue()


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def with_chunk(data: bytes, extra: bytes) -> bytes:
    """``data`` with ``extra`` inserted right after IHDR (signature 8 + IHDR 25 bytes)."""
    return data[:33] + extra + data[33:]


def outcome(
    data: bytes, mode: Mode, labels: frozenset[int] | None, *, fast: bool
) -> np.ndarray | str:
    """``images.decode``'s pixels or reject, with (``fast``) or without the libpng path."""
    saved = plainpng.decode
    if not fast:
        plainpng.decode = lambda *args, **kwargs: None
    try:
        return images.decode(data, mode, path="x.png", mask_labels=labels)
    except RejectError as exc:
        return f"{exc.reason}: {exc.message}"
    finally:
        plainpng.decode = saved


def assert_same(data: bytes, mode: Mode, labels: frozenset[int] | None = None) -> None:
    fast = outcome(data, mode, labels, fast=True)
    slow = outcome(data, mode, labels, fast=False)
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
        return
    assert fast.dtype == slow.dtype == np.uint8
    assert fast.shape == slow.shape
    np.testing.assert_array_equal(fast, slow)


source_modes = st.sampled_from(["L", "RGB", "RGBA"])
targets = st.sampled_from([("RGB", None), ("L", None), ("L", MASK), ("RGB", MASK)])


@settings(max_examples=60, deadline=None)
@given(
    mode=source_modes,
    target=targets,
    height=st.integers(1, 40),
    width=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    grey_channels=st.booleans(),
)
def test_plain_pngs_match_pillow(
    mode: str,
    target: tuple[Mode, frozenset[int] | None],
    height: int,
    width: int,
    seed: int,
    grey_channels: bool,
) -> None:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    if grey_channels and channels > 1:  # a colour file holding a grey mask
        pixels[..., 1] = pixels[..., 0]
        pixels[..., 2] = pixels[..., 0]
    data = png(pixels[..., 0] if channels == 1 else pixels, mode)
    assert plainpng.shape_of(data) == (height, width, channels)
    assert_same(data, *target)


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("gamma", chunk(b"gAMA", struct.pack(">I", 45455))),
        ("srgb", chunk(b"sRGB", b"\x00")),
        ("physical size", chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1))),
        ("significant bits", chunk(b"sBIT", b"\x05\x06\x05")),
    ],
)
def test_inert_chunks_keep_the_fast_path(name: str, extra: bytes) -> None:
    pixels = np.random.default_rng(3).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    data = with_chunk(png(pixels), extra)
    assert plainpng.shape_of(data) is not None, name
    np.testing.assert_array_equal(images.decode(data, "RGB", path="x.png"), pixels)
    assert_same(data, "RGB")


def exif_orientation(value: int) -> bytes:
    """A little-endian TIFF header with one IFD entry: Orientation = ``value``."""
    return (
        b"II*\x00\x08\x00\x00\x00\x01\x00"
        + struct.pack("<HHIHH", 0x0112, 3, 1, value, 0)
        + (b"\x00\x00\x00\x00")
    )


def test_files_pillow_must_decode_leave_the_fast_path() -> None:
    pixels = np.random.default_rng(4).integers(0, 256, (5, 8, 3), dtype=np.uint8)
    plain = png(pixels)
    grey = png(pixels[..., 0])
    palette = Image.fromarray(pixels).convert("P")
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG")
    sixteen = png(pixels[..., 0].astype(np.uint16) * 257)
    cases = {
        "exif before the pixels": with_chunk(plain, chunk(b"eXIf", exif_orientation(6))),
        "exif after the pixels": plain[:-12] + chunk(b"eXIf", exif_orientation(6)) + plain[-12:],
        "transparency": with_chunk(grey, chunk(b"tRNS", b"\x00\x07")),
        "text": with_chunk(plain, chunk(b"tEXt", b"Comment\x00hello")),
        "palette": buffer.getvalue(),
        "16-bit": sixteen,
        "bytes after IEND": plain + b"junk",
        "bad CRC in an ancillary chunk": with_chunk(
            plain, chunk(b"gAMA", struct.pack(">I", 45455))[:-1] + b"\x00"
        ),
        "truncated": plain[: len(plain) // 2],
        "not a PNG": b"GIF89a" + plain[6:],
    }
    for name, data in cases.items():
        assert plainpng.shape_of(data) is None, name
        for mode, labels in [("RGB", None), ("L", MASK)]:
            assert_same(data, mode, labels)  # type: ignore[arg-type]


def test_exif_orientation_after_the_pixels_still_rotates() -> None:
    pixels = np.random.default_rng(5).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    plain = png(pixels)
    rotated = plain[:-12] + chunk(b"eXIf", exif_orientation(6)) + plain[-12:]
    assert images.decode(rotated, "RGB", path="x.png").shape == (6, 4, 3)


def test_corrupt_pixel_data_is_rejected_like_pillow_does() -> None:
    pixels = np.random.default_rng(6).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    data = bytearray(png(pixels))
    idat = data.index(b"IDAT")
    for offset in range(idat + 10, idat + 40):
        data[offset] ^= 0xFF
    assert plainpng.shape_of(bytes(data)) is not None  # IDAT CRCs are libpng's to check
    assert_same(bytes(data), "RGB")
    with pytest.raises(RejectError):
        images.decode(bytes(data), "RGB", path="x.png")


def test_colour_mask_is_rejected_on_both_paths() -> None:
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    pixels[1, 1] = (255, 0, 0)
    data = png(pixels)
    assert plainpng.shape_of(data) is not None
    with pytest.raises(RejectError) as caught:
        images.decode(data, "L", path="m.png", mask_labels=MASK)
    assert caught.value.reason == "mask_not_single_channel"
    assert caught.value.path == "m.png"
    assert_same(data, "L", MASK)


def test_pixel_limit_is_left_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = png(np.zeros((10, 10, 3), dtype=np.uint8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 99)
    assert plainpng.shape_of(data) is None
    with pytest.raises(RejectError) as caught:
        images.decode(data, "RGB", path="x.png")
    assert caught.value.reason == "decompression_bomb"


def probe_outcome(path: Path, *, fast: bool) -> images.ImageHeader | str:
    saved = images._probe_plain_png
    if not fast:
        images._probe_plain_png = lambda head: None
    try:
        return images.probe(str(path))
    except RejectError as exc:
        return f"{exc.reason}: {exc.message}"
    finally:
        images._probe_plain_png = saved


def test_header_probe_matches_pillow(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (9, 13, 4), dtype=np.uint8)
    plain = png(pixels[..., :3])
    cases = {
        "rgb": plain,
        "grey": png(pixels[..., 0]),
        "rgba": png(pixels, "RGBA"),
        "gamma": with_chunk(plain, chunk(b"gAMA", struct.pack(">I", 45455))),
        "exif rotated": with_chunk(plain, chunk(b"eXIf", exif_orientation(6))),
        "exif after the pixels": plain[:-12] + chunk(b"eXIf", exif_orientation(6)) + plain[-12:],
        "16-bit": png(pixels[..., 0].astype(np.uint16) * 257),
        "bad CRC": with_chunk(plain, chunk(b"gAMA", struct.pack(">I", 45455))[:-1] + b"\x00"),
        "header only": plain[:40],
        "signature only": plain[:8],
        "empty": b"",
        "text": b"not an image",
    }
    fast_path_taken = set()
    for name, data in cases.items():
        path = tmp_path / f"{name}.png"
        path.write_bytes(data)
        if images._probe_plain_png(data) is not None:
            fast_path_taken.add(name)
        assert probe_outcome(path, fast=True) == probe_outcome(path, fast=False), name
    assert fast_path_taken == {"rgb", "grey", "rgba", "gamma", "exif after the pixels"}
    missing = tmp_path / "missing.png"
    assert probe_outcome(missing, fast=True) == probe_outcome(missing, fast=False)
