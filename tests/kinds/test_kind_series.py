"""The ``series`` kind end to end: recordings of .npy and .csv channels written here with
numpy, built through the real pipeline and CLI, read back with h5py (values[offsets[i]:
offsets[i + 1]]) and compared with what numpy wrote; every reject; --jobs; check; resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from conftest import dataset_digests
from typer.testing import CliRunner

import h5etl
from h5etl.check.health import check_release
from h5etl.cli.app import app
from h5etl.testing import Broken, KindContractTests

runner = CliRunner()
ACCEL_HZ, VOLT_HZ = 50, 10  # small rates: tests stay tiny


def _cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def write_recording(
    folder: Path, seconds: int, seed: int, *, prefix: str = "", start: float = 5000.0
) -> dict[str, np.ndarray]:
    """accel.npy (n, 3) float32 at 50 Hz, volts.csv at 10 Hz, temp.csv 1 Hz with times."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    accel = rng.normal(size=(seconds * ACCEL_HZ, 3)).astype(np.float32)
    volts = np.round(rng.uniform(11, 13, seconds * VOLT_HZ), 2)
    times = start + np.arange(seconds, dtype=np.float64)
    temp = np.round(20 + rng.normal(size=seconds), 2)
    np.save(folder / f"{prefix}accel.npy", accel)
    (folder / f"{prefix}volts.csv").write_text("v\n" + "".join(f"{v}\n" for v in volts))
    rows = "".join(f"{t},{c}\n" for t, c in zip(times, temp, strict=True))
    (folder / f"{prefix}temp.csv").write_text("t,celsius\n" + rows)
    return {"accel": accel, "volts": volts.astype(np.float32), "temp": temp, "time": times}


CHANNELS: dict[str, Any] = {
    "accel": {"file": "accel.npy", "rate_hz": ACCEL_HZ, "shape": [3], "units": "m/s^2"},
    "volts": {"file": "volts.csv", "rate_hz": VOLT_HZ, "units": "V"},
    "temp": {"file": "temp.csv", "time": "t", "rate_hz": 1, "dtype": "float64", "units": "degC"},
}


def make_recordings(root: Path, lengths: dict[str, int]) -> dict[str, dict[str, np.ndarray]]:
    return {
        name: write_recording(root / "raw" / "rec" / name, seconds, seed=i)
        for i, (name, seconds) in enumerate(lengths.items())
    }


LENGTHS = {"a": 3, "b": 5, "c": 2, "d": 4, "e": 6, "f": 3}


def series_config(root: Path, **over: Any) -> Path:
    field = {"kind": "series", "channels": CHANNELS, "tolerance_s": 1.0, **over.pop("field", {})}
    data: dict[str, Any] = {
        "name": "vib",
        "pipeline": "series",
        "sources": {"rec": {"dir": "raw/rec", "entries": "folders", **over.pop("source", {})}},
        "splits": over.pop("splits", {"train": 1.0}),
        "seed": 1,
        "fields": {"rec": field, "filename": {"kind": "text"}},
        "storage": {"chunk_samples": 2},
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        **over,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(h5etl.load_spec(config), **kwargs)


def ragged(handle: h5py.File, path: str) -> list[np.ndarray]:
    """Each sample of a ragged column, sliced by its offsets (h5py and numpy only)."""
    values, offsets = handle[path][()], handle[path + "_offsets"][()]
    assert offsets[0] == 0
    assert offsets[-1] == len(values)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def _names(handle: h5py.File, split: str = "train") -> list[str]:
    return [Path(v.decode()).name for v in handle[f"{split}/filename"][()]]


def test_recordings_are_stored_per_channel_as_ragged_columns(tmp_path: Path) -> None:
    expected = make_recordings(tmp_path, LENGTHS)
    report = build(series_config(tmp_path), jobs=1)
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        names = _names(handle)
        assert sorted(names) == sorted(LENGTHS)
        accel, volts = ragged(handle, "train/rec_accel"), ragged(handle, "train/rec_volts")
        temp, times = ragged(handle, "train/rec_temp"), ragged(handle, "train/rec_temp_time")
        for i, name in enumerate(names):
            want = expected[name]
            np.testing.assert_array_equal(accel[i], want["accel"])
            np.testing.assert_array_equal(volts[i], want["volts"])
            np.testing.assert_array_equal(temp[i], want["temp"])
            np.testing.assert_array_equal(times[i], want["time"] - want["time"][0])
            assert handle["train/rec_start_time"][i] == want["time"][0]
        assert handle["train/rec_accel"].shape[1:] == (3,)
        assert handle["train/rec_accel"].dtype == np.float32
        attrs = handle["train/rec_accel"].attrs
        assert (attrs["rate_hz"], attrs["units"], attrs["channel"]) == (50.0, "m/s^2", "accel")
        assert handle["train/rec_volts"].attrs["rate_hz"] == 10.0
        assert handle["train/rec_accel"].compression is not None  # never vlen: filtered
        layout = json.loads(handle.attrs["layout"])
        columns = layout["fields"]["rec"]["columns"]
        assert columns["rec_accel"]["column"] == "ragged"
        assert columns["rec_accel"]["rate_hz"] == 50.0
        every = np.concatenate([want["accel"] for want in expected.values()]).astype(np.float64)
        np.testing.assert_allclose(handle["train/rec_accel"].attrs["mean"], every.mean(axis=0))
        np.testing.assert_allclose(handle["train/rec_accel"].attrs["std"], every.std(axis=0))
    code, output = _cli("check", report.path, "--deep")
    assert code == 0, output


def _listing_sha256(files: list[Path], root: Path) -> str:
    listing = sorted(
        f"{p.relative_to(root) if p.parent == root else p.name}\0"
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}\n"
        for p in files
    )
    return hashlib.sha256("".join(listing).encode()).hexdigest()


def test_lineage_covers_every_channel_file(tmp_path: Path) -> None:
    make_recordings(tmp_path, {"a": 2, "b": 3})
    report = build(series_config(tmp_path), jobs=1)
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        for name, row in zip(_names(handle), handle["train/source_sha256"][()], strict=True):
            folder = tmp_path / "raw" / "rec" / name
            files = [folder / f for f in ("accel.npy", "volts.csv", "temp.csv")]
            assert row[0].decode() == _listing_sha256(files, folder)


def test_a_stem_recording_builds_like_a_folder(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "rec"
    expected = {
        n: write_recording(raw, s, i, prefix=f"{n}_") for i, (n, s) in enumerate(LENGTHS.items())
    }
    channels = {name: {**spec, "file": "_" + spec["file"]} for name, spec in CHANNELS.items()}
    config = series_config(
        tmp_path,
        source={"entries": "files", "glob": "*_accel.npy"},
        field={"recording": "stem", "channels": channels},
    )
    report = build(config, jobs=1)
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        names = [n.removesuffix("_accel.npy") for n in _names(handle)]
        for got, name in zip(ragged(handle, "train/rec_volts"), names, strict=True):
            np.testing.assert_array_equal(got, expected[name]["volts"])
        for name, row in zip(names, handle["train/source_sha256"][()], strict=True):
            files = [raw / f"{name}_{f}" for f in ("accel.npy", "volts.csv", "temp.csv")]
            assert row[0].decode() == _listing_sha256(files, raw)  # every channel, not the first


BROKEN = {
    "nan": ("non_finite", "accel.npy", "nan at sample 70 (1.4 s), component (1,)"),
    "back": ("non_monotonic_timestamps", "temp.csv", "on line 4 comes before"),
    "twice": ("duplicate_timestamp", "temp.csv", "on line 4 repeats line 3"),
    "flat": ("trailing_shape", "accel.npy", "expected (n, 3)"),
    "gone": ("missing_channel", "volts.csv", "channel volts is missing"),
    "short": ("duration_mismatch", "accel.npy", "channel durations differ by 2 s"),
}


def _break(folder: Path, how: str) -> None:
    accel, temp = folder / "accel.npy", folder / "temp.csv"
    if how == "nan":
        values = np.load(accel)
        values[70, 1] = np.nan
        np.save(accel, values)
    elif how == "flat":
        np.save(accel, np.load(accel)[:, :2])
    elif how == "gone":
        (folder / "volts.csv").unlink()
    elif how == "short":
        np.save(accel, np.load(accel)[: 2 * ACCEL_HZ])
    else:
        lines = temp.read_text().splitlines()
        if how == "back":
            lines[2], lines[3] = lines[3], lines[2]
        else:
            lines[3] = lines[2].split(",")[0] + "," + lines[3].split(",")[1]
        temp.write_text("\n".join(lines) + "\n")


def test_every_reject_names_its_file_and_position(tmp_path: Path) -> None:
    make_recordings(tmp_path, {**LENGTHS, **dict.fromkeys(BROKEN, 4)})
    for name in BROKEN:
        _break(tmp_path / "raw" / "rec" / name, name)
    report = build(series_config(tmp_path), jobs=2)
    assert report.path is not None
    assert report.samples == {"train": len(LENGTHS)}
    lines = report.rejects_path.read_text().splitlines() if report.rejects_path else []
    rejects = {Path(r["path"]).name: r for r in map(json.loads, lines)}
    assert set(rejects) == set(BROKEN)
    for name, (reason, file, words) in BROKEN.items():
        assert rejects[name]["reason"] == reason, rejects[name]
        detail = rejects[name]["detail"]
        assert words in detail, detail
        assert str(tmp_path / "raw" / "rec" / name / file) in detail, detail


@pytest.mark.parametrize(
    "cut",
    [
        # ragged recordings (the default): TestSeriesContract (h5etl.testing)
        pytest.param({"fixed": {"seconds": 3}}, id="fixed"),
        pytest.param({"window": {"seconds": 2, "stride": 1}}, id="windows"),
    ],
)
def test_jobs_one_and_two_give_identical_releases(tmp_path: Path, cut: dict[str, Any]) -> None:
    make_recordings(tmp_path, LENGTHS)
    config = series_config(tmp_path, splits={"train": 0.6, "valid": 0.4}, field=cut)
    one, two = build(config, jobs=1), build(config, jobs=2)
    assert one.path is not None
    assert two.path is not None
    assert dataset_digests(one.path) == dataset_digests(two.path)
    report = check_release(two.path, deep=True)
    assert report.ok, report.problems


def test_a_fixed_duration_makes_fixed_arrays_with_lengths(tmp_path: Path) -> None:
    expected = make_recordings(tmp_path, LENGTHS)
    config = series_config(tmp_path, field={"fixed": {"seconds": 4, "fill": -1}})
    report = build(config, jobs=2)
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        accel = handle["train/rec_accel"]
        assert accel.shape == (len(LENGTHS), 4 * ACCEL_HZ, 3)
        assert "train/rec_accel_offsets" not in handle
        for i, name in enumerate(_names(handle)):
            want = expected[name]["accel"][: 4 * ACCEL_HZ]
            np.testing.assert_array_equal(accel[i][: len(want)], want)
            assert (accel[i][len(want) :] == -1).all()
            assert handle["train/rec_accel_length"][i] == len(want)
            assert handle["train/rec_temp_length"][i] == min(LENGTHS[name], 4)
        # statistics over the real samples only, never the padding
        real = np.concatenate([want["accel"][: 4 * ACCEL_HZ] for want in expected.values()])
        np.testing.assert_allclose(accel.attrs["mean"], real.astype(np.float64).mean(axis=0))
        np.testing.assert_allclose(accel.attrs["min"], real.min(axis=0))
    assert check_release(report.path, deep=True).ok


def test_windows_are_samples_with_their_recording_and_offset(tmp_path: Path) -> None:
    expected = make_recordings(tmp_path, LENGTHS)
    config = series_config(
        tmp_path,
        field={"window": {"seconds": 2, "stride": 1}},
        splits={"train": 0.5, "valid": 0.5},
    )
    report = build(config, jobs=2)
    assert report.path is not None
    count = sum(seconds - 1 for seconds in LENGTHS.values())  # windows of 2 s every 1 s
    assert sum(report.samples.values()) == count
    seen: dict[str, str] = {}
    with h5py.File(report.path, "r") as handle:
        for split in ("train", "valid"):
            recordings = [v.decode() for v in handle[f"{split}/rec_recording"][()]]
            offsets = handle[f"{split}/rec_offset"][()]
            accel = handle[f"{split}/rec_accel"][()]
            assert accel.shape[1:] == (2 * ACCEL_HZ, 3)
            for name, offset, values in zip(recordings, offsets, accel, strict=True):
                assert seen.setdefault(name, split) == split  # a recording stays in one split
                start = int(offset) * ACCEL_HZ
                np.testing.assert_array_equal(values, expected[name]["accel"][start : start + 100])
    assert sorted(seen) == sorted(LENGTHS)
    assert check_release(report.path, deep=True).ok


def test_a_dry_run_counts_windows_and_rejects_from_headers(tmp_path: Path) -> None:
    make_recordings(tmp_path, {**LENGTHS, "flat": 4, "tiny": 1})
    _break(tmp_path / "raw" / "rec" / "flat", "flat")
    config = series_config(tmp_path, field={"window": {"seconds": 2, "stride": 2}})
    code, output = _cli("build", config, "--dry-run")
    assert code == 0, output
    assert "trailing_shape" in output
    assert "too_short" in output


def test_a_nan_rejects_only_the_windows_holding_it(tmp_path: Path) -> None:
    make_recordings(tmp_path, {"a": 4, "b": 3})
    accel = tmp_path / "raw" / "rec" / "a" / "accel.npy"
    values = np.load(accel)
    values[2 * ACCEL_HZ + 5, 0] = np.inf  # 2.1 s: in the windows starting at 1 s and 2 s
    np.save(accel, values)
    config = series_config(tmp_path, field={"window": {"seconds": 2, "stride": 1}})
    report = build(config, jobs=1)
    assert report.path is not None
    assert report.samples == {"train": 3 + 2 - 2}
    lines = report.rejects_path.read_text().splitlines() if report.rejects_path else []
    rejects = sorted((r["key"], r["reason"]) for r in map(json.loads, lines))
    assert rejects == [("a@1s", "non_finite"), ("a@2s", "non_finite")]
    detail = json.loads(lines[0])["detail"]
    assert f"inf at sample {2 * ACCEL_HZ + 5} (2.1 s), component (0,)" in detail
    assert str(accel) in detail


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


class TestSeriesContract(KindContractTests):
    """Recordings of three channels; the (n, 3) accelerometer channel read with numpy; a
    recording missing a channel is rejected."""

    field, column = "rec", "rec_accel"

    def make_raw(self, root: Path) -> Path:
        make_recordings(root, LENGTHS)
        return series_config(root)

    def break_input(self, root: Path) -> Broken:
        folder = root / "raw" / "rec" / "c"
        _break(folder, "gone")
        return Broken("c", folder, "missing_channel")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        return {rec.name: np.load(rec / "accel.npy") for rec in (root / "raw" / "rec").iterdir()}
