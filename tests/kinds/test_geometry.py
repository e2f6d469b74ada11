"""geometry: centred padding, cropping and fitting, as properties over all sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5etl.kinds import placement as geometry

sides = st.integers(1, 40)


@st.composite
def fitting(draw: st.DrawFn) -> tuple[tuple[int, int], tuple[int, int]]:
    """A (h, w) size and a target at least as large."""
    h, w = draw(sides), draw(sides)
    return (h, w), (h + draw(st.integers(0, 20)), w + draw(st.integers(0, 20)))


@given(fitting(), st.integers(0, 255), st.booleans())
def test_pad_shape_position_and_fill(
    sizes: tuple[tuple[int, int], tuple[int, int]], fill: int, rgb: bool
) -> None:
    (h, w), (big_h, big_w) = sizes
    rng = np.random.default_rng(h * 1000 + w)
    array = rng.integers(0, 256, (h, w, 3) if rgb else (h, w), dtype=np.uint8)
    channels = 3 if rgb else 1
    out = geometry.pad(array, (channels, big_h, big_w), fill)
    assert out.shape == (channels, big_h, big_w)
    assert out.dtype == np.uint8
    top, left = (big_h - h) // 2, (big_w - w) // 2
    window = out[:, top : top + h, left : left + w]
    expected = array.transpose(2, 0, 1) if rgb else array[None]
    np.testing.assert_array_equal(window, expected)
    outside = np.ones(out.shape, dtype=bool)
    outside[:, top : top + h, left : left + w] = False
    assert (out[outside] == fill).all()
    # the odd pixel goes bottom/right: the top margin is never the larger one
    assert top <= big_h - h - top
    assert left <= big_w - w - left


@given(fitting())
def test_pad_offsets_centre(sizes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    size, target = sizes
    top, left = geometry.pad_offsets(size, target)
    bottom, right = target[0] - size[0] - top, target[1] - size[1] - left
    assert 0 <= bottom - top <= 1
    assert 0 <= right - left <= 1


@given(fitting())
def test_center_crop_is_the_inverse_of_pad(sizes: tuple[tuple[int, int], tuple[int, int]]) -> None:
    small, big = sizes
    rng = np.random.default_rng(small[0])
    array = rng.integers(0, 256, small, dtype=np.uint8)
    padded = geometry.pad(array, (1, *big), 0)[0]
    np.testing.assert_array_equal(geometry.center_crop(padded, small), array)


@given(sides, sides, sides, sides)
def test_center_crop_shape(h: int, w: int, th: int, tw: int) -> None:
    array = np.zeros((h, w, 3), np.uint8)
    out = geometry.center_crop(array, (th, tw))
    assert out.shape == (min(h, th), min(w, tw), 3)
    top, left = geometry.crop_offsets((h, w), (th, tw))
    assert top == max(h - th, 0) // 2
    assert left == max(w - tw, 0) // 2


@given(st.integers(1, 4000), st.integers(1, 4000), sides, sides)
def test_fit_within(h: int, w: int, th: int, tw: int) -> None:
    fh, fw = geometry.fit_within((h, w), (th, tw))
    assert 1 <= fh <= th
    assert 1 <= fw <= tw
    if not geometry.is_oversize((h, w), (th, tw)):
        assert (fh, fw) == (h, w)  # never enlarged
    else:
        # one side touches the target (up to rounding); the aspect ratio is kept within a pixel
        assert fh >= th - 1 or fw >= tw - 1
        assert abs(fh * w - fw * h) <= max(h, w)


@pytest.mark.parametrize(
    ("size", "target", "expected"),
    [
        pytest.param((10, 12), (24, 24), False, id="smaller"),
        pytest.param((24, 24), (24, 24), False, id="equal"),
        pytest.param((25, 10), (24, 24), True, id="taller"),
        pytest.param((10, 25), (24, 24), True, id="wider"),
    ],
)
def test_is_oversize(size: tuple[int, int], target: tuple[int, int], expected: bool) -> None:
    assert geometry.is_oversize(size, target) is expected


def test_place_writes_into_the_slot() -> None:
    out = np.full((1, 5, 5), 9, np.uint8)
    geometry.place(np.ones((2, 3), np.uint8), out)
    assert out[0, 1:3, 1:4].tolist() == [[1, 1, 1], [1, 1, 1]]
    assert int(out.sum()) == 9 * 19 + 6
