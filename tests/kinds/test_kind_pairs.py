"""Paired image fields (``scale``, ``derive`` with a factor) are stored pixel for pixel aligned.

Padding and cropping centre each field in its own shape; with odd margins the two centrings
disagree by a pixel of the small field, so a pair pads and crops on the small field's grid.
Configs whose pairs cannot line up are refused; so are layouts that put two datasets at one path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image

import h5etl
from h5etl.errors import ConfigError


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _config(root: Path, fields: dict[str, Any], **over: Any) -> Path:
    data = {
        "name": "pairs",
        "pipeline": "superres",
        "sources": {s: {"dir": f"raw/{s}", "glob": "*.png"} for s in ("low", "high")},
        "fields": fields,
        "splits": {"train": 1.0},
        "storage": {"chunk_samples": 2},
        **over,
    }
    if "derive" in str(fields):
        data["sources"] = {"high": {"dir": "raw/high", "glob": "*.png"}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def _aligned(path: Path) -> None:
    """Every stored high pixel (4i + k, 4j + l) is the low pixel (i, j): high is low x4."""
    with h5py.File(path, "r") as handle:
        low, high = handle["train/low"][...], handle["train/high"][...]
    assert len(low) == len(high) > 0
    upscaled = low.repeat(4, axis=2).repeat(4, axis=3)
    np.testing.assert_array_equal(high, upscaled)


@pytest.mark.parametrize(
    ("size", "oversize"),
    [
        pytest.param(49, "reject", id="odd-margin-pad"),  # 64-49 = 15: low pads 7, high 30
        pytest.param(48, "reject", id="even-margin-pad"),
        pytest.param(75, "crop", id="odd-crop"),  # 75-64 = 11: low cuts 5, high 22
    ],
)
def test_a_scaled_pair_is_stored_aligned(tmp_path: Path, size: int, oversize: str) -> None:
    rng = np.random.default_rng(size)
    for i in range(3):
        low = rng.integers(1, 256, (size, size + i, 3), dtype=np.uint8)
        _save(tmp_path / "raw" / "low" / f"s{i}.png", low)
        _save(tmp_path / "raw" / "high" / f"s{i}.png", low.repeat(4, axis=0).repeat(4, axis=1))
    fields = {
        "low": {"kind": "image", "shape": [3, 64, 64], "mode": "RGB"},
        "high": {"kind": "image", "shape": [3, 256, 256], "mode": "RGB",
                 "scale": {"of": "low", "factor": 4}},
    }  # fmt: skip
    report = h5etl.build(
        h5etl.load_spec(_config(tmp_path, fields, pad={"oversize": oversize})), jobs=1
    )
    assert not report.rejects
    assert report.path is not None
    _aligned(report.path)


@pytest.mark.parametrize("size", [196, 300])  # odd low margins; 300 > 256 is cropped
def test_a_derived_pair_is_stored_aligned(tmp_path: Path, size: int) -> None:
    rng = np.random.default_rng(size)
    for i in range(2):
        low = rng.integers(1, 256, (size // 4, size // 4, 3), dtype=np.uint8)
        _save(tmp_path / "raw" / "high" / f"s{i}.png", low.repeat(4, axis=0).repeat(4, axis=1))
    fields = {
        "high": {"kind": "image", "shape": [3, 256, 256], "mode": "RGB"},
        "low": {"kind": "image", "shape": [3, 64, 64], "mode": "RGB",
                "derive": {"from": "high", "resize": "area", "factor": 4}},
    }  # fmt: skip
    report = h5etl.build(
        h5etl.load_spec(_config(tmp_path, fields, pad={"oversize": "crop"})), jobs=1
    )
    assert not report.rejects
    assert report.path is not None
    _aligned(report.path)  # the area mean of a 4x4 block of one value is that value


@pytest.mark.parametrize(
    ("fields", "over", "words"),
    [
        pytest.param(
            {"low": {"kind": "image", "shape": [3, 64, 64], "mode": "RGB"},
             "high": {"kind": "image", "shape": [3, 200, 256], "mode": "RGB",
                      "scale": {"of": "low", "factor": 4}}},
            {},
            "fields.high.shape: must be 4 x low's on each axis ([256, 256]",
            id="scale-shape",
        ),
        pytest.param(
            {"high": {"kind": "image", "shape": [3, 64, 64], "mode": "RGB"},
             "low": {"kind": "image", "shape": [3, 32, 32], "mode": "RGB",
                     "derive": {"from": "high", "factor": 4}}},
            {},
            "fields.low.shape: must be 1/4 of high's on each axis ([16, 16]",
            id="derive-shape",
        ),
        pytest.param(
            {"low": {"kind": "image", "shape": [3, 16, 16], "mode": "RGB"},
             "high": {"kind": "image", "shape": [3, 64, 64], "mode": "RGB",
                      "scale": {"of": "low", "factor": 4}}},
            {"pad": {"oversize": "resize"}},
            "pad.oversize: resize fits the two fields",
            id="resize",
        ),
    ],
)  # fmt: skip
def test_pairs_that_cannot_line_up_are_config_errors(
    tmp_path: Path, fields: dict[str, Any], over: dict[str, Any], words: str
) -> None:
    for source in ("low", "high"):
        (tmp_path / "raw" / source).mkdir(parents=True, exist_ok=True)
    with pytest.raises(ConfigError) as caught:
        h5etl.load_spec(_config(tmp_path, fields, **over))
    assert words in str(caught.value)


def _flat(tmp_path: Path, fields: dict[str, Any], splits: dict[str, float], **over: Any) -> Path:
    sources = {name: {"dir": f"raw/{name}"} for name in fields}
    for name in fields:
        (tmp_path / "raw" / name).mkdir(parents=True, exist_ok=True)
    data = {"name": "flat", "pipeline": "flat", "sources": sources, "fields": fields,
            "splits": splits, **over}  # fmt: skip
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


@pytest.mark.parametrize(
    ("fields", "splits", "words"),
    [
        # x in split hard_test and x_hard in split test: both /x_hard_test (a traceback before)
        pytest.param(["x", "x_hard"], {"hard_test": 0.5, "test": 0.5}, "both at /x_hard_test",
                     id="two-fields"),
        # field source in split sha256_train is the lineage of split train
        pytest.param(["source"], {"sha256_train": 0.5, "train": 0.5},
                     "both at /source_sha256_train", id="lineage"),
    ],
)  # fmt: skip
def test_a_layout_that_puts_two_datasets_at_one_path_is_a_config_error(
    tmp_path: Path, fields: list[str], splits: dict[str, float], words: str
) -> None:
    spec = {n: {"kind": "image", "shape": [1, 8, 8], "mode": "L"} for n in fields}
    with pytest.raises(ConfigError) as caught:
        h5etl.load_spec(_flat(tmp_path, spec, splits))
    assert words in str(caught.value)
    assert "layout" in str(caught.value)


def test_names_that_share_a_diagnostics_entry_are_a_config_error(tmp_path: Path) -> None:
    # /a.b/x and /a/b.x were both /diagnostics/datasets/a.b.x: the build died in finish
    spec = {n: {"kind": "image", "shape": [1, 8, 8], "mode": "L"} for n in ("x", "b.x")}
    path = _flat(tmp_path, spec, {"a": 0.5, "a.b": 0.5}, layout="{split}/{field}")
    with pytest.raises(ConfigError) as caught:
        h5etl.load_spec(path)
    assert "/diagnostics" in str(caught.value)


def test_a_user_attribute_named_layout_is_refused(tmp_path: Path) -> None:
    # it was silently replaced by the layout record
    spec = {"x": {"kind": "image", "shape": [1, 8, 8], "mode": "L"}}
    with pytest.raises(ConfigError) as caught:
        h5etl.load_spec(_flat(tmp_path, spec, {"train": 1.0}, attrs={"layout": "tiles-v2"}))
    assert "reserved" in str(caught.value)


def test_a_mask_field_of_another_size_than_its_image_is_a_config_error(tmp_path: Path) -> None:
    # the build stored them padded apart and preview drew a mask off its image
    for source in ("image", "mask"):
        (tmp_path / "raw" / source).mkdir(parents=True)
    data = {
        "name": "m",
        "sources": {s: {"dir": f"raw/{s}"} for s in ("image", "mask")},
        "fields": {
            "image": {"kind": "image", "shape": [1, 32, 32], "mode": "L"},
            "mask": {"kind": "mask", "shape": [1, 64, 64], "values": [0, 1]},
        },
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data), "utf-8")
    with pytest.raises(ConfigError) as caught:
        h5etl.load_spec(path)
    assert "fields.mask.shape: must have image's height and width [32, 32]" in str(caught.value)
