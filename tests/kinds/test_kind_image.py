"""Image fields of any dtype, end to end: 16-bit grey and RGB PNGs, float TIFFs, int16.

Each test writes tiny raw folders (imagecodecs for 16-bit PNGs, Pillow for mode F TIFFs),
runs the real build or CLI and reads the release with h5py. The expected rows are the arrays
the test wrote, centred and padded here; the expected statistics are exact sums computed here
with ``fractions``, not with h5etl's code.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import h5py
import imagecodecs
import numpy as np
import pytest
import yaml
from conftest import dataset_digests
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.readers import Release, iter_batches
from h5etl.testing import Broken, KindContractTests

SIDE = 16  # the field's H and W; inputs are smaller, so every row has padding
SIZES = ((10, 12), (16, 16), (13, 9), (11, 15))
STATS = ("mean", "std", "min", "max", "count")
runner = CliRunner()


# --- inputs --------------------------------------------------------------------------------


def png16(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(imagecodecs.png_encode(array.astype(np.uint16))))


def tiff_f(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array.astype(np.float32))
    assert image.mode == "F"
    image.save(path, format="TIFF")


def ct_slices(root: Path, n: int = 8, *, rgb: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """16-bit PNGs with CT-like values 66..2090 under root/raw/img; file name -> pixels."""
    rng = np.random.default_rng(seed)
    written = {}
    for i in range(n):
        size = SIZES[i % len(SIZES)]
        array = rng.integers(66, 2091, (*size, 3) if rgb else size, dtype=np.uint16)
        array.flat[0], array.flat[-1] = 66, 2090
        name = f"ct{i:02d}.png"
        png16(root / "raw" / "img" / name, array)
        written[name] = array
    return written


def float_slices(
    root: Path, n: int = 6, *, integral: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    """Mode F TIFFs: fractional values -3.5..1e4 (or integers 0..255) under root/raw/img."""
    rng = np.random.default_rng(seed)
    written = {}
    for i in range(n):
        size = SIZES[i % len(SIZES)]
        if integral:
            array = rng.integers(0, 256, size).astype(np.float32)
        else:
            array = (rng.random(size) * 10000 - 3.5).astype(np.float32)
            array.flat[0] = np.float32(0.1)
        name = f"f{i:02d}.tif"
        tiff_f(root / "raw" / "img" / name, array)
        written[name] = array
    return written


def write_config(root: Path, field: Mapping[str, Any], **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "name": "ct",
        "output": "releases",
        "sources": {"image": {"dir": "raw/img", "glob": "*"}},
        "splits": {"train": 0.5, "valid": 0.5},
        "seed": 3,
        "fields": {"image": {"kind": "image", **field}, "filename": {"kind": "text"}},
        "storage": {"chunk_samples": 2, "compression": "lzf"},
        "pad": {"fill": 0, "oversize": "reject"},
        "on_error": "skip",
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
    }
    config.update(overrides)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
    return path


def grey(dtype: str) -> dict[str, Any]:
    return {"shape": [1, SIDE, SIDE], "dtype": dtype, "mode": "L"}


# --- running and reading -------------------------------------------------------------------


def build(config: Path, jobs: int = 1, **kwargs: Any) -> h5etl.BuildReport:
    report = h5etl.build(load_spec(config), jobs=jobs, **kwargs)
    assert report.path is not None
    return report


def cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def padded(array: np.ndarray, dtype: str, fill: float = 0) -> np.ndarray:
    """The (C, SIDE, SIDE) row of an (h, w[, c]) input: centred, top=(H-h)//2, left=(W-w)//2."""
    chw = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    out = np.full((chw.shape[0], SIDE, SIDE), fill, dtype=dtype)
    top, left = (SIDE - chw.shape[1]) // 2, (SIDE - chw.shape[2]) // 2
    out[:, top : top + chw.shape[1], left : left + chw.shape[2]] = chw
    return out


def rows(path: Path, field: str = "image") -> dict[str, dict[str, np.ndarray]]:
    """split -> file name -> stored row."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            names = [n.decode() for n in handle[f"{split}/filename"][...]]
            data = handle[f"{split}/{field}"][...]
            out[split] = dict(zip(names, data, strict=True))
    return out


def stored_stats(path: Path, field: str = "image") -> dict[str, dict[str, np.ndarray]]:
    with h5py.File(path, "r") as handle:
        return {
            split: {key: handle[f"{split}/{field}"].attrs[key] for key in STATS}
            for split in ("train", "valid")
            if len(handle[f"{split}/{field}"])  # an empty split has no statistics
        }


def arrays(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            for name in ("image", "filename"):
                out[f"{split}/{name}"] = handle[f"{split}/{name}"][...]
    return out


def conversions_attr(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as handle:
        value = handle["diagnostics"].attrs.get("conversions", "{}")
    loaded: dict[str, Any] = json.loads(value)
    return loaded


def assert_rows(path: Path, written: Mapping[str, np.ndarray], dtype: str) -> None:
    found = rows(path)
    stored = {name: row for split in found.values() for name, row in split.items()}
    assert sorted(stored) == sorted(written)
    for name, row in stored.items():
        assert row.dtype == np.dtype(dtype), name
        np.testing.assert_array_equal(row, padded(written[name], dtype), err_msg=name)


def expected_stats(pixels: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per-channel count, mean, population std, min, max of unpadded inputs, exactly."""
    planes = [p[..., None] if p.ndim == 2 else p for p in pixels]
    out: dict[str, list[float]] = {key: [] for key in STATS}
    for c in range(planes[0].shape[2]):
        values = np.concatenate([p[..., c].ravel() for p in planes]).astype(np.float64).tolist()
        exact = [Fraction(v) for v in values]
        n = len(exact)
        mean = sum(exact, Fraction(0)) / n
        variance = sum(((v - mean) ** 2 for v in exact), Fraction(0)) / n
        out["count"].append(n)
        out["mean"].append(float(mean))
        out["std"].append(math.sqrt(variance))
        out["min"].append(min(values))
        out["max"].append(max(values))
    return {key: np.array(value) for key, value in out.items()}


def assert_stats(path: Path, written: Mapping[str, np.ndarray]) -> None:
    found = rows(path)
    assert all(found.values()), "both splits hold samples"
    stored = stored_stats(path)
    for split, names in found.items():
        expected = expected_stats([written[name] for name in names])
        got = stored[split]
        np.testing.assert_array_equal(got["count"], expected["count"])
        np.testing.assert_array_equal(got["mean"], expected["mean"])  # correctly rounded
        np.testing.assert_array_equal(got["min"], expected["min"])
        np.testing.assert_array_equal(got["max"], expected["max"])
        np.testing.assert_allclose(got["std"], expected["std"], rtol=1e-15)


# --- any dtype, nothing lost silently ------------------------------------------------------


def test_uint16_field_stores_sixteen_bit_grey_exactly(tmp_path: Path) -> None:
    written = ct_slices(tmp_path)
    report = build(write_config(tmp_path, grey("uint16")))
    assert report.rejects == []
    assert report.conversions == {}
    assert report.path is not None
    assert conversions_attr(report.path) == {}
    assert_rows(report.path, written, "uint16")


def test_uint8_field_scales_sixteen_bit_and_reports_it_for_any_jobs(tmp_path: Path) -> None:
    written = ct_slices(tmp_path)
    config = write_config(tmp_path, grey("uint8"))
    builds = []
    for jobs in (1, 2):
        code, output = cli("build", config, "--jobs", jobs, "--quiet", "--full")
        assert code == 0, output
        lines = [line for line in output.splitlines() if line.startswith("converted:")]
        assert len(lines) == 1, output
        assert lines[0].startswith("converted: image: 8 16-bit inputs scaled to 8 bits"), lines
        release = tmp_path / "releases" / f"ct-v{jobs:04d}.h5"
        assert conversions_attr(release) == {"image": {"16_to_8_bits": 8}}
        assert_rows(release, {n: (a >> 8).astype(np.uint8) for n, a in written.items()}, "uint8")
        builds.append(release)
    assert dataset_digests(builds[0]) == dataset_digests(builds[1])


def test_sixteen_bit_rgb_into_a_uint16_rgb_field_is_exact(tmp_path: Path) -> None:
    written = ct_slices(tmp_path, rgb=True)
    assert len({a.shape[2] for a in written.values()}) == 1
    report = build(
        write_config(tmp_path, {"shape": [3, SIDE, SIDE], "dtype": "uint16", "mode": "RGB"})
    )
    assert report.rejects == []
    assert report.conversions == {}
    assert report.path is not None
    assert_rows(report.path, written, "uint16")
    assert_stats(report.path, written)


def test_float_tiffs_into_a_float32_field_are_exact(tmp_path: Path) -> None:
    written = float_slices(tmp_path)
    report = build(write_config(tmp_path, grey("float32")))
    assert report.rejects == []
    assert report.conversions == {}
    assert report.path is not None
    assert_rows(report.path, written, "float32")


def test_a_fractional_float_into_uint8_is_a_lossy_conversion_reject(tmp_path: Path) -> None:
    written = float_slices(tmp_path, n=4, integral=True)
    bad = tmp_path / "raw" / "img" / "zz_fraction.tif"
    tiff_f(bad, np.full((5, 6), 0.5, np.float32))
    config = write_config(tmp_path, grey("uint8"))

    code, output = cli("build", config, "--dry-run", "--decode", "--quiet")
    assert code == 0, output
    lines = [line for line in output.splitlines() if line.startswith("reject:")]
    assert len(lines) == 1, output
    assert lines[0].startswith(f"reject: {bad}: lossy_conversion: "), lines
    assert "use a float32 field" in lines[0]

    report = build(config)
    assert [(r.path, r.reason) for r in report.rejects] == [(str(bad), "lossy_conversion")]
    assert report.path is not None
    assert_rows(report.path, {n: a.astype(np.uint8) for n, a in written.items()}, "uint8")


def test_all_inputs_lossy_makes_no_release(tmp_path: Path) -> None:
    float_slices(tmp_path, n=3)
    config = write_config(tmp_path, grey("uint8"))
    code, output = cli("build", config, "--quiet")
    assert code == 1, output
    assert "lossy_conversion 3" in output
    assert not list((tmp_path / "releases").glob("*.h5"))


def test_int16_field_holds_negative_floats_and_rejects_beyond_its_range(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    written: dict[str, np.ndarray] = {}
    folder = tmp_path / "raw" / "img"
    for i in range(4):
        values = rng.integers(-3000, 3001, SIZES[i]).astype(np.float32)
        tiff_f(folder / f"neg{i}.tif", values)
        written[f"neg{i}.tif"] = values.astype(np.int16)
    for i in range(3):
        slice16 = rng.integers(66, 2091, SIZES[i], dtype=np.uint16)
        png16(folder / f"ct{i}.png", slice16)
        written[f"ct{i}.png"] = slice16.astype(np.int16)
    too_high = folder / "zz_high.png"
    png16(too_high, np.full((4, 4), 40000, np.uint16))
    report = build(write_config(tmp_path, grey("int16")))
    assert [(r.path, r.reason) for r in report.rejects] == [(str(too_high), "lossy_conversion")]
    assert "40000" in report.rejects[0].detail
    assert "\n" not in report.rejects[0].detail
    assert report.path is not None
    assert_rows(report.path, written, "int16")
    assert_stats(report.path, written)


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        pytest.param("grey16", grey("uint16"), id="uint16-L"),
        pytest.param(
            "rgb16", {"shape": [3, SIDE, SIDE], "dtype": "uint16", "mode": "RGB"}, id="uint16-RGB"
        ),
        pytest.param("float", grey("float32"), id="float32-L"),
        pytest.param("grey16", grey("uint8"), id="uint8-scaled"),
    ],
)
def test_statistics_cover_unpadded_pixels_and_are_bit_identical_for_any_jobs(
    tmp_path: Path, kind: str, field: dict[str, Any]
) -> None:
    if kind == "float":
        written = float_slices(tmp_path)
    else:
        written = ct_slices(tmp_path, rgb=kind == "rgb16")
    if field["dtype"] == "uint8":
        written = {n: (a >> 8).astype(np.uint8) for n, a in written.items()}
    config = write_config(tmp_path, field)
    one, two = build(config, jobs=1), build(config, jobs=2)
    assert one.path is not None
    assert two.path is not None
    assert_stats(one.path, written)
    first, second = stored_stats(one.path), stored_stats(two.path)
    for split in first:
        for key in STATS:
            assert first[split][key].tobytes() == second[split][key].tobytes(), (split, key)
    assert dataset_digests(one.path) == dataset_digests(two.path)
    for name, array in arrays(one.path).items():
        np.testing.assert_array_equal(array, arrays(two.path)[name], err_msg=name)


def test_check_deep_passes_and_prints_the_statistics(tmp_path: Path) -> None:
    ct_slices(tmp_path)
    report = build(write_config(tmp_path, grey("uint16")))
    code, output = cli("check", "--deep", report.path)
    assert code == 0, output
    assert re.search(r"^  image stats: mean .*, std .*, min 66, max 2090", output, re.M), output
    assert "all SHA-256 digests equal" in output


@pytest.mark.parametrize("dtype", ["uint16", "float32", "int16"])
def test_readers_return_the_field_dtype(tmp_path: Path, dtype: str) -> None:
    written = float_slices(tmp_path) if dtype == "float32" else ct_slices(tmp_path)
    report = build(write_config(tmp_path, grey(dtype)))
    assert report.path is not None
    expected = rows(report.path)["train"]
    release = Release(report.path, "train")
    read = release.read(np.arange(len(release)))
    assert read["image"].dtype == np.dtype(dtype)
    for name, row in zip(read["filename"], read["image"], strict=True):
        np.testing.assert_array_equal(row, padded(written[name], dtype))
    assert release.stats["image"]["max"].tolist() == [
        max(float(written[n].max()) for n in expected)
    ]
    batches = list(iter_batches(report.path, "train", 2, shuffle=False))
    assert all(b["image"].dtype == np.dtype(dtype) for b in batches)
    assert sum(len(b["image"]) for b in batches) == len(expected)


# --- fitting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "dtype"),
    [("L", "uint16"), ("RGB", "uint16"), ("L", "int16"), ("RGB", "float32")],
)
def test_oversize_resize_works_for_every_dtype(tmp_path: Path, mode: str, dtype: str) -> None:
    # pad.oversize: resize ran Pillow on the array as it is: uint16 RGB was a decode_error
    rng = np.random.default_rng(2)
    channels = 3 if mode == "RGB" else 1
    source = rng.integers(66, 2091, (24, 20, 3) if mode == "RGB" else (24, 20), dtype=np.uint16)
    png16(tmp_path / "raw" / "img" / "big.png", source)  # 16-bit: as it is in any of these
    field = {"shape": [channels, SIDE, SIDE], "dtype": dtype, "mode": mode}
    config = write_config(
        tmp_path, field, splits={"train": 1.0}, pad={"fill": 0, "oversize": "resize"}
    )
    report = h5etl.build(load_spec(config), jobs=1)
    assert report.rejects == [], report.rejects
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        row = handle["train/image"][0]
    assert row.dtype == np.dtype(dtype)
    inside = np.argwhere(row.any(axis=0))
    (top, left), (bottom, right) = inside.min(axis=0), inside.max(axis=0) + 1
    height, width = bottom - top, right - left
    assert max(height, width) == SIDE
    assert height > width
    planes = [source] if source.ndim == 2 else [source[..., c] for c in range(3)]
    for c, plane in enumerate(planes):
        resized = np.asarray(
            Image.fromarray(plane.astype(np.float32)).resize(
                (int(width), int(height)), Image.Resampling.LANCZOS
            )
        )
        if dtype != "float32":
            info = np.iinfo(dtype)
            resized = np.clip(np.rint(resized), info.min, info.max)
        np.testing.assert_array_equal(row[c, top:bottom, left:right], resized.astype(dtype))


# --- broken inputs -------------------------------------------------------------------------


def test_broken_sixteen_bit_inputs_are_rejected_and_named(tmp_path: Path) -> None:
    written = ct_slices(tmp_path, n=6)
    folder = tmp_path / "raw" / "img"
    noise = np.random.default_rng(9).integers(66, 2091, (12, 12), dtype=np.uint16)
    data = bytes(imagecodecs.png_encode(noise))
    (folder / "cut_half.png").write_bytes(data[: len(data) // 2])  # the probe sees it
    (folder / "cut_end.png").write_bytes(data[:-40])  # only the decode does
    (folder / "notes.png").write_text("not a PNG\n", encoding="utf-8")
    report = build(write_config(tmp_path, grey("uint16")))
    found = sorted((Path(r.path).name, r.reason) for r in report.rejects)
    assert found == [
        ("cut_end.png", "truncated"),
        ("cut_half.png", "truncated"),
        ("notes.png", "unreadable"),
    ], report.rejects
    assert all("\n" not in r.detail for r in report.rejects)
    assert report.path is not None
    assert_rows(report.path, written, "uint16")
    assert_stats(report.path, written)


def test_a_truncated_sixteen_bit_rgb_png_is_truncated(tmp_path: Path) -> None:
    ct_slices(tmp_path, n=2, rgb=True)
    noise = np.random.default_rng(9).integers(66, 2091, (12, 12, 3), dtype=np.uint16)
    data = bytes(imagecodecs.png_encode(noise))
    cut = tmp_path / "raw" / "img" / "cut_end.png"
    cut.write_bytes(data[:-20])
    field = {"shape": [3, SIDE, SIDE], "dtype": "uint16", "mode": "RGB"}
    report = build(write_config(tmp_path, field))
    assert [(r.path, r.reason) for r in report.rejects] == [(str(cut), "truncated")]


# --- resume after a kill -------------------------------------------------------------------


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


class TestImageContract(KindContractTests):
    """16-bit grey PNGs into a uint16 field, centre-padded; a PNG cut in half is truncated."""

    field = "image"

    def make_raw(self, root: Path) -> Path:
        ct_slices(root, n=8)
        return write_config(root, grey("uint16"))

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "img" / "ct03.png"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return Broken("ct03", path, "truncated")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        return {
            png.stem: padded(imagecodecs.png_decode(png.read_bytes()), "uint16")
            for png in (root / "raw" / "img").glob("*.png")
        }
