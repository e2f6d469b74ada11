"""The built-in transforms' rules as properties (issue 28, item 4): shapes, dtypes, where
idempotence holds, crop and pad undoing each other, centring as the field's own padding, a
cast that never wraps."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from h5etl.errors import RejectError
from h5etl.kinds import placement
from h5etl.transforms import builtin

# no deadline: a shared machine makes hypothesis's per-example timing a timed assertion
QUICK = settings(max_examples=40, deadline=None)
DTYPES = st.sampled_from(["uint8", "uint16", "int16", "float32"])


@st.composite
def images(draw: st.DrawFn, dtype: str | None = None) -> np.ndarray:
    """(h, w) or (h, w, 3) arrays of a field dtype, 1..12 pixels a side."""
    chosen = dtype or draw(DTYPES)
    shape: tuple[int, ...] = draw(st.tuples(st.integers(1, 12), st.integers(1, 12)))
    if draw(st.booleans()):
        shape = (*shape, 3)
    elements = (
        st.floats(-1e4, 1e4, width=32) if chosen == "float32" else None  # finite values only
    )
    return draw(hnp.arrays(chosen, shape, elements=elements))


SIZES = st.tuples(st.integers(1, 14), st.integers(1, 14))


@QUICK
@given(images(), SIZES)
def test_crop_cuts_at_most_size_centred_as_the_field_crops(
    array: np.ndarray, size: tuple[int, int]
) -> None:
    out = builtin.crop(array, size=list(size))
    want = (min(size[0], array.shape[0]), min(size[1], array.shape[1]))
    assert out.shape == (*want, *array.shape[2:])
    assert out.dtype == array.dtype
    np.testing.assert_array_equal(out, placement.center_crop(array, size))
    np.testing.assert_array_equal(builtin.crop(out, size=list(size)), out)  # idempotent


@QUICK
@given(images(), SIZES, st.integers(0, 200))
def test_pad_centres_on_fill_as_the_field_pads(
    array: np.ndarray, extra: tuple[int, int], fill: int
) -> None:
    size = [array.shape[0] + extra[0] - 1, array.shape[1] + extra[1] - 1]
    out = builtin.pad(array, size=size, fill=fill)
    assert out.shape == (*size, *array.shape[2:])
    assert out.dtype == array.dtype
    channels = array.shape[2] if array.ndim == 3 else 1
    expected = placement.pad(array, (channels, size[0], size[1]), fill)
    np.testing.assert_array_equal(np.moveaxis(out.reshape(*size, channels), 2, 0), expected)
    np.testing.assert_array_equal(builtin.pad(out, size=size, fill=fill), out)  # idempotent


@QUICK
@given(images(), SIZES)
def test_pad_then_crop_gives_the_value_back(array: np.ndarray, extra: tuple[int, int]) -> None:
    size = [array.shape[0] + extra[0], array.shape[1] + extra[1]]
    padded = builtin.pad(array, size=size, fill=0)
    back = builtin.crop(padded, size=list(array.shape[:2]))
    np.testing.assert_array_equal(back, array)


@QUICK
@given(images(), SIZES)
def test_crop_then_pad_gives_exactly_size_with_the_centre_kept(
    array: np.ndarray, size: tuple[int, int]
) -> None:
    cut = builtin.crop(array, size=list(size))
    out = builtin.pad(cut, size=list(size), fill=0)
    assert out.shape[:2] == size
    np.testing.assert_array_equal(builtin.crop(out, size=list(cut.shape[:2])), cut)


def test_crop_from_a_start_and_the_volume_axes() -> None:
    volume = np.arange(4 * 5 * 6).reshape(4, 5, 6)
    np.testing.assert_array_equal(
        builtin.crop(volume, size=[2, 3, 4], start=[1, 0, 2]), volume[1:3, 0:3, 2:6]
    )
    with pytest.raises(ValueError, match="starts at 5 on axis 1, which has 5"):
        builtin.crop(volume, size=[2, 3], start=[0, 5])
    with pytest.raises(ValueError, match="crop it first"):
        builtin.pad(volume, size=[3, 5, 6])
    with pytest.raises(ValueError, match="fill 300 does not fit a uint8"):
        builtin.pad(np.zeros((2, 2), np.uint8), size=[3, 3], fill=300)


@QUICK
@given(images(), st.integers(-300, 300), st.integers(0, 300))
def test_clip_keeps_the_dtype_bounds_the_values_and_is_idempotent(
    array: np.ndarray, low: int, width: int
) -> None:
    out = builtin.clip(array, low=low, high=low + width)
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    inside = (array >= low) & (array <= low + width)
    np.testing.assert_array_equal(out[inside], array[inside])
    np.testing.assert_array_equal(builtin.clip(out, low=low, high=low + width), out)


@QUICK
@given(images(), st.floats(-1e3, 1e3), st.floats(1, 1e3), st.floats(0.5, 300))
def test_window_maps_low_to_zero_and_high_to_scale(
    array: np.ndarray, low: float, width: float, scale: float
) -> None:
    out = builtin.window(array, low=low, high=low + width, scale=scale)
    assert out.dtype == np.float32
    assert out.shape == array.shape
    assert out.min() >= 0
    assert out.max() <= np.float32(scale)
    order = np.argsort(array.ravel(), kind="stable")
    assert (np.diff(out.ravel()[order]) >= 0).all()  # monotone: a window never reorders values


@QUICK
@given(images())
def test_minmax_lands_in_zero_one_and_is_idempotent(array: np.ndarray) -> None:
    out = builtin.normalise(array)
    assert out.dtype == np.float32
    assert 0 <= out.min() <= out.max() <= 1
    np.testing.assert_array_equal(builtin.normalise(out), out)


def test_meanstd_per_channel() -> None:
    rgb = np.array([[[10, 20, 30]]], np.uint8)
    out = builtin.normalise(rgb, method="meanstd", mean=[10, 10, 10], std=[1, 2, 4])
    np.testing.assert_array_equal(out, np.array([[[0, 5, 5]]], np.float32))


# Python's round is half to even, as numpy's rint
ROUNDING: dict[str, Callable[[float], int]] = {
    "nearest": round,
    "floor": math.floor,
    "trunc": math.trunc,
}


@QUICK
@given(
    hnp.arrays("float64", st.integers(1, 20), elements=st.floats(-300, 300)),
    st.sampled_from(sorted(ROUNDING)),
)
def test_a_float_cast_rounds_as_asked_or_refuses(values: np.ndarray, rounding: str) -> None:
    expected = [ROUNDING[rounding](float(v)) for v in values]
    if min(expected) < 0 or max(expected) > 255:
        with pytest.raises(
            RejectError, match=r"cast to uint8: values .* outside 0\.\.255"
        ) as caught:
            builtin.cast(values, dtype="uint8", round=rounding)  # type: ignore[arg-type]
        assert caught.value.reason == "transform_output"
        return
    out = builtin.cast(values, dtype="uint8", round=rounding)  # type: ignore[arg-type]
    assert out.dtype == np.uint8
    assert out.tolist() == expected
    np.testing.assert_array_equal(builtin.cast(out, dtype="uint8"), out)  # idempotent


@QUICK
@given(images("int16"))
def test_an_integer_cast_is_exact_or_refused(array: np.ndarray) -> None:
    if array.min() < 0 or array.max() > 255:
        with pytest.raises(RejectError, match="never wrapped or clipped"):
            builtin.cast(array, dtype="uint8")
    else:
        np.testing.assert_array_equal(builtin.cast(array, dtype="uint8"), array)


@pytest.mark.parametrize(
    ("values", "dtype", "found"),
    [
        pytest.param([1.0, float("nan")], "int16", "NaN or infinity", id="nan"),
        pytest.param([1e39], "float32", "beyond its range", id="float32"),
        pytest.param([-0.5, 70000.0], "uint16", "values 0..70000 outside 0..65535", id="range"),
    ],
)
def test_a_cast_refuses_what_the_target_cannot_hold(
    values: list[float], dtype: str, found: str
) -> None:
    with pytest.raises(RejectError, match=found):
        builtin.cast(np.array(values), dtype=dtype)


@QUICK
@given(images(), SIZES, st.sampled_from(["nearest", "bilinear", "area"]))
def test_resize_gives_the_size_and_keeps_the_dtype(
    array: np.ndarray, size: tuple[int, int], filter: str
) -> None:
    out = builtin.resize(array, size=list(size), filter=filter)  # type: ignore[arg-type]
    assert out.shape == (*size, *array.shape[2:])
    assert out.dtype == array.dtype
    same = builtin.resize(array, size=list(array.shape[:2]), filter="nearest")
    np.testing.assert_array_equal(same, array)  # nearest to its own size changes nothing


def test_every_builtin_is_documented() -> None:
    for name, entry in builtin.BUILTINS.items():
        assert entry.function.__name__ == name
        assert entry.function.__doc__, name
