"""The ``volume`` kind end to end: DICOM series (file names shuffled) with NIfTI label volumes,
16-bit PNG slice folders with ``.npy`` label folders; broken cases of every kind; --jobs 1/2;
check --deep; resume after a kill; the readers. Expectations are the arrays written here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import h5py
import imagecodecs
import numpy as np
import pytest
import yaml

import h5etl
from h5etl.errors import ConfigError
from h5etl.examples.volumes import ct_case, series_affine, write_dicom_series, write_nifti
from h5etl.format import contract as fileformat
from h5etl.testing import Broken, KindContractTests

SHAPE = (16, 16)  # (y, x) of every slice
SPACING = (2.5, 0.8, 0.7)


def names_for(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{v:07x}" for v in rng.permutation(1 << 16)[:n]]


def make_ct(root: Path, cases: int = 6, *, seed: int = 0) -> dict[str, dict[str, Any]]:
    """``raw/ct/case_N/`` DICOM series (shuffled names), ``raw/masks/case_N.nii.gz`` labels;
    returns each case's written arrays and series uid."""
    rng = np.random.default_rng(seed)
    truth: dict[str, dict[str, Any]] = {}
    for index in range(cases):
        name = f"case_{index}"
        slices = int(rng.integers(3, 9))
        volume, labels = ct_case(rng, (slices, *SHAPE))
        uid = write_dicom_series(
            root / "raw/ct" / name, volume, spacing=SPACING, series=name,
            names=names_for(rng, slices),
        )  # fmt: skip
        write_nifti(root / "raw/masks" / f"{name}.nii.gz", labels, affine=series_affine(SPACING))
        truth[name] = {"ct": volume, "mask": labels, "uid": uid}
    return truth


def ct_config(root: Path, **over: Any) -> Path:
    data: dict[str, Any] = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {
            "ct": {"dir": "raw/ct", "entries": "folders"},
            "mask": {"dir": "raw/masks", "glob": "*.nii.gz"},
        },
        "splits": {"train": 0.6, "valid": 0.4},
        "seed": 1,
        "fields": {
            "ct": {"slice_shape": list(SHAPE), **over.pop("ct", {})},
            "mask": {"slice_shape": list(SHAPE), "values": [0, 1, 2], **over.pop("mask", {})},
        },
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        **over,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(h5etl.load_spec(config), **kwargs)


def stored_cases(path: Path) -> dict[str, dict[str, Any]]:
    """Every case of a release by its case name, read with h5py through the layout record."""
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as f:
        layout = fileformat.read_layout(f)
        for split in layout.splits:
            names = f[layout.path(split, "case")].asstr()[...]
            values = {c: f[layout.path(split, c)] for c in ("ct", "mask")}
            offsets = {c: f[fileformat.offsets_path(layout.path(split, c))][...] for c in values}
            extra = {s: f[layout.path(split, f"ct_{s}")][...] for s in ("spacing", "affine")}
            uids = f[layout.path(split, "ct_series_uid")].asstr()[...]
            for i, name in enumerate(names):
                case = {c: values[c][offsets[c][i] : offsets[c][i + 1]] for c in values}
                case.update(
                    split=split, spacing=extra["spacing"][i], affine=extra["affine"][i], uid=uids[i]
                )
                out[str(name)] = case
    return out


def test_dicom_cases_with_nifti_labels_are_stored_as_written(tmp_path: Path) -> None:
    truth = make_ct(tmp_path)
    report = build(ct_config(tmp_path), jobs=1)
    assert report.path is not None
    assert not report.rejects
    got = stored_cases(report.path)
    assert sorted(got) == sorted(truth)
    for name, case in got.items():
        assert case["ct"].dtype == np.int16  # HU at full range
        assert np.array_equal(case["ct"], truth[name]["ct"])
        assert np.array_equal(case["mask"], truth[name]["mask"])
        assert case["spacing"].tolist() == list(SPACING)
        assert case["uid"] == truth[name]["uid"]
        # RAS+: DICOM x and y flip; origin (-100, -120, 0) LPS
        assert np.allclose(case["affine"][:3, 3], [100, 120, 0])
        assert np.allclose(np.diag(case["affine"])[:3], [-0.7, -0.8, 2.5])
    with h5py.File(report.path, "r") as f:
        layout = fileformat.read_layout(f)
        values = f[layout.path("train", "ct")]
        assert values.chunks == (1, 16, 16)  # a slice per chunk, tiles up to 128 px
        assert values.shape[1:] == SHAPE


def test_splits_are_by_case(tmp_path: Path) -> None:
    make_ct(tmp_path, cases=10)
    report = build(ct_config(tmp_path), jobs=1)
    assert report.path is not None
    got = stored_cases(report.path)
    assert {c["split"] for c in got.values()} == {"train", "valid"}
    assert sum(report.samples.values()) == 10  # a sample is a case, never a slice


def test_slice_folders_of_16_bit_pngs_with_npy_label_folders(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    truth = {}
    for index in range(4):
        volume, labels = ct_case(rng, (int(rng.integers(2, 6)), *SHAPE))
        folder = tmp_path / "raw/ct" / f"p{index}"
        folder.mkdir(parents=True)
        for k, plane in enumerate(volume):  # HU + 1024 as 16-bit PNG
            png = imagecodecs.png_encode((plane.astype(np.int32) + 1024).astype(np.uint16))
            (folder / f"img_{k + 1:04d}.png").write_bytes(png)
        (folder / "spacing.json").write_text(json.dumps({"spacing": [3, 1, 1], "intercept": -1024}))
        labels_folder = tmp_path / "raw/masks" / f"p{index}"
        labels_folder.mkdir(parents=True)
        for k, plane in enumerate(labels):
            np.save(labels_folder / f"m{k}.npy", plane)
        truth[f"p{index}"] = (volume, labels)
    config = ct_config(
        tmp_path,
        sources={
            "ct": {"dir": "raw/ct", "entries": "folders"},
            "mask": {"dir": "raw/masks", "entries": "folders"},
        },
    )
    report = build(config, jobs=1)
    assert report.path is not None
    assert not report.rejects
    for name, case in stored_cases(report.path).items():
        assert np.array_equal(case["ct"], truth[name][0])
        assert np.array_equal(case["mask"], truth[name][1])
        assert case["spacing"].tolist() == [3.0, 1.0, 1.0]


def test_broken_cases_of_every_kind_are_rejects_naming_the_file(tmp_path: Path) -> None:
    truth = make_ct(tmp_path, cases=3)
    rng = np.random.default_rng(9)
    volume, labels = ct_case(rng, (6, *SHAPE))
    grid = series_affine()  # the series below have the default spacing and origin
    positions = [0, 2.5, 5, 10, 12.5, 15]
    write_dicom_series(tmp_path / "raw/ct/gap", volume, positions=positions, series="gap")
    write_nifti(tmp_path / "raw/masks/gap.nii.gz", labels, affine=grid)
    write_dicom_series(
        tmp_path / "raw/ct/uneven", volume, positions=[0, 2.5, 5, 7.5, 10, 13.4], series="u"
    )
    write_nifti(tmp_path / "raw/masks/uneven.nii.gz", labels, affine=grid)
    write_dicom_series(tmp_path / "raw/ct/shape", volume, series="shape")
    write_nifti(tmp_path / "raw/masks/shape.nii.gz", labels[:5], affine=grid)  # a slice short
    write_dicom_series(tmp_path / "raw/ct/junk", volume, series="junk")
    (tmp_path / "raw/ct/junk/IM0003.dcm").write_text("not DICOM")
    write_nifti(tmp_path / "raw/masks/junk.nii.gz", labels, affine=grid)
    write_dicom_series(tmp_path / "raw/ct/label", volume, series="label")
    write_nifti(tmp_path / "raw/masks/label.nii.gz", np.where(labels == 2, 7, labels), affine=grid)
    report = build(ct_config(tmp_path), jobs=2)
    assert report.path is not None
    reasons = {(Path(r.path).name, r.reason) for r in report.rejects}
    assert ("gap", "slice_gap") in reasons
    assert ("uneven", "uneven_spacing") in reasons
    assert ("shape.nii.gz", "size_mismatch") in reasons
    assert ("junk", "unreadable") in reasons
    assert ("label.nii.gz", "mask_values") in reasons
    detail = {Path(r.path).name: r.detail for r in report.rejects}
    assert "1 slice missing between 5 mm" in detail["gap"]
    assert "IM0003.dcm" in detail["junk"]  # the case is rejected, naming the bad file
    assert "IM0003.dcm" in detail["junk.nii.gz"]  # and so is its label volume
    assert sorted(stored_cases(report.path)) == sorted(truth)  # the others, untouched


def test_resampling_to_a_spacing_is_an_option(tmp_path: Path) -> None:
    make_ct(tmp_path, cases=2)
    config = ct_config(
        tmp_path, ct={"resample": {"spacing": [5.0, 1.6, 1.4]}, "slice_shape": [8, 8]},
        mask={"slice_shape": [8, 8]},
    )  # fmt: skip
    report = build(config, jobs=1)
    assert report.path is not None
    for case in stored_cases(report.path).values():
        assert case["ct"].shape[1:] == (8, 8)
        assert case["mask"].shape == case["ct"].shape
        assert case["spacing"][1:].tolist() == pytest.approx([1.6, 1.4])
        assert set(np.unique(case["mask"]).tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(
    ("over", "words"),
    [
        pytest.param({"ct": {"slice_shape": None}}, "needs slice_shape", id="no-shape"),
        pytest.param(
            {"mask": {"resample": {"shape": [4, 16, 16]}}}, "resampled as its image", id="resample"
        ),
        pytest.param({"ct": {"form": "nifti"}}, "set entries: files", id="form-entries"),
        pytest.param({"mask": {"slice_shape": [8, 8]}}, "must be ct's slice_shape", id="plane"),
        pytest.param({"mask": {"dtype": "int16"}}, "uint8 or uint16", id="label-dtype"),
    ],
)
def test_config_mistakes_are_one_line_each(
    tmp_path: Path, over: dict[str, Any], words: str
) -> None:
    config = ct_config(tmp_path, **over)
    (tmp_path / "raw/ct").mkdir(parents=True, exist_ok=True)
    (tmp_path / "raw/masks").mkdir(parents=True, exist_ok=True)
    with pytest.raises(ConfigError, match=words):
        h5etl.load_spec(config)


def test_split_statistics_cover_every_voxel(tmp_path: Path) -> None:
    truth = make_ct(tmp_path, cases=4)
    report = build(ct_config(tmp_path, splits={"train": 1.0}), jobs=2)
    assert report.path is not None
    voxels = np.concatenate([c["ct"].ravel() for c in truth.values()]).astype(np.float64)
    labels = np.concatenate([c["mask"].ravel() for c in truth.values()])
    with h5py.File(report.path, "r") as f:
        layout = fileformat.read_layout(f)
        attrs = f[layout.path("train", "ct")].attrs
        assert float(np.ravel(attrs["mean"])[0]) == pytest.approx(voxels.mean(), rel=1e-12)
        assert float(np.ravel(attrs["std"])[0]) == pytest.approx(voxels.std(), rel=1e-12)
        assert float(np.ravel(attrs["min"])[0]) == voxels.min()
        assert int(np.ravel(attrs["count"])[0]) == voxels.size
        mask = f[layout.path("train", "mask")].attrs
        values, counts = np.unique(labels, return_counts=True)
        assert list(mask["histogram_values"]) == values.tolist()
        assert list(mask["histogram_counts"]) == counts.tolist()


def test_workers_import_the_readers_of_the_forms_a_config_can_meet(tmp_path: Path) -> None:
    from h5etl.plan.kind_registry import worker_modules

    (tmp_path / "raw" / "ct").mkdir(parents=True)
    (tmp_path / "raw" / "masks").mkdir()
    named = worker_modules(
        h5etl.load_spec(ct_config(tmp_path, ct={"form": "dicom"}, mask={"form": "nifti"}))
    )
    assert "pydicom" in named
    assert "nibabel" in named
    assert "h5etl.inputs.volumes.slices" not in named
    assert len(named) == len(set(named))
    no_dicom = worker_modules(
        h5etl.load_spec(ct_config(tmp_path, ct={"form": "slices"}, mask={"form": "nifti"}))
    )
    assert "nibabel" in no_dicom
    assert "pydicom" not in no_dicom
    any_form = worker_modules(h5etl.load_spec(ct_config(tmp_path)))  # auto: all three
    assert {
        "h5etl.inputs.volumes.dicom",
        "h5etl.inputs.volumes.nifti",
        "h5etl.inputs.volumes.slices",
    } <= set(any_form)
    assert all(importlib.util.find_spec(m) is not None for m in any_form)


def test_a_0_255_label_volume_reads_as_0_1_as_a_2d_mask_does(tmp_path: Path) -> None:
    # a 0/255 NIfTI mask was a mask_values reject, where a 0/255 PNG mask becomes 0/1
    from h5etl.kinds.mask_values import check_mask

    truth = make_ct(tmp_path, cases=3, seed=4)
    binary = {name: (case["mask"] > 0).astype(np.uint8) for name, case in truth.items()}
    written = {
        "case_0": binary["case_0"],  # 0/1
        "case_1": binary["case_1"] * 255,  # 0/255
        "case_2": binary["case_2"] * 255,  # 0/255 with one stray 1: a reject, as in 2-D
    }
    written["case_2"][-1, 0, 0] = 1
    for name, labels in written.items():
        write_nifti(
            tmp_path / "raw/masks" / f"{name}.nii.gz", labels, affine=series_affine(SPACING)
        )
    config = ct_config(tmp_path, splits={"train": 1.0}, mask={"values": [0, 1]})
    report = build(config, jobs=1)
    assert report.path is not None
    reasons = {(Path(r.path).name, r.reason) for r in report.rejects}
    assert ("case_2.nii.gz", "mask_values") in reasons
    assert {name for name, _ in reasons} <= {"case_2", "case_2.nii.gz"}  # its ct goes too
    stored = stored_cases(report.path)
    assert sorted(stored) == ["case_0", "case_1"]
    for name in ("case_0", "case_1"):
        as_2d = np.stack([check_mask(s, (0, 1), path=name) for s in written[name]])
        assert np.array_equal(stored[name]["mask"], as_2d)
        assert np.array_equal(stored[name]["mask"], binary[name])


@pytest.mark.parametrize(
    ("slabs", "stored"),
    [
        pytest.param([[0, 255], [255, 0]], [[0, 1], [1, 0]], id="0/255 throughout"),
        pytest.param([[0, 1], [1, 0]], [[0, 1], [1, 0]], id="0/1 throughout"),
        pytest.param([[0, 255], [1, 0]], None, id="255 then 1"),
        pytest.param([[0, 1], [255, 0]], None, id="1 then 255"),
        pytest.param([[0, 0], [0, 7]], None, id="a stray label"),
    ],
)
def test_a_label_volume_is_one_form_over_all_its_slabs(
    slabs: list[list[int]], stored: list[list[int]] | None
) -> None:
    from h5etl.errors import RejectError
    from h5etl.kinds.volume import LabelCheck

    check = LabelCheck((0, 1), "case.nii.gz")
    arrays = [np.array(s, dtype=np.uint8).reshape(1, 1, 2) for s in slabs]
    if stored is None:
        with pytest.raises(RejectError, match="not among values") as caught:  # noqa: PT012
            for first, slab in enumerate(arrays):
                check(slab, first=first)
        assert caught.value.reason == "mask_values"
        return
    out = [check(slab, first=first) for first, slab in enumerate(arrays)]
    assert [o.ravel().tolist() for o in out] == stored


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


def read_dicom_volume(folder: Path) -> np.ndarray:
    """A series' HU volume read here with pydicom: slices by z position, rescaled."""
    import pydicom

    slices = [pydicom.dcmread(path) for path in folder.iterdir()]
    slices.sort(key=lambda ds: float(ds.ImagePositionPatient[2]))
    planes = [ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept) for ds in slices]
    return np.stack(planes).astype(np.int16)


class TestVolumeContract(KindContractTests):
    """DICOM series (names shuffled) with NIfTI labels; one file of a series not DICOM."""

    field = "ct"

    def make_raw(self, root: Path) -> Path:
        make_ct(root, cases=6)
        return ct_config(root)

    def break_input(self, root: Path) -> Broken:
        folder = root / "raw" / "ct" / "case_2"
        sorted(folder.iterdir())[1].write_text("not DICOM", encoding="utf-8")
        return Broken("case_2", folder, "unreadable")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        return {case.name: read_dicom_volume(case) for case in (root / "raw" / "ct").iterdir()}
