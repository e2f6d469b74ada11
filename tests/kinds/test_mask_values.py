"""mask_values: masks are single-channel and hold only their allowed labels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5etl.errors import RejectError
from h5etl.kinds.mask_values import check_mask


@pytest.mark.parametrize(
    ("mask", "values", "expected"),
    [
        pytest.param([[0, 1], [1, 0]], (0, 1), [[0, 1], [1, 0]], id="labels-kept"),
        pytest.param([[0, 255], [255, 0]], (0, 1), [[0, 1], [1, 0]], id="0-255-to-0-1"),
        pytest.param([[255, 255]], (0, 1), [[1, 1]], id="all-255"),
        pytest.param([[0, 0]], (0, 1), [[0, 0]], id="all-0"),
        pytest.param([[0, 3], [7, 3]], (0, 3, 7), [[0, 3], [7, 3]], id="multi-class"),
        pytest.param([[0, 255]], (0, 255), [[0, 255]], id="255-allowed"),
    ],
)
def test_accepted(
    mask: list[list[int]], values: tuple[int, ...], expected: list[list[int]]
) -> None:
    out = check_mask(np.array(mask, np.uint8), values, path="m.png")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("mask", "values", "shown"),
    [
        pytest.param([[0, 128], [255, 0]], (0, 1), "got 128", id="a-128"),
        pytest.param([[0, 1], [255, 0]], (0, 1), "255", id="mixed-1-255"),
        pytest.param([[0, 2]], (0, 1), "2", id="a-2"),
        pytest.param([[0, 255]], (0, 1, 2), "255", id="multi-class-no-rescale"),
        pytest.param(np.arange(20).reshape(4, 5).tolist(), (0, 1), ", ...", id="many-shown-short"),
    ],
)
def test_rejected(mask: list[list[int]], values: tuple[int, ...], shown: str) -> None:
    with pytest.raises(RejectError) as caught:
        check_mask(np.array(mask, np.uint8), values, path="m.png")
    assert caught.value.reason == "mask_values"
    assert caught.value.path == "m.png"
    assert shown in caught.value.message
    assert str(list(values)) in caught.value.message


def test_stray_value_in_a_0_255_mask_is_named_alone() -> None:
    # the message said "got 128, 255" although the 255s were fine
    with pytest.raises(RejectError) as caught:
        check_mask(np.array([[0, 128, 255]], np.uint8), (0, 1), path="m.png")
    assert caught.value.message.endswith("got 128")


def test_more_than_one_channel_is_rejected() -> None:
    with pytest.raises(RejectError) as caught:
        check_mask(np.zeros((2, 2, 3), np.uint8), (0, 1), path="m.png")
    assert caught.value.reason == "mask_not_single_channel"


@given(st.lists(st.sampled_from([0, 255]), min_size=1, max_size=64))
def test_binary_masks_always_become_0_1(pixels: list[int]) -> None:
    mask = np.array(pixels, np.uint8).reshape(1, -1)
    np.testing.assert_array_equal(check_mask(mask, (0, 1), path="m"), mask // 255)


@given(
    st.lists(st.sampled_from([0, 1, 2, 3, 7, 128, 254, 255]), min_size=1, max_size=40),
    st.sampled_from([(0, 1), (0, 1, 2), (0, 3, 7), (0, 255), (1, 2)]),
)
def test_fast_paths_agree_with_the_histogram_rule(
    pixels: list[int], values: tuple[int, ...]
) -> None:
    """Accept exactly the masks whose labels are all allowed, or 0/255 read as 0/1."""
    mask = np.array(pixels, np.uint8).reshape(1, -1)
    present = set(pixels)
    if present <= set(values):
        expected: np.ndarray | None = mask
    elif set(values) == {0, 1} and present <= {0, 255}:
        expected = (mask == 255).astype(np.uint8)
    else:
        expected = None
    if expected is None:
        with pytest.raises(RejectError):
            check_mask(mask, values, path="m.png")
        return
    out = check_mask(mask, values, path="m.png")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)
