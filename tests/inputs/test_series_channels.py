"""Sensor channel files (.npy, .csv) read from real files, and each reject's wording."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.errors import RejectError
from h5etl.inputs import channels as series
from h5etl.inputs.channels import Channel, ChannelSpec
from h5etl.inputs.series_fit import FixedDuration, Windowing, fit_fixed, samples_in, too_short

ACCEL = ChannelSpec("accel", "accel.npy", "float32", (3,), 100.0, units="m/s^2")
VOLTS = ChannelSpec("volts", "volts.csv", "float32", (), 10.0, columns=("v",))
TEMP = ChannelSpec("temp", "temp.csv", "float64", (), None, time_column="t")


def _npy(tmp_path: Path, array: np.ndarray, name: str = "accel.npy") -> tuple[bytes, str]:
    path = tmp_path / name
    np.save(path, array)
    return path.read_bytes(), str(path)


def _csv(tmp_path: Path, text: str, name: str = "volts.csv") -> tuple[bytes, str]:
    path = tmp_path / name
    path.write_text(text)
    return path.read_bytes(), str(path)


def _reject(call: object, *args: object) -> RejectError:
    with pytest.raises(RejectError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


def test_npy_values_come_back_in_the_declared_dtype(tmp_path: Path) -> None:
    expected = np.arange(30, dtype=np.float64).reshape(10, 3) / 7
    data, path = _npy(tmp_path, expected)
    values = series.read_npy(data, path, ACCEL)
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, expected.astype(np.float32))
    assert series.probe_npy(path) == (10, 3)


def test_npy_of_another_trailing_shape_is_rejected_with_its_shape(tmp_path: Path) -> None:
    data, path = _npy(tmp_path, np.zeros((10, 2), np.float32))
    error = _reject(series.read_npy, data, path, ACCEL)
    assert error.reason == "trailing_shape"
    assert error.path == path
    assert "(10, 2), expected (n, 3)" in error.message


def test_npy_nan_is_rejected_at_its_sample_time_and_component(tmp_path: Path) -> None:
    array = np.zeros((200, 3), np.float32)
    array[150, 2] = np.nan
    array[160, 0] = np.inf
    data, path = _npy(tmp_path, array)
    error = _reject(series.read_npy, data, path, ACCEL)
    assert (error.reason, error.path) == ("non_finite", path)
    assert "nan at sample 150 (1.5 s), component (2,) (2 non-finite in all)" in error.message


def test_truncated_and_foreign_npy_files_are_unreadable(tmp_path: Path) -> None:
    data, path = _npy(tmp_path, np.zeros((10, 3), np.float32))
    assert _reject(series.read_npy, data[:-8], path, ACCEL).reason == "unreadable"
    assert _reject(series.read_npy, b"not numpy", path, ACCEL).reason == "unreadable"
    objects = np.array([{"a": 1}] * 3, dtype=object)
    (tmp_path / "o.npy").write_bytes(b"")
    np.save(tmp_path / "o.npy", objects, allow_pickle=True)
    error = _reject(series.read_npy, (tmp_path / "o.npy").read_bytes(), path, ACCEL)
    assert error.reason == "unreadable"


def test_npy_floats_into_an_integer_channel_must_be_exact(tmp_path: Path) -> None:
    spec = ChannelSpec("counts", "c.npy", "int16", (), 1.0)
    data, path = _npy(tmp_path, np.array([1.0, 2.0, 40000.0]))
    error = _reject(series.read_npy, data, path, spec)
    assert error.reason == "lossy_conversion"
    assert "40000.0 at sample 2 (2 s)" in error.message
    data, path = _npy(tmp_path, np.array([1.0, -2.0, 3.0]))
    np.testing.assert_array_equal(series.read_npy(data, path, spec), np.array([1, -2, 3], np.int16))


def test_csv_with_a_declared_rate(tmp_path: Path) -> None:
    data, path = _csv(tmp_path, "v,other\n1.5,9\n2.5,9\n-3,9\n")
    values, times = series.read_csv(data, path, VOLTS)
    assert times is None
    np.testing.assert_array_equal(values, np.array([1.5, 2.5, -3], np.float32))


def test_csv_with_a_time_column_in_milliseconds_and_a_vector_value(tmp_path: Path) -> None:
    spec = ChannelSpec("acc", "a.csv", "float64", (2,), None, "ms", ("x", "y"), "ms")
    data, path = _csv(tmp_path, "x;ms;y\r\n1;0;2\r\n3;10;4\r\n", "a.csv")
    values, times = series.read_csv(data, path, spec)
    np.testing.assert_array_equal(values, [[1, 2], [3, 4]])
    assert times is not None
    np.testing.assert_allclose(times, [0.0, 0.01])


@pytest.mark.parametrize(
    ("text", "reason", "words"),
    [
        pytest.param(
            "t,v\n0,1\n1,2\n1,3\n", "duplicate_timestamp", "1 s on line 4 repeats line 3", id="dup"
        ),
        pytest.param(
            "t,v\n0,1\n2,2\n1,3\n",
            "non_monotonic_timestamps",
            "1 s on line 4 comes before 2 s",
            id="back",
        ),
        pytest.param("t,v\n0,1\n1,nan\n", "non_finite", "value nan at line 3", id="nan"),
        pytest.param("t,v\n0,1\nnan,2\n", "non_finite", "timestamp nan at line 3", id="nan-time"),
        pytest.param(
            "t,v\n0,1\n1,x\n", "bad_value", "line 3, column 2: cannot read 'x'", id="text"
        ),
        pytest.param("t,v\n0,1\n1\n", "bad_value", "line 3 has 1 columns", id="short-line"),
        pytest.param("time,v\n0,1\n", "missing_column", "no column 't'", id="no-time"),
        pytest.param("t,v,w\n0,1,2\n", "trailing_shape", "2 value columns", id="columns"),
    ],
)
def test_csv_rejects_name_the_line(tmp_path: Path, text: str, reason: str, words: str) -> None:
    data, path = _csv(tmp_path, text, "temp.csv")
    error = _reject(series.read_csv, data, path, TEMP)
    assert (error.reason, error.path) == (reason, path)
    assert words in error.message


def _channel(spec: ChannelSpec, n: int, times: np.ndarray | None = None) -> Channel:
    return Channel(spec, np.zeros((n, *spec.trailing), spec.dtype), times, f"/r/{spec.file}")


def test_durations_within_the_tolerance_pass_and_beyond_it_are_rejected() -> None:
    accel = _channel(ACCEL, 1000)  # 10 s at 100 Hz
    volts = _channel(VOLTS, 99)  # 9.9 s at 10 Hz
    temp = _channel(TEMP, 10, np.arange(10.0) + 100)  # 9 s span + 1 s median step
    series.check_durations([accel, volts, temp], tolerance_s=0.1)
    error = _reject(series.check_durations, [accel, _channel(VOLTS, 90), temp], 0.1)
    assert error.reason == "duration_mismatch"
    assert error.path == "/r/volts.csv"
    assert "differ by 1 s, more than the tolerance 0.1 s" in error.message
    assert "volts 9 s (90 samples)" in error.message


def test_fixed_duration_crops_and_pads() -> None:
    rule = FixedDuration(2.0, "pad", -1.0)
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    out, real = fit_fixed(values, 5, rule, name="a", path="p")
    assert real == 3
    np.testing.assert_array_equal(out, [[0, 1], [2, 3], [4, 5], [-1, -1], [-1, -1]])
    out, real = fit_fixed(values, 2, rule, name="a", path="p")
    np.testing.assert_array_equal(out, values[:2])
    with pytest.raises(RejectError, match="has 3 samples, fewer than the 5") as info:
        fit_fixed(values, 5, FixedDuration(2.0, "reject"), name="a", path="p")
    assert info.value.reason == "too_short"


def test_whole_samples() -> None:
    assert samples_in(0.3, 100) == 30  # 0.3 * 100 is 30.000000000000004 in floats
    assert samples_in(0.25, 10) is None
    assert samples_in(1.5, 10_000) == 15_000


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda w: st.tuples(st.just(w), st.integers(1, 8), st.integers(0, 60), st.integers(0, 60))
    )
)
def test_windows_cover_whole_stretches_of_every_channel(case: tuple[int, int, int, int]) -> None:
    window, stride, fast_n, slow_n = case  # window and stride in samples of the 1 Hz channel
    rule = Windowing(float(window), float(stride))
    rates = {"fast": 4.0, "slow": 1.0}
    lengths = {"fast": fast_n, "slow": slow_n}
    count = rule.count(lengths, rates)
    expected = 0
    while (expected * stride + window) * 4 <= fast_n and expected * stride + window <= slow_n:
        expected += 1
    assert count == expected
    for k in range(count):
        fast, slow = rule.span(k, 4.0), rule.span(k, 1.0)
        assert fast.start == 4 * slow.start
        assert fast.stop == 4 * slow.stop
        assert fast.stop <= fast_n
        assert slow.stop <= slow_n
        assert rule.offset_s(k) == slow.start
    if count == 0:
        assert "fewer than one window" in too_short(lengths, rates, rule)
