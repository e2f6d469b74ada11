"""Recordings on disk (folders and shared stems): found, checked together, cut; and their config."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from h5etl.config.fields.series import SeriesField
from h5etl.errors import RejectError
from h5etl.inputs import recording
from h5etl.inputs.channels import ChannelSpec
from h5etl.inputs.recording import RecordingSpec
from h5etl.inputs.series_fit import FixedDuration, Windowing

ACCEL = ChannelSpec("accel", "accel.npy", "float32", (3,), 100.0)
VOLTS = ChannelSpec("volts", "volts.csv", "float32", (), 10.0, columns=("v",))
TEMP = ChannelSpec("temp", "temp.csv", "float64", (), 1.0, time_column="t")
SPEC = RecordingSpec("folder", (ACCEL, VOLTS, TEMP), tolerance_s=1.0)


def _write(
    folder: Path, seconds: float, *, start: float = 1000.0, prefix: str = ""
) -> dict[str, Any]:
    """A recording of ``seconds`` (accel 100 Hz (n, 3), volts 10 Hz, temp 1 Hz with times)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(int(seconds * 10))
    accel = rng.normal(size=(round(seconds * 100), 3)).astype(np.float32)
    volts = np.round(rng.normal(size=round(seconds * 10)), 3)
    temp_t = start + np.arange(round(seconds), dtype=np.float64)
    temp = 20 + np.arange(round(seconds)) / 4
    np.save(folder / f"{prefix}accel.npy", accel)
    (folder / f"{prefix}volts.csv").write_text("v\n" + "".join(f"{v}\n" for v in volts))
    (folder / f"{prefix}temp.csv").write_text(
        "t,celsius\n" + "".join(f"{t},{c}\n" for t, c in zip(temp_t, temp, strict=True))
    )
    return {"accel": accel, "volts": volts.astype(np.float32), "temp": temp, "temp_t": temp_t}


def test_a_folder_recording_is_read_whole(tmp_path: Path) -> None:
    expected = _write(tmp_path / "r1", 5.0)
    found, contents = recording.read_recording(str(tmp_path / "r1"), SPEC)
    np.testing.assert_array_equal(found.values["accel"], expected["accel"])
    np.testing.assert_array_equal(found.values["volts"], expected["volts"])
    np.testing.assert_array_equal(found.values["temp"], expected["temp"])
    assert found.start_s == 1000.0
    np.testing.assert_array_equal(found.times["temp"], expected["temp_t"] - 1000.0)
    assert found.lengths == {"accel": 500, "volts": 50, "temp": 5}
    assert contents["accel"] == (tmp_path / "r1" / "accel.npy").read_bytes()


def test_a_stem_recording_finds_its_channels_beside_the_first(tmp_path: Path) -> None:
    spec = RecordingSpec(
        "stem",
        tuple(
            ChannelSpec(
                c.name, "_" + c.file, c.dtype, c.trailing, c.rate_hz, c.time_column, c.columns
            )
            for c in (ACCEL, VOLTS, TEMP)
        ),
        tolerance_s=1.0,
    )
    expected = _write(tmp_path, 3.0, prefix="r7_")
    found, _ = recording.read_recording(str(tmp_path / "r7_accel.npy"), spec)
    np.testing.assert_array_equal(found.values["accel"], expected["accel"])
    assert recording.recording_name("sub/r7_accel.npy", spec) == "sub/r7"
    assert found.files["temp"] == str(tmp_path / "r7_temp.csv")


def test_a_missing_channel_is_named_by_the_file_it_expected(tmp_path: Path) -> None:
    _write(tmp_path / "r1", 3.0)
    (tmp_path / "r1" / "volts.csv").unlink()
    for call in (recording.read_recording, recording.probe_lengths):
        with pytest.raises(RejectError) as info:
            call(str(tmp_path / "r1"), SPEC)
        assert info.value.reason == "missing_channel"
        assert info.value.path == str(tmp_path / "r1" / "volts.csv")
        assert "channel volts is missing" in info.value.message


def test_channels_that_disagree_in_duration_are_rejected(tmp_path: Path) -> None:
    _write(tmp_path / "r1", 6.0)
    np.save(tmp_path / "r1" / "accel.npy", np.zeros((300, 3), np.float32))  # 3 s, not 6
    for call in (recording.read_recording, recording.probe_lengths):
        with pytest.raises(RejectError) as info:
            call(str(tmp_path / "r1"), SPEC)
        assert info.value.reason == "duration_mismatch"
        assert info.value.path == str(tmp_path / "r1" / "accel.npy")
        assert "differ by 3 s, more than the tolerance 1 s" in info.value.message


def test_a_wrong_trailing_shape_is_found_from_the_header_at_plan_time(tmp_path: Path) -> None:
    _write(tmp_path / "r1", 3.0)
    np.save(tmp_path / "r1" / "accel.npy", np.zeros((300, 2), np.float32))
    with pytest.raises(RejectError, match=r"\(300, 2\), expected \(n, 3\)") as info:
        recording.probe_lengths(str(tmp_path / "r1"), SPEC)
    assert info.value.reason == "trailing_shape"


def test_a_fixed_duration_crops_long_and_pads_short_recordings(tmp_path: Path) -> None:
    spec = RecordingSpec("folder", (ACCEL, VOLTS, TEMP), 1.0, fixed=FixedDuration(4.0, "pad", 0.0))
    long = _write(tmp_path / "long", 6.0)
    short = _write(tmp_path / "short", 2.0)
    found, _ = recording.read_recording(str(tmp_path / "long"), spec)
    np.testing.assert_array_equal(found.values["accel"], long["accel"][:400])
    assert found.lengths == {"accel": 400, "volts": 40, "temp": 4}
    found, _ = recording.read_recording(str(tmp_path / "short"), spec)
    assert found.values["accel"].shape == (400, 3)
    np.testing.assert_array_equal(found.values["accel"][:200], short["accel"])
    assert not found.values["accel"][200:].any()
    assert found.lengths == {"accel": 200, "volts": 20, "temp": 2}
    times = found.times["temp"]
    np.testing.assert_array_equal(times[:2], [0.0, 1.0])
    assert all(math.isnan(t) for t in times[2:])  # no sample there: no time either


def test_windows_read_their_stretch_of_every_channel(tmp_path: Path) -> None:
    spec = RecordingSpec("folder", (ACCEL, VOLTS, TEMP), 1.0, window=Windowing(2.0, 1.0))
    expected = _write(tmp_path / "r1", 5.0)
    lengths = recording.probe_lengths(str(tmp_path / "r1"), spec)
    assert lengths == {"accel": 500, "volts": 50, "temp": 5}
    assert recording.window_count(str(tmp_path / "r1"), spec, lengths) == 4
    found, read = recording.read_window(str(tmp_path / "r1"), spec, 2)
    np.testing.assert_array_equal(found.values["accel"], expected["accel"][200:400])
    np.testing.assert_array_equal(found.values["volts"], expected["volts"][20:40])
    np.testing.assert_array_equal(found.values["temp"], expected["temp"][2:4])
    assert found.start_s == 1002.0
    assert len(read["accel"]) < (tmp_path / "r1" / "accel.npy").stat().st_size  # its rows only


def test_a_nan_inside_a_window_is_named_at_its_place_in_the_file(tmp_path: Path) -> None:
    spec = RecordingSpec("folder", (ACCEL, VOLTS, TEMP), 1.0, window=Windowing(2.0, 2.0))
    _write(tmp_path / "r1", 6.0)
    accel = np.load(tmp_path / "r1" / "accel.npy")
    accel[450, 1] = np.nan
    np.save(tmp_path / "r1" / "accel.npy", accel)
    recording.read_window(str(tmp_path / "r1"), spec, 0)  # the NaN is not in this one
    with pytest.raises(RejectError, match=r"nan at sample 450 \(4.5 s\), component \(1,\)"):
        recording.read_window(str(tmp_path / "r1"), spec, 2)


def test_a_recording_shorter_than_a_window_is_too_short(tmp_path: Path) -> None:
    spec = RecordingSpec("folder", (ACCEL, VOLTS, TEMP), 1.0, window=Windowing(4.0, 1.0))
    _write(tmp_path / "r1", 3.0)
    lengths = recording.probe_lengths(str(tmp_path / "r1"), spec)
    with pytest.raises(RejectError, match="fewer than one window of 4 s") as info:
        recording.window_count(str(tmp_path / "r1"), spec, lengths)
    assert info.value.reason == "too_short"


# -- the config --------------------------------------------------------------------------------

FIELD = TypeAdapter(SeriesField)
CHANNELS = {
    "accel": {"file": "accel.npy", "rate_hz": 10000, "shape": [3], "units": "m/s^2"},
    "temp": {"file": "temp.csv", "time": "t", "units": "degC"},
}


def _problem(**keys: Any) -> str:
    with pytest.raises(ValidationError) as info:
        FIELD.validate_python({"kind": "series", "channels": CHANNELS, **keys})
    return str(info.value)


def test_a_series_config_reads() -> None:
    field = FIELD.validate_python({"kind": "series", "channels": CHANNELS})
    assert field.channels["accel"].shape == (3,)
    assert field.tolerance == 1e-4  # one sample of the slowest declared rate


@pytest.mark.parametrize(
    ("channel", "words"),
    [
        pytest.param({"file": "a.parquet", "rate_hz": 1}, ".parquet is not read", id="parquet"),
        pytest.param({"file": "a.npy"}, "needs its rate", id="no-rate"),
        pytest.param({"file": "a.npy", "rate_hz": 1, "time": "t"}, "a .npy file", id="npy-time"),
        pytest.param({"file": "../a.csv", "rate_hz": 1}, "stays inside", id="escape"),
        pytest.param(
            {"file": "a.csv", "rate_hz": 1, "columns": ["x"], "shape": [3]}, "1 columns", id="cols"
        ),
    ],
)
def test_a_channel_config_error_names_its_key(channel: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        FIELD.validate_python({"kind": "series", "channels": {"a": channel}})


def test_cutting_needs_whole_samples_of_every_channel() -> None:
    assert "channels.temp has no rate_hz" in _problem(fixed={"seconds": 2})
    channels = {"a": {"file": "a.npy", "rate_hz": 10}}
    with pytest.raises(ValidationError, match=r"0.25 s is not a whole number of samples"):
        FIELD.validate_python({"kind": "series", "channels": channels, "window": {"seconds": 0.25}})
    with pytest.raises(ValidationError, match="not both"):
        FIELD.validate_python(
            {
                "kind": "series",
                "channels": channels,
                "window": {"seconds": 1},
                "fixed": {"seconds": 1},
            }
        )


def test_two_fields_cutting_windows_is_a_config_error(tmp_path: Path) -> None:
    from h5etl.config.spec import Spec
    from h5etl.errors import ConfigError

    channels = {"a": {"file": "a.npy", "rate_hz": 10}}
    field = {"kind": "series", "channels": channels, "window": {"seconds": 1}}
    with pytest.raises((ConfigError, ValidationError), match="only one field may cut windows"):
        Spec.model_validate(
            {
                "name": "x",
                "sources": {"r": {"dir": str(tmp_path), "entries": "folders"}},
                "fields": {"r": field, "q": {**field, "source": "r"}},
            }
        )
