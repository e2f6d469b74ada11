"""Super-resolution: two image fields of different shapes in one sample, end to end.

``low/`` (64x64) and ``high/`` (256x256) paired by stem with a declared scale, each field with
its own chunks and compression; and ``low`` derived from ``high`` by a named filter when only
high-res files exist. Expected rows are the arrays the test wrote, and Pillow's own resize
of them (``Image.resize`` with the matching ``Image.Resampling``), not h5etl's code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import imagecodecs
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.readers import iter_batches
from h5etl.testing import Broken, KindContractTests

LOW, HIGH, FACTOR = 64, 256, 4
STATS = ("mean", "std", "min", "max", "count")
FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "area": Image.Resampling.BOX,
}
runner = CliRunner()


def smooth(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """An RGB uint8 image with structure (a gradient plus noise), so filters differ."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], 2)
    noise = rng.integers(-40, 41, (height, width, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG")


def write_pairs(
    root: Path, n: int, *, low: bool = True, seed: int = 0
) -> dict[str, dict[str, np.ndarray]]:
    """``n`` stems p00.. with raw/high/<stem>.png (256x256) and, with ``low``, raw/low (64x64)."""
    rng = np.random.default_rng(seed)
    written: dict[str, dict[str, np.ndarray]] = {"low": {}, "high": {}}
    for i in range(n):
        name = f"p{i:02d}.png"
        written["high"][name] = smooth(rng, HIGH, HIGH)
        save(root / "raw" / "high" / name, written["high"][name])
        if low:
            written["low"][name] = smooth(rng, LOW, LOW)
            save(root / "raw" / "low" / name, written["low"][name])
    return written


def paired_fields() -> dict[str, Any]:
    return {
        "low": {
            "kind": "image",
            "shape": [3, LOW, LOW],
            "mode": "RGB",
            "chunks": [4, 3, LOW, LOW],
            "compression": "gzip",
        },
        "high": {
            "kind": "image",
            "shape": [3, HIGH, HIGH],
            "mode": "RGB",
            "scale": {"of": "low", "factor": FACTOR},
            "chunks": [2, 3, HIGH, HIGH],
            "compression": "lzf",
        },
        "filename": {"kind": "text", "source": "high"},
    }


def derived_fields(filter: str, dtype: str = "uint8") -> dict[str, Any]:
    return {
        "high": {"kind": "image", "shape": [3, HIGH, HIGH], "mode": "RGB", "dtype": dtype},
        "low": {
            "kind": "image",
            "shape": [3, LOW, LOW],
            "mode": "RGB",
            "dtype": dtype,
            "derive": {"from": "high", "resize": filter, "factor": FACTOR},
        },
        "filename": {"kind": "text"},
    }


def write_config(root: Path, fields: dict[str, Any], *, low: bool = True) -> Path:
    sources = {"high": {"dir": "raw/high", "glob": "*.png"}}
    if low:
        sources = {"low": {"dir": "raw/low", "glob": "*.png"}, **sources}
    config = {
        "name": "sr",
        "output": "releases",
        "sources": sources,
        "splits": {"train": 0.5, "valid": 0.5},
        "seed": 1,
        "fields": fields,
        "storage": {"chunk_samples": 2, "compression": "lzf"},
        "pad": {"fill": 0, "oversize": "reject"},
        "on_error": "skip",
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
    return path


def build(config: Path, jobs: int = 1, **kwargs: Any) -> Path:
    report = h5etl.build(load_spec(config), jobs=jobs, **kwargs)
    assert report.path is not None
    return report.path


def cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def chw(array: np.ndarray) -> np.ndarray:
    return array.transpose(2, 0, 1)


def stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """field -> file name -> stored row, over both splits."""
    out: dict[str, dict[str, np.ndarray]] = {"low": {}, "high": {}}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            names = [n.decode() for n in handle[f"{split}/filename"][...]]
            for field in out:
                out[field].update(zip(names, handle[f"{split}/{field}"][...], strict=True))
    return out


def everything(path: Path) -> dict[str, Any]:
    """Every dataset's array and statistics attributes, keyed by path."""
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            for field in ("low", "high", "filename"):
                dataset = handle[f"{split}/{field}"]
                out[f"{split}/{field}"] = dataset[...]
                for key in STATS:
                    if key in dataset.attrs:
                        out[f"{split}/{field}@{key}"] = dataset.attrs[key].tobytes()
    return out


def assert_same(one: dict[str, Any], two: dict[str, Any]) -> None:
    assert sorted(one) == sorted(two)
    for key, value in one.items():
        if isinstance(value, bytes):
            assert value == two[key], key
        else:
            np.testing.assert_array_equal(value, two[key], err_msg=key)


def name_of(path: str) -> str:
    return Path(path).name


# --- paired by stem ------------------------------------------------------------------------


def test_pairs_are_stored_exactly_each_with_its_own_chunks_and_compression(
    tmp_path: Path,
) -> None:
    written = write_pairs(tmp_path, 5)
    path = build(write_config(tmp_path, paired_fields()))
    found = stored(path)
    for field, size in (("low", LOW), ("high", HIGH)):
        assert sorted(found[field]) == sorted(written[field])
        for name, row in found[field].items():
            assert row.shape == (3, size, size)
            np.testing.assert_array_equal(row, chw(written[field][name]), err_msg=name)
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            low, high = handle[f"{split}/low"], handle[f"{split}/high"]
            assert (low.chunks, low.compression) == ((4, 3, LOW, LOW), "gzip")
            assert (high.chunks, high.compression) == ((2, 3, HIGH, HIGH), "lzf")


def test_a_pair_off_the_scale_is_rejected_and_the_dry_run_predicts_it(tmp_path: Path) -> None:
    written = write_pairs(tmp_path, 4)
    off = tmp_path / "raw" / "high" / "p01.png"
    save(off, smooth(np.random.default_rng(7), 250, HIGH))
    config = write_config(tmp_path, paired_fields())

    code, output = cli("build", config, "--dry-run", "--quiet")  # header probes only
    assert code == 0, output
    predicted = sorted(line for line in output.splitlines() if line.startswith("reject:"))
    assert f"reject: {off}: scale_mismatch: high is 250x256, expected 4 x low 64x64" in predicted

    report = h5etl.build(load_spec(config), jobs=1)
    assert report.path is not None
    built = [f"reject: {r.path}: {r.reason}: {r.detail}" for r in report.rejects]
    assert [line.split(": ")[:3] for line in sorted(built)] == [
        line.split(": ")[:3] for line in predicted
    ]
    assert next(line for line in built if line.startswith(f"reject: {off}:")) in predicted
    assert {(name_of(r.path), r.reason) for r in report.rejects} == {("p01.png", "scale_mismatch")}
    found = stored(report.path)
    assert sorted(found["high"]) == sorted(set(written["high"]) - {"p01.png"})


# --- derived by a named filter -------------------------------------------------------------


@pytest.mark.parametrize("filter", list(FILTERS))
def test_a_derived_low_field_is_pillows_resize_of_high(tmp_path: Path, filter: str) -> None:
    written = write_pairs(tmp_path, 3, low=False)
    path = build(write_config(tmp_path, derived_fields(filter), low=False))
    found = stored(path)
    assert sorted(found["low"]) == sorted(written["high"])
    for name, high in written["high"].items():
        expected = np.asarray(Image.fromarray(high).resize((LOW, LOW), FILTERS[filter]))
        np.testing.assert_array_equal(found["high"][name], chw(high), err_msg=name)
        np.testing.assert_array_equal(found["low"][name], chw(expected), err_msg=name)
    with h5py.File(path, "r") as handle:
        assert handle["train/low"].attrs["kind"] == "image"


def test_a_uint16_derived_field_resizes_sixteen_bit_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    high = rng.integers(66, 2091, (HIGH, HIGH, 3), dtype=np.uint16)
    folder = tmp_path / "raw" / "high"
    folder.mkdir(parents=True)
    (folder / "p00.png").write_bytes(bytes(imagecodecs.png_encode(high)))
    config = write_config(tmp_path, derived_fields("bicubic", "uint16"), low=False)
    path = build(config)
    planes = [
        np.asarray(
            Image.fromarray(high[..., c].astype(np.float32)).resize(
                (LOW, LOW), Image.Resampling.BICUBIC
            )
        )
        for c in range(3)
    ]
    expected = np.clip(np.rint(np.stack(planes)), 0, 65535).astype(np.uint16)
    row = stored(path)["low"]["p00.png"]
    assert row.dtype == np.uint16
    np.testing.assert_array_equal(row, expected)


def test_a_high_image_not_a_multiple_of_the_factor_is_a_scale_mismatch(tmp_path: Path) -> None:
    write_pairs(tmp_path, 3, low=False)
    odd = tmp_path / "raw" / "high" / "p09.png"
    save(odd, smooth(np.random.default_rng(8), 254, HIGH))
    report = h5etl.build(load_spec(write_config(tmp_path, derived_fields("area"), low=False)))
    assert [(r.path, r.reason) for r in report.rejects] == [(str(odd), "scale_mismatch")]
    assert "254x256" in report.rejects[0].detail
    assert "factor 4" in report.rejects[0].detail


def test_a_uint8_field_derived_from_uint16_is_scaled_and_reported(tmp_path: Path) -> None:
    # the resized uint16 values were cast with astype: 29664 became 224 (mod 256), silently
    rng = np.random.default_rng(4)
    folder = tmp_path / "raw" / "high"
    folder.mkdir(parents=True)
    written = {}
    for i in range(3):
        high = rng.integers(0, 65536, (HIGH, HIGH, 3), dtype=np.uint16)
        (folder / f"p{i:02d}.png").write_bytes(bytes(imagecodecs.png_encode(high)))
        written[f"p{i:02d}.png"] = high
    fields = derived_fields("area", "uint16")
    fields["low"]["dtype"] = "uint8"
    report = h5etl.build(load_spec(write_config(tmp_path, fields, low=False)), jobs=1)
    assert report.rejects == []
    assert report.conversions == {"low": {"16_to_8_bits": 3}}
    assert report.path is not None
    found = stored(report.path)
    for name, high in written.items():
        planes = [
            np.asarray(
                Image.fromarray(high[..., c].astype(np.float32)).resize(
                    (LOW, LOW), Image.Resampling.BOX
                )
            )
            for c in range(3)
        ]
        resized = np.clip(np.rint(np.stack(planes)), 0, 65535).astype(np.uint16)
        np.testing.assert_array_equal(found["low"][name], (resized >> 8).astype(np.uint8))


def grey_derived(tmp_path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Build ``low`` (mode L) derived from RGB ``high``: stored rows, and Pillow's luma of
    Pillow's resize of each high image."""
    written = write_pairs(tmp_path, 3, low=False)
    fields = derived_fields("bicubic")
    fields["low"].update({"mode": "L", "shape": [1, LOW, LOW]})
    found = stored(build(write_config(tmp_path, fields, low=False)))["low"]
    expected = {
        name: np.asarray(
            Image.fromarray(high).resize((LOW, LOW), Image.Resampling.BICUBIC).convert("L")
        )
        for name, high in written["high"].items()
    }
    return found, expected


def test_a_grey_field_derived_from_rgb_is_the_luma_of_the_resize(tmp_path: Path) -> None:
    # an RGB source into an L derived field crashed the build (3 channels into 1)
    found, expected = grey_derived(tmp_path)
    assert sorted(found) == sorted(expected)
    for name, grey in expected.items():
        assert found[name].shape == (1, LOW, LOW)
        difference = found[name][0].astype(int) - grey
        assert np.abs(difference).max() <= 1, name


def test_a_grey_field_derived_from_rgb_is_exactly_pillows_luma(tmp_path: Path) -> None:
    found, expected = grey_derived(tmp_path)
    for name, grey in expected.items():
        np.testing.assert_array_equal(found[name][0], grey, err_msg=name)


def test_a_derive_reject_names_the_file_it_derives_from(tmp_path: Path) -> None:
    # the reject named the sample's first file, here another source's
    rng = np.random.default_rng(6)
    for i in range(3):
        save(tmp_path / "raw" / "side" / f"p{i:02d}.png", smooth(rng, 20, 20))
        size = 254 if i == 1 else HIGH
        save(tmp_path / "raw" / "high" / f"p{i:02d}.png", smooth(rng, size, HIGH))
    fields = {"side": {"kind": "image", "shape": [3, 20, 20], "mode": "RGB"}}
    fields.update(derived_fields("nearest"))
    config = write_config(tmp_path, fields, low=False)
    data = yaml.safe_load(config.read_text("utf-8"))
    data["sources"] = {"side": {"dir": "raw/side", "glob": "*.png"}, **data["sources"]}
    config.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    report = h5etl.build(load_spec(config), jobs=1)
    odd = tmp_path / "raw" / "high" / "p01.png"
    primary = [r for r in report.rejects if "(in " not in r.detail]
    assert [(r.path, r.reason) for r in primary] == [(str(odd), "scale_mismatch")]
    assert {name_of(r.path) for r in report.rejects} == {"p01.png"}


# --- readers -------------------------------------------------------------------------------


def test_numpy_batches_hold_both_shapes(tmp_path: Path) -> None:
    written = write_pairs(tmp_path, 6)
    path = build(write_config(tmp_path, paired_fields()))
    seen = 0
    for split in ("train", "valid"):
        for batch in iter_batches(path, split, 2, shuffle=False):
            assert batch["low"].shape == (len(batch["filename"]), 3, LOW, LOW)
            assert batch["high"].shape == (len(batch["filename"]), 3, HIGH, HIGH)
            for name, low, high in zip(batch["filename"], batch["low"], batch["high"], strict=True):
                np.testing.assert_array_equal(low, chw(written["low"][name]))
                np.testing.assert_array_equal(high, chw(written["high"][name]))
                seen += 1
    assert seen == 6


def test_torch_batches_hold_both_shapes(tmp_path: Path) -> None:
    data = pytest.importorskip("torch.utils.data")
    from h5etl.readers import H5Dataset

    written = write_pairs(tmp_path, 6)
    path = build(write_config(tmp_path, paired_fields()))
    with H5Dataset(path, "train") as dataset:
        loader = data.DataLoader(dataset, batch_size=2, num_workers=0)
        batches = list(loader)
    assert batches
    for batch in batches:
        count = len(batch["filename"])
        assert tuple(batch["low"].shape) == (count, 3, LOW, LOW)
        assert tuple(batch["high"].shape) == (count, 3, HIGH, HIGH)
        for name, high in zip(batch["filename"], batch["high"], strict=True):
            np.testing.assert_array_equal(high.numpy(), chw(written["high"][name]))


# --- determinism, check, broken inputs, resume ---------------------------------------------


def test_broken_high_and_low_inputs_are_rejected(tmp_path: Path) -> None:
    written = write_pairs(tmp_path, 4)
    (tmp_path / "raw" / "high" / "p01.png").write_text("not an image\n", encoding="utf-8")
    data = (tmp_path / "raw" / "low" / "p02.png").read_bytes()
    (tmp_path / "raw" / "low" / "p02.png").write_bytes(data[: len(data) // 2])
    report = h5etl.build(load_spec(write_config(tmp_path, paired_fields())))
    reasons = {(Path(r.path).parent.name, name_of(r.path), r.reason) for r in report.rejects}
    assert ("high", "p01.png", "unreadable") in reasons
    assert ("low", "p02.png", "truncated") in reasons
    assert {name for _, name, _ in reasons} == {"p01.png", "p02.png"}
    assert report.path is not None
    found = stored(report.path)
    assert sorted(found["high"]) == sorted(set(written["high"]) - {"p01.png", "p02.png"})


def test_a_broken_high_image_rejects_its_derived_sample(tmp_path: Path) -> None:
    write_pairs(tmp_path, 3, low=False)
    broken = tmp_path / "raw" / "high" / "p05.png"
    broken.write_text("not an image\n", encoding="utf-8")
    report = h5etl.build(load_spec(write_config(tmp_path, derived_fields("bicubic"), low=False)))
    assert [(r.path, r.reason) for r in report.rejects] == [(str(broken), "unreadable")]


def test_check_deep_prints_both_fields_statistics(tmp_path: Path) -> None:
    # --jobs 1 = 2, check --deep passing and resume: Test*ImagesContract (h5etl.testing)
    write_pairs(tmp_path, 4)
    code, output = cli("check", "--deep", build(write_config(tmp_path, paired_fields())))
    assert code == 0, output
    assert "low stats: mean" in output
    assert "high stats: mean" in output


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


def read_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


class TestPairedImagesContract(KindContractTests):
    """Low and high images paired by stem, each field its own chunks and compression; the
    high field under test; a low image cut in half rejects its pair."""

    field = "high"

    def make_raw(self, root: Path) -> Path:
        write_pairs(root, 6)
        return write_config(root, paired_fields())

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "low" / "p02.png"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return Broken("p02", path, "truncated")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        return {png.stem: chw(read_rgb(png)) for png in (root / "raw" / "high").glob("*.png")}


class TestDerivedImageContract(KindContractTests):
    """A low field derived from each high image by Pillow's box filter (``area``); a high
    image that is not a PNG rejects its sample."""

    field = "low"

    def make_raw(self, root: Path) -> Path:
        write_pairs(root, 6, low=False)
        return write_config(root, derived_fields("area"), low=False)

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "high" / "p02.png"
        path.write_text("not an image\n", encoding="utf-8")
        return Broken("p02", path, "unreadable")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        return {
            png.stem: chw(
                np.asarray(Image.fromarray(read_rgb(png)).resize((LOW, LOW), FILTERS["area"]))
            )
            for png in (root / "raw" / "high").glob("*.png")
        }
