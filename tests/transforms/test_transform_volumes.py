"""Transforms on volumes (issue 28): a CT's intensity window (the built-in ``clip``) and a
body crop of the CT and its label volume together, in slices, as the how-to page shows. The
cases are DICOM series with NIfTI labels written here; expectations come from those arrays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml

import h5etl
from h5etl.format import contract as fileformat

pytest.importorskip("pydicom")
pytest.importorskip("nibabel")

from h5etl.examples.volumes import (
    ct_case,
    series_affine,
    write_dicom_series,
    write_nifti,
)

SHAPE = (12, 12)
SPACING = (2.5, 0.8, 0.7)

PREP = '''
import numpy as np


def body_crop(sample, *, margin):
    """The slices that hold the body (label > 0), and margin more each side."""
    inside = np.nonzero(sample["mask"].any(axis=(1, 2)))[0]
    first = max(int(inside.min()) - margin, 0)
    last = int(inside.max()) + margin + 1
    return {name: value[first:last] for name, value in sample.items()}
'''


def make_cases(root: Path, cases: int = 3) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    truth = {}
    for index in range(cases):
        name = f"case_{index}"
        volume, labels = ct_case(rng, (int(rng.integers(6, 10)), *SHAPE))
        labels[:2] = 0  # air above the body: the crop has slices to cut
        write_dicom_series(root / "raw/ct" / name, volume, spacing=SPACING, series=name)
        write_nifti(root / "raw/masks" / f"{name}.nii.gz", labels, affine=series_affine(SPACING))
        truth[name] = (volume, labels)
    return truth


def config(root: Path) -> Path:
    data: dict[str, Any] = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {
            "ct": {"dir": "raw/ct", "entries": "folders"},
            "mask": {"dir": "raw/masks", "glob": "*.nii.gz"},
        },
        "splits": {"train": 1.0},
        "fields": {
            "ct": {
                "slice_shape": list(SHAPE),
                "transform": [{"call": "clip", "args": {"low": -200, "high": 300}}],
            },
            "mask": {"slice_shape": list(SHAPE), "values": [0, 1, 2]},
        },
        "transforms": [{"call": "prep:body_crop", "fields": ["ct", "mask"], "args": {"margin": 1}}],
        "max_rejects": None,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    (root / "prep.py").write_text(PREP)
    return path


def stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as f:
        layout = fileformat.read_layout(f)
        names = f[layout.path("train", "case")].asstr()[...]
        for field in ("ct", "mask"):
            values = f[layout.path("train", field)]
            offsets = f[fileformat.offsets_path(layout.path("train", field))][...]
            for i, name in enumerate(names):
                out.setdefault(str(name), {})[field] = values[offsets[i] : offsets[i + 1]]
    return out


def test_a_ct_window_and_a_body_crop_of_ct_and_labels_together(tmp_path: Path) -> None:
    truth = make_cases(tmp_path)
    report = h5etl.build(h5etl.load_spec(config(tmp_path)), jobs=2)
    assert report.path is not None
    assert not report.rejects
    got = stored(report.path)
    assert sorted(got) == sorted(truth)
    for name, (volume, labels) in truth.items():
        inside = np.nonzero(labels.any(axis=(1, 2)))[0]
        cut = slice(max(int(inside.min()) - 1, 0), int(inside.max()) + 2)
        assert np.array_equal(got[name]["ct"], np.clip(volume, -200, 300)[cut])
        assert np.array_equal(got[name]["mask"], labels[cut])
        assert len(got[name]["ct"]) < len(volume)  # the crop cut slices


def test_the_builtin_resample_is_the_volume_fields_own(tmp_path: Path) -> None:
    """``transform: [{call: resample}]`` stores the voxels ``resample: {shape}`` stores: the
    field's option runs the built-in."""
    pytest.importorskip("scipy")
    make_cases(tmp_path, cases=2)
    path = config(tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["transforms"]
    shape = [5, *SHAPE]
    data["fields"]["ct"] = {"slice_shape": list(SHAPE), "resample": {"shape": shape}}
    data["fields"]["mask"] = {"slice_shape": list(SHAPE), "values": [0, 1, 2]}
    path.write_text(yaml.safe_dump({**data, "output": "option"}))
    option = h5etl.build(h5etl.load_spec(path), jobs=1)
    data["fields"]["ct"] = {
        "slice_shape": list(SHAPE),
        "transform": [{"call": "resample", "args": {"shape": shape}}],
    }
    data["fields"]["mask"]["transform"] = [
        {"call": "resample", "args": {"shape": shape, "labels": True}}
    ]
    path.write_text(yaml.safe_dump({**data, "output": "call"}))
    call = h5etl.build(h5etl.load_spec(path), jobs=1)
    assert option.path is not None
    assert call.path is not None
    by_option, by_call = stored(option.path), stored(call.path)
    for name, case in by_option.items():
        assert case["ct"].shape == (5, *SHAPE)
        assert np.array_equal(case["ct"], by_call[name]["ct"])
        assert np.array_equal(case["mask"], by_call[name]["mask"])
