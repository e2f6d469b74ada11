"""stats: exact per-channel statistics and histograms, bit-identical for any grouping and order."""

from __future__ import annotations

import itertools
import math
import pickle
from fractions import Fraction
from functools import reduce
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from h5etl.format import contract as fileformat
from h5etl.stats import sums
from h5etl.stats.normalisation import ChannelStats, Histogram

DTYPES = [np.uint8, np.uint16, np.int16, np.float32]
LAYOUTS: dict[str, int | None] = {"hwc": -1, "chw": 0, "hw": None}


@st.composite
def sample_lists(draw: st.DrawFn) -> tuple[list[np.ndarray], int | None]:
    """A few samples of one dtype and channel count, some of them empty, floats with NaN/Inf."""
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    channels = 1 if layout == "hw" else draw(st.integers(1, 4))
    elements = st.floats(width=32) if dtype == np.float32 else None
    arrays = []
    for _ in range(draw(st.integers(1, 6))):
        h, w = draw(st.integers(0, 5)), draw(st.integers(0, 5))
        shape = {"hwc": (h, w, channels), "chw": (channels, h, w), "hw": (h, w)}[layout]
        arrays.append(draw(hnp.arrays(dtype, shape, elements=elements)))
    return arrays, LAYOUTS[layout]


def fold(parts: list[ChannelStats]) -> ChannelStats:
    return reduce(ChannelStats.merge, parts, ChannelStats())


def same_bits(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a
    )


def channel_values(arrays: list[np.ndarray], axis: int | None) -> list[list[Any]]:
    """Each channel's values over all samples, as Python numbers (the independent oracle)."""
    planes = [a.reshape(1, -1) if axis is None else np.moveaxis(a, axis, 0) for a in arrays]
    channels = planes[0].shape[0]
    return [[v for p in planes for v in p[c].ravel().tolist()] for c in range(channels)]


def correctly_rounded_root(root: float, square: Fraction) -> bool:
    """Whether ``root`` is the double nearest sqrt(square): between the midpoints around it."""
    below = (Fraction(root) + Fraction(math.nextafter(root, -math.inf))) / 2
    above = (Fraction(root) + Fraction(math.nextafter(root, math.inf))) / 2
    return max(below, Fraction(0)) ** 2 <= square <= above**2


def expected(values: list[Any]) -> dict[str, Any]:
    """mean/std/min/max/count of finite values with fractions: exact, then rounded once."""
    finite = [Fraction(v) for v in values if math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return {"count": 0, "nonfinite": len(values)}
    mean = sum(finite, Fraction(0)) / n
    var = sum(((v - mean) ** 2 for v in finite), Fraction(0)) / n
    return {
        "count": n,
        "nonfinite": len(values) - n,
        "mean": float(mean),
        "std": math.sqrt(float(var)),
        "var": var,
        "min": float(min(finite)),
        "max": float(max(finite)),
    }


@given(sample_lists(), st.data())
@settings(max_examples=300, deadline=None)
def test_any_grouping_and_merge_order_gives_identical_bits(
    case: tuple[list[np.ndarray], int | None], data: st.DataObject
) -> None:
    arrays, axis = case
    parts = [ChannelStats.of(a, channel_axis=axis) for a in arrays]
    baseline = fold(parts).attrs()
    # cut a random permutation into random groups (tasks), merge inside each group in its own
    # order and the group results in yet another order (the parent receiving task results)
    order = data.draw(st.permutations(range(len(parts))))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(parts) - 1)))))
    bounds = [0, *[c for c in cuts if c < len(parts)], len(parts)]
    groups = [[parts[i] for i in order[a:b]] for a, b in itertools.pairwise(bounds)]
    tasks = [fold(list(reversed(g)) if data.draw(st.booleans()) else g) for g in groups]
    merged = fold(data.draw(st.permutations(tasks)))
    assert same_bits(merged.attrs(), baseline)
    # one sample holding all those pixels has the same statistics as the merged samples
    whole = np.concatenate(
        [
            a.reshape(-1) if axis is None else np.moveaxis(a, axis, -1).reshape(-1, a.shape[axis])
            for a in arrays
        ]
    )
    assert same_bits(
        ChannelStats.of(whole, channel_axis=None if axis is None else -1).attrs(), baseline
    )


@given(sample_lists())
@settings(max_examples=300, deadline=None)
def test_values_match_an_exact_fraction_computation(
    case: tuple[list[np.ndarray], int | None],
) -> None:
    arrays, axis = case
    merged = fold([ChannelStats.of(a, channel_axis=axis) for a in arrays])
    attrs = merged.attrs()
    assert attrs is not None
    assert set(attrs) == set(fileformat.STAT_ATTRS)
    for c, values in enumerate(channel_values(arrays, axis)):
        want = expected(values)
        assert attrs["count"][c] == want["count"]
        assert merged.nonfinite[c] == want["nonfinite"]
        if want["count"] == 0:
            assert all(math.isnan(attrs[k][c]) for k in ("mean", "std", "min", "max"))
            continue
        assert attrs["mean"][c] == want["mean"]  # correctly rounded: exactly the nearest double
        assert abs(attrs["std"][c] - want["std"]) <= math.ulp(float(want["std"]))
        assert correctly_rounded_root(float(attrs["std"][c]), Fraction(want["var"]))
        assert attrs["min"][c] == want["min"]
        assert attrs["max"][c] == want["max"]


@pytest.mark.parametrize(
    "dtype",
    [
        np.uint8,
        np.uint16,
        np.int16,
        np.int8,
        np.int32,
        np.int64,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.bool_,
    ],
)
def test_every_numeric_dtype_against_float128(dtype: Any) -> None:
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        a = (rng.standard_normal((9, 7, 3)) * 1000).astype(dtype)
    elif np.dtype(dtype).kind == "b":
        a = rng.integers(0, 2, (9, 7, 3)).astype(bool)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (9, 7, 3), dtype=dtype, endpoint=True)
    attrs = ChannelStats.of(a, channel_axis=-1).attrs()
    assert attrs is not None
    wide = a.reshape(-1, 3).astype(np.longdouble)
    mean = wide.mean(axis=0)
    assert np.all(np.abs(attrs["mean"] - mean) <= np.abs(mean) * 1e-15 + 1e-300)
    std = np.sqrt(((wide - mean) ** 2).mean(axis=0))
    assert np.all(np.abs(attrs["std"] - std) <= std * 1e-13)
    assert np.array_equal(attrs["min"], a.reshape(-1, 3).min(axis=0).astype(np.float64))
    assert np.array_equal(attrs["max"], a.reshape(-1, 3).max(axis=0).astype(np.float64))
    assert attrs["count"].dtype == np.int64
    assert all(attrs[k].dtype == np.float64 for k in ("mean", "std", "min", "max"))


def test_uint16_sum_of_squares_stays_exact_past_the_dot_product_block() -> None:
    # 2**21 + 101 pixels of 65535: the (odd) sum of squares is past 2**53, so a single float64
    # dot product would round it
    n = 2**21 + 101
    assert n * 65535**2 > 2**53
    a = np.full((1, 1, n), 65535, dtype=np.uint16)
    s = ChannelStats.of(a, channel_axis=0)
    assert s.squares == (n * 65535**2,)
    assert s.total == (n * 65535,)
    attrs = s.attrs()
    assert attrs is not None
    assert attrs["mean"][0] == 65535.0
    assert attrs["std"][0] == 0.0


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32])
def test_splitting_a_sample_into_blocks_changes_nothing(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((3, 40, 30)) * 300).astype(dtype)
    whole = ChannelStats.of(a, channel_axis=0)
    monkeypatch.setattr(sums, "_BLOCK", 7)  # the bound that keeps float64 partial sums exact
    assert ChannelStats.of(a, channel_axis=0) == whole


def test_nonfinite_values_are_counted_and_excluded() -> None:
    a = np.array([[1.0, np.nan, 3.0, np.inf], [-np.inf, np.nan, np.nan, np.nan]], np.float32)
    s = ChannelStats.of(a, channel_axis=0)
    assert s.nonfinite == (2, 4)
    attrs = s.attrs()
    assert attrs is not None
    assert attrs["count"].tolist() == [2, 0]
    assert attrs["mean"][0] == 2.0
    assert attrs["std"][0] == 1.0
    assert (attrs["min"][0], attrs["max"][0]) == (1.0, 3.0)
    # a channel with no finite value has no statistics, not a made-up number
    assert all(math.isnan(attrs[k][1]) for k in ("mean", "std", "min", "max"))


def test_negative_zero_does_not_make_min_and_max_order_dependent() -> None:
    neg, pos = np.array([-0.0], np.float32), np.array([0.0], np.float32)
    a = ChannelStats.of(neg, channel_axis=None).merge(ChannelStats.of(pos, channel_axis=None))
    b = ChannelStats.of(pos, channel_axis=None).merge(ChannelStats.of(neg, channel_axis=None))
    assert same_bits(a.attrs(), b.attrs())
    attrs = a.attrs()
    assert attrs is not None
    assert math.copysign(1.0, attrs["min"][0]) == 1.0


def test_empty_stats_are_the_identity_and_have_no_attrs() -> None:
    one = ChannelStats.of(np.arange(12, dtype=np.uint8).reshape(2, 2, 3), channel_axis=-1)
    assert ChannelStats().attrs() is None
    assert ChannelStats().merge(one) == one
    assert one.merge(ChannelStats()) == one
    # samples with no pixels: the channels are known, the statistics are not
    empty = ChannelStats.of(np.zeros((0, 4, 3), np.uint8), channel_axis=-1).attrs()
    assert empty is not None
    assert empty["count"].tolist() == [0, 0, 0]
    assert np.isnan(empty["mean"]).all()


def test_merging_different_channel_counts_is_refused() -> None:
    rgb = ChannelStats.of(np.zeros((2, 2, 3), np.uint8), channel_axis=-1)
    grey = ChannelStats.of(np.zeros((2, 2), np.uint8), channel_axis=None)
    with pytest.raises(ValueError, match=r"3 channels with 1"):
        rgb.merge(grey)


def test_unsupported_dtypes_are_refused() -> None:
    with pytest.raises(TypeError, match="complex"):
        ChannelStats.of(np.zeros(3, np.complex64), channel_axis=None)
    with pytest.raises(TypeError, match="float"):
        Histogram.of(np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_stats_are_small_and_picklable(dtype: Any) -> None:
    rng = np.random.default_rng(0)
    a = (rng.random((256, 256, 3)) * 255).astype(dtype)
    s = ChannelStats.of(a, channel_axis=-1)
    blob = pickle.dumps(s)
    assert pickle.loads(blob) == s
    assert len(blob) < 1000
    h = Histogram.of(a.astype(np.uint8))
    assert pickle.loads(pickle.dumps(h)) == h


def test_mixing_integer_and_float_samples_is_exact() -> None:
    ints = ChannelStats.of(np.array([1, 2], np.uint8), channel_axis=None)
    floats = ChannelStats.of(np.array([0.5, 2**-140], np.float32), channel_axis=None)
    attrs = ints.merge(floats).attrs()
    assert attrs is not None
    assert attrs["mean"][0] == float((Fraction(7, 2) + Fraction(2) ** -140) / 4)


# --- histograms ---------------------------------------------------------------------------


@st.composite
def label_arrays(draw: st.DrawFn) -> list[np.ndarray]:
    dtype = draw(st.sampled_from([np.uint8, np.uint16, np.int64, np.int16, np.bool_]))
    elements = st.integers(-(2**40), 2**40) if dtype == np.int64 else None
    shape = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6)
    return draw(st.lists(hnp.arrays(dtype, shape, elements=elements), min_size=1, max_size=6))


@given(label_arrays(), st.data())
@settings(max_examples=300, deadline=None)
def test_histogram_matches_unique_for_any_grouping(
    arrays: list[np.ndarray], data: st.DataObject
) -> None:
    parts = [Histogram.of(a) for a in arrays]
    baseline = reduce(Histogram.merge, parts, Histogram()).attrs()
    shuffled = data.draw(st.permutations(parts))
    half = data.draw(st.integers(0, len(parts)))
    left = reduce(Histogram.merge, shuffled[:half], Histogram())
    right = reduce(Histogram.merge, reversed(shuffled[half:]), Histogram())
    assert same_bits(right.merge(left).attrs(), baseline)
    values, counts = np.unique(np.concatenate([a.ravel() for a in arrays]), return_counts=True)
    if values.size == 0:
        assert baseline is None
        return
    assert baseline is not None
    assert set(baseline) == set(fileformat.HISTOGRAM_ATTRS)
    assert baseline["histogram_values"].dtype == np.int64
    assert baseline["histogram_counts"].dtype == np.int64
    assert baseline["histogram_values"].tolist() == values.astype(np.int64).tolist()
    assert baseline["histogram_counts"].tolist() == counts.tolist()


def test_histogram_of_a_mask() -> None:
    mask = np.zeros((1, 512, 512), np.uint8)
    mask[0, :10, :20] = 3
    mask[0, 100, 100] = 255
    attrs = Histogram.of(mask).attrs()
    assert attrs is not None
    assert attrs["histogram_values"].tolist() == [0, 3, 255]
    assert attrs["histogram_counts"].tolist() == [512 * 512 - 201, 200, 1]


def test_histogram_refuses_values_outside_int64() -> None:
    with pytest.raises(ValueError, match="int64"):
        Histogram.of(np.array([2**63], np.uint64))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**31)),
        min_size=0,
        max_size=6,
    ),
    st.sampled_from([np.uint8, np.uint16, np.float32]),
)
def test_a_tasks_windows_at_once_equal_merging_each(
    shapes: list[tuple[int, int, int]], dtype: Any
) -> None:
    # of_windows is the decode stage's fast path; it must give the bits a merge would
    windows = []
    for height, width, seed in shapes:
        rng = np.random.default_rng(seed)
        block = np.zeros((3, 48, 48), dtype=dtype)
        top, left = (48 - height) // 2, (48 - width) // 2
        window = block[:, top : top + height, left : left + width]
        window[...] = rng.integers(
            0, np.iinfo(dtype).max if dtype != np.float32 else 999, window.shape
        )
        windows.append(window)
    merged = reduce(
        ChannelStats.merge, (ChannelStats.of(w, channel_axis=0) for w in windows), ChannelStats()
    )
    assert ChannelStats.of_windows(windows) == merged


def test_windows_past_the_uint32_block_take_the_exact_path() -> None:
    window = np.full((1, 300, 300), 255, np.uint8)  # 90,000 squares of 65,025 pass 2**32
    got = ChannelStats.of_windows([window])
    assert got == ChannelStats.of(window, channel_axis=0)
    assert got.squares == (90_000 * 255 * 255,)
