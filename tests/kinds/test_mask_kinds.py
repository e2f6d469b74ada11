"""Masks beyond 0/1: multi-class and uint16 labels, palette indices, colour-coded RGB masks.

Inputs are built here with numpy and Pillow (imagecodecs for 16-bit colour); expected labels
are written out by hand.
"""

from __future__ import annotations

import io

import imagecodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from h5etl.errors import RejectError
from h5etl.inputs import pixels
from h5etl.inputs import raster as images
from h5etl.kinds.mask_values import check_mask, map_colors

rng = np.random.default_rng(4)


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def palette_png(indices: np.ndarray, colours: list[tuple[int, int, int]]) -> bytes:
    image = Image.fromarray(indices.astype(np.uint8), mode="L").convert("P")
    image.putpalette([c for colour in colours for c in colour] + [0] * (768 - 3 * len(colours)))
    image.putdata(indices.astype(np.uint8).ravel().tolist())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = buffer.getvalue()
    with Image.open(io.BytesIO(data)) as reopened:
        assert reopened.mode == "P"
    return data


def mask(
    data: bytes,
    dtype: pixels.FieldDtype = "uint8",
    palette: pixels.Palette = "index",
) -> pixels.Decoded:
    return images.decode_field(
        data, path="m.png", mode="L", dtype=dtype, role="mask", palette=palette
    )


# --- palette masks -------------------------------------------------------------------------

INDICES = np.array([[0, 1, 2], [3, 2, 1]])
PALETTE = [(0, 0, 0), (128, 64, 128), (255, 0, 0), (7, 7, 7)]


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_palette_mask_gives_its_indices(dtype: pixels.FieldDtype) -> None:
    # decode blends the palette colours into grey: 128,64,128 and 255,0,0 became labels 90, 76
    out = mask(palette_png(INDICES, PALETTE), dtype)
    assert (out.conversion, out.array.dtype) == ("", np.dtype(dtype))
    np.testing.assert_array_equal(out.array, INDICES)
    np.testing.assert_array_equal(check_mask(out.array, (0, 1, 2, 3), path="m.png"), INDICES)


def test_palette_mask_gives_its_colours_for_a_colour_table() -> None:
    out = mask(palette_png(INDICES, PALETTE), palette="color")
    assert (out.array.shape, out.array.dtype, out.conversion) == ((2, 3, 3), np.dtype(np.uint8), "")
    np.testing.assert_array_equal(out.array, np.array(PALETTE)[INDICES])


# --- colour-coded RGB masks ----------------------------------------------------------------

COLOURS = {(0, 0, 0): 0, (128, 64, 128): 7, (244, 35, 232): 3}


def colour_mask(labels: np.ndarray) -> np.ndarray:
    by_label = {label: colour for colour, label in COLOURS.items()}
    return np.array([[by_label[int(v)] for v in row] for row in labels], np.uint8)


def test_colour_mask_maps_through_the_table() -> None:
    labels = np.array([[0, 7, 3], [3, 3, 0]])
    out = mask(png(colour_mask(labels)), palette="color")
    np.testing.assert_array_equal(out.array, colour_mask(labels))
    np.testing.assert_array_equal(map_colors(out.array, COLOURS, path="m.png"), labels)


def test_colour_mask_without_a_table_is_rejected_as_today() -> None:
    with pytest.raises(RejectError) as caught:
        mask(png(colour_mask(np.array([[0, 7]]))))
    assert caught.value.reason == "mask_not_single_channel"
    assert caught.value.path == "m.png"


def test_grey_rgb_mask_gives_one_channel() -> None:
    grey = np.array([[0, 1], [2, 3]], np.uint8)
    out = mask(png(np.repeat(grey[..., None], 3, 2)))
    np.testing.assert_array_equal(out.array, grey)


@pytest.mark.parametrize(
    "array",
    [
        pytest.param(np.array([[0, 255], [255, 0]], np.uint8), id="grey"),
        pytest.param(np.repeat(np.array([[0, 255]], np.uint8)[..., None], 3, 2), id="grey-rgb"),
    ],
)
def test_a_colour_table_always_gets_rgb(array: np.ndarray) -> None:
    # the caller maps every pixel through its table: black/white files are colours too
    out = mask(png(array), palette="color")
    expected = array if array.ndim == 3 else np.repeat(array[..., None], 3, 2)
    np.testing.assert_array_equal(out.array, expected)
    table = {(0, 0, 0): 0, (255, 255, 255): 1}
    np.testing.assert_array_equal(
        map_colors(out.array, table, path="m.png"), expected[..., 0] // 255
    )


def test_mask_role_is_grey_only() -> None:
    with pytest.raises(ValueError, match="mode L"):
        images.decode_field(
            png(np.zeros((2, 2), np.uint8)), path="m", mode="RGB", dtype="uint8", role="mask"
        )


# --- 16-bit masks --------------------------------------------------------------------------


def grey16(values: np.ndarray) -> bytes:
    return png(values.astype(np.uint16))


@pytest.mark.parametrize(
    ("values", "stored", "conversion"),
    [
        pytest.param([[0, 1], [2, 3]], [[0, 1], [2, 3]], "", id="labels-kept"),
        pytest.param([[0, 65535]], [[0, 255]], "16_to_8_bits", id="0-65535"),
        pytest.param([[0, 7 * 257]], [[0, 7]], "16_to_8_bits", id="widened-label"),
    ],
)
def test_sixteen_bit_mask_into_uint8_keeps_the_mask_rules(
    values: list[list[int]], stored: list[list[int]], conversion: str
) -> None:
    out = mask(grey16(np.array(values)))
    assert (out.conversion, out.array.dtype) == (conversion, np.dtype(np.uint8))
    np.testing.assert_array_equal(out.array, stored)


def test_sixteen_bit_mask_with_a_stray_value_is_rejected() -> None:
    with pytest.raises(RejectError) as caught:
        mask(grey16(np.array([[0, 300]])))
    assert caught.value.reason == "mask_values"
    assert "300" in caught.value.message
    assert caught.value.path == "m.png"


def test_uint16_mask_field_keeps_sixteen_bit_labels() -> None:
    labels = np.array([[0, 300], [1000, 65535]])
    out = mask(grey16(labels), "uint16")
    assert (out.conversion, out.array.dtype) == ("", np.dtype(np.uint16))
    np.testing.assert_array_equal(out.array, labels)
    checked = check_mask(out.array, (0, 300, 1000, 65535), path="m.png")
    assert checked.dtype == np.uint16
    np.testing.assert_array_equal(checked, labels)


def test_sixteen_bit_rgb_mask_with_equal_channels_keeps_its_labels() -> None:
    # Pillow reads 16-bit RGB as its high bytes: labels 0..3 would all become 0
    labels = np.array([[0, 1], [2, 3]])
    data = bytes(imagecodecs.png_encode(np.repeat(labels[..., None], 3, 2).astype(np.uint16)))
    out = mask(data)
    assert (out.conversion, out.array.dtype) == ("", np.dtype(np.uint8))
    np.testing.assert_array_equal(out.array, labels)


# --- check_mask beyond 0/1 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "allowed"),
    [
        pytest.param([[0, 1], [2, 3]], (0, 1, 2, 3), id="0-3"),
        pytest.param([[0, 7], [255, 7]], (0, 7, 255), id="0-7-255"),
        pytest.param([[3, 3], [2, 2]], (0, 1, 2, 3), id="labels-missing"),
        pytest.param([[9, 0]], (9, 0), id="unordered-values"),
    ],
)
def test_multi_class_uint8_masks(values: list[list[int]], allowed: tuple[int, ...]) -> None:
    array = np.array(values, np.uint8)
    out = check_mask(array, allowed, path="m.png")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize(
    ("values", "allowed", "named"),
    [
        pytest.param([[0, 4]], (0, 1, 2, 3), "got 4", id="uint8-above"),
        pytest.param([[0, 1, 255]], (0, 1, 2), "got 255", id="255-not-binary"),
        pytest.param([[0, 300]], (0, 1), "got 300", id="uint16-300-in-binary"),
        pytest.param([[0, 400, 300]], (0, 300, 65535), "got 400", id="uint16-stray"),
        pytest.param([[0, 65535]], (0, 1), "got 65535", id="uint16-65535-is-not-255"),
    ],
)
def test_masks_with_values_outside_the_set_are_rejected(
    values: list[list[int]], allowed: tuple[int, ...], named: str
) -> None:
    # a uint16 mask with labels above 255 raised IndexError out of check_mask
    dtype = np.uint16 if max(max(row) for row in values) > 255 else np.uint8
    with pytest.raises(RejectError) as caught:
        check_mask(np.array(values, dtype), allowed, path="m.png")
    assert caught.value.reason == "mask_values"
    assert caught.value.message.endswith(named)


def test_values_above_255_in_a_uint8_mask_field_do_not_crash() -> None:
    # values (0, 300) with an 8-bit mask indexed a 256-entry table out of range
    np.testing.assert_array_equal(check_mask(np.array([[0, 0]], np.uint8), (0, 300), path="m"), 0)


def test_uint16_binary_0_255_mask_becomes_0_1_and_stays_uint16() -> None:
    out = check_mask(np.array([[0, 255]], np.uint16), (0, 1), path="m")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, [[0, 1]])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 2, 255, 256, 1000, 65535]), min_size=1, max_size=30),
    st.sampled_from([(0, 1), (0, 1, 2), (0, 256, 1000), (0, 255, 65535), (1, 1000)]),
)
def test_uint16_masks_follow_the_set_rule(pixels_: list[int], values: tuple[int, ...]) -> None:
    array = np.array(pixels_, np.uint16).reshape(1, -1)
    present = set(pixels_)
    if present <= set(values):
        expected: np.ndarray | None = array
    elif set(values) == {0, 1} and present <= {0, 255}:
        expected = (array == 255).astype(np.uint16)
    else:
        expected = None
    if expected is None:
        with pytest.raises(RejectError):
            check_mask(array, values, path="m")
        return
    out = check_mask(array, values, path="m")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, expected)


# --- map_colors ----------------------------------------------------------------------------


def test_unknown_colour_names_the_colour_its_count_and_first_pixel() -> None:
    rgb = colour_mask(np.zeros((5, 20), int))
    rgb[3, 17] = rgb[4, 2] = [12, 200, 7]
    rgb[4, 0] = [1, 2, 3]  # a second unknown colour, later in reading order
    with pytest.raises(RejectError) as caught:
        map_colors(rgb, COLOURS, path="m.png", what="fields.seg.colors")
    assert caught.value.reason == "unknown_color"
    assert caught.value.path == "m.png"
    assert caught.value.message == (
        "colour [12, 200, 7] is not in fields.seg.colors (2 pixels, first at row 3, col 17; "
        "1 more unknown colour): add them to the table or fix the mask"
    )


def test_unknown_colour_default_wording() -> None:
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[1, 1] = [9, 9, 9]
    with pytest.raises(RejectError) as caught:
        map_colors(rgb, {(0, 0, 0): 0}, path="m.png")
    assert caught.value.message.startswith(
        "colour [9, 9, 9] is not in the colour table (1 pixel, first at row 1, col 1): add it"
    )


def test_map_colors_label_dtype() -> None:
    rgb = np.array([[[0, 0, 0], [1, 2, 3]]], np.uint8)
    out = map_colors(rgb, {(0, 0, 0): 0, (1, 2, 3): 1000}, path="m", dtype=np.uint16)
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, [[0, 1000]])
    with pytest.raises(ValueError, match="1000"):
        map_colors(rgb, {(0, 0, 0): 0, (1, 2, 3): 1000}, path="m")


def test_map_colors_wants_rgb() -> None:
    with pytest.raises(ValueError, match=r"\(h, w, 3\)"):
        map_colors(np.zeros((2, 2), np.uint8), COLOURS, path="m")


colour_tables = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)),
    min_size=1,
    max_size=12,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(colour_tables, st.data())
def test_map_colors_round_trip(colours: list[tuple[int, int, int]], data: st.DataObject) -> None:
    labels = data.draw(
        st.lists(st.integers(0, 255), min_size=len(colours), max_size=len(colours), unique=True)
    )
    image = data.draw(
        hnp.arrays(
            np.int64,
            hnp.array_shapes(min_dims=2, max_dims=2, max_side=12),
            elements=st.integers(0, len(colours) - 1),
        )
    )
    table = dict(zip(colours, labels, strict=True))
    rgb = np.array(colours, np.uint8)[image]
    expected = np.array(labels)[image]
    out = map_colors(rgb, table, path="m")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)


def test_map_colors_with_a_table_too_large_to_hash() -> None:
    # 3000 colours collide in any 16-bit hash: the lookup falls back to np.searchsorted
    codes = rng.choice(1 << 24, 3000, replace=False)
    colours = np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], axis=1).astype(np.uint8)
    table = {(int(r), int(g), int(b)): i % 60000 for i, (r, g, b) in enumerate(colours)}
    image = rng.integers(0, len(table), (20, 30))
    rgb = colours[image]
    out = map_colors(rgb, table, path="m", dtype=np.uint16)
    np.testing.assert_array_equal(out, image % 60000)
    unknown = next(c for c in range(1 << 24) if c not in set(codes.tolist()))
    rgb[5, 6] = [unknown >> 16, (unknown >> 8) & 255, unknown & 255]
    with pytest.raises(RejectError, match="first at row 5, col 6"):
        map_colors(rgb, table, path="m", dtype=np.uint16)


def test_map_colors_with_an_empty_table() -> None:
    with pytest.raises(RejectError, match=r"colour \[0, 0, 0\] .* \(4 pixels, first at row 0"):
        map_colors(np.zeros((2, 2, 3), np.uint8), {}, path="m")


def test_sixteen_bit_colour_mask_for_a_colour_table() -> None:
    # 8-bit colours widened to 16 bits (v * 257) shift back exactly, and the shift is reported
    colours = np.array([[[0, 0, 0], [128, 64, 128]]], np.uint16)
    data = bytes(imagecodecs.png_encode(colours * 257))
    out = mask(data, palette="color")
    assert out.conversion == "16_to_8_bits"
    np.testing.assert_array_equal(out.array, colours)
    np.testing.assert_array_equal(map_colors(out.array, COLOURS, path="m"), [[0, 7]])


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        pytest.param([[0.0, 3.0]], "", id="integral-labels"),
        pytest.param([[0.0, 0.5]], "lossy_conversion", id="fraction"),
    ],
)
def test_float_mask(values: list[list[float]], reason: str) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.array(values, np.float32)).save(buffer, format="TIFF")
    if reason:
        with pytest.raises(RejectError) as caught:
            mask(buffer.getvalue())
        assert caught.value.reason == reason
        return
    out = mask(buffer.getvalue())
    np.testing.assert_array_equal(out.array, values)
    assert out.array.dtype == np.uint8
