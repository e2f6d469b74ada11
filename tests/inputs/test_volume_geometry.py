"""A label volume and its image on one voxel grid (issue 25, item 2): a mask stored in another
voxel order (an axis flipped, its affine saying so) is stored on its image's grid; a mask on
another grid is a ``geometry_mismatch``; ``check`` flags a release whose affines disagree.
Real NIfTI (nibabel) and DICOM (pydicom) files; expectations from the arrays written here."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import h5py
import nibabel
import numpy as np
import pytest
import yaml

import h5etl
from h5etl.check.health import check_release
from h5etl.examples.volumes import AIR, BONE, TISSUE, ct_case, write_dicom_series, write_nifti
from h5etl.format import contract as fileformat
from h5etl.inputs.volumes import orient

SHAPE = (6, 12, 14)  # (z, y, x)
SPACING = (2.5, 0.8, 0.7)
# RAS+, origin anywhere: voxel (x, y, z) -> mm
IMAGE_AFFINE = np.array(
    [[0.7, 0, 0, -40.0], [0, 0.8, 0, 12.0], [0, 0, 2.5, 30.0], [0, 0, 0, 1]], dtype=np.float64
)


def flip_x(affine: np.ndarray, width: int) -> np.ndarray:
    """The affine of the same grid stored with its x axis reversed: voxel x' = width - 1 - x."""
    step = np.array([[-1, 0, 0, width - 1], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], float)
    out: np.ndarray = affine @ step
    return out


NIFTI = {"glob": "*.nii.gz"}
DICOM = {"entries": "folders"}


def config(root: Path, form: dict[str, str] = NIFTI) -> Path:
    data: dict[str, Any] = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {"ct": {"dir": "raw/ct", **form}, "mask": {"dir": "raw/masks", **form}},
        "splits": {"train": 1.0},
        "fields": {
            "ct": {"slice_shape": list(SHAPE[1:])},
            "mask": {"slice_shape": list(SHAPE[1:]), "values": [0, 1, 2]},
        },
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Each case by its key: ct, mask and their affines, as the release holds them."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as f:
        layout = fileformat.read_layout(f)
        names = f[layout.sample_paths("train")[fileformat.SAMPLE_KEY]].asstr()[...]
        for i, name in enumerate(names):
            case = {}
            for field in ("ct", "mask"):
                where = layout.path("train", field)
                offsets = f[fileformat.offsets_path(where)][...]
                case[field] = f[where][offsets[i] : offsets[i + 1]]
                case[f"{field}_affine"] = f[layout.path("train", f"{field}_affine")][i]
            out[str(name)] = case
    return out


def mean_hu(ct: np.ndarray, labels: np.ndarray) -> list[float]:
    return [float(ct[labels == v].mean()) for v in (0, 1, 2)]


@pytest.fixture(scope="module")
def case() -> tuple[np.ndarray, np.ndarray]:
    """An int16 HU volume and its labels, off-centre so that a flip moves every region."""
    volume, labels = ct_case(np.random.default_rng(3), SHAPE)
    assert not np.array_equal(labels[:, :, ::-1], labels)
    return volume, labels


def test_a_nifti_mask_stored_with_x_flipped_is_stored_on_its_images_grid(
    tmp_path: Path, case: tuple[np.ndarray, np.ndarray]
) -> None:
    volume, labels = case
    write_nifti(tmp_path / "raw/ct/a.nii.gz", volume, affine=IMAGE_AFFINE)
    # the same world geometry, x stored reversed, the affine adjusted accordingly
    write_nifti(
        tmp_path / "raw/masks/a.nii.gz",
        labels[:, :, ::-1],
        affine=flip_x(IMAGE_AFFINE, SHAPE[2]),
    )
    report = h5etl.build(h5etl.load_spec(config(tmp_path)), jobs=1)
    assert report.path is not None
    assert not report.rejects
    got = stored(report.path)["a"]
    assert np.array_equal(got["mask"], labels)
    expected = mean_hu(volume, labels)
    assert expected == pytest.approx([AIR, TISSUE, BONE], abs=20)
    assert mean_hu(got["ct"], got["mask"]) == pytest.approx(expected)
    assert np.allclose(got["mask_affine"], got["ct_affine"])
    assert np.allclose(got["ct_affine"], IMAGE_AFFINE)
    assert check_release(report.path).ok


def test_a_dicom_mask_series_with_rows_reversed_is_stored_on_its_images_grid(
    tmp_path: Path, case: tuple[np.ndarray, np.ndarray]
) -> None:
    volume, labels = case
    dx = SPACING[2]
    write_dicom_series(tmp_path / "raw/ct/a", volume, spacing=SPACING, series="ct")
    # rows run right to left (ImageOrientationPatient -1, 0, 0): each plane's columns are
    # reversed and start at the far end; the slice normal flips, so slices sort top down
    width = SHAPE[2]
    write_dicom_series(
        tmp_path / "raw/masks/a",
        labels[:, :, ::-1],
        spacing=SPACING,
        series="mask",
        origin=(-100.0 + (width - 1) * dx, -120.0),
        orientation=(-1, 0, 0, 0, 1, 0),
        intercept=0.0,
    )
    report = h5etl.build(h5etl.load_spec(config(tmp_path, DICOM)), jobs=1)
    assert report.path is not None
    assert not report.rejects, report.rejects
    got = stored(report.path)["a"]
    assert np.array_equal(got["ct"], volume)
    assert np.array_equal(got["mask"], labels)
    assert mean_hu(got["ct"], got["mask"]) == pytest.approx(mean_hu(volume, labels))
    assert np.allclose(got["mask_affine"], got["ct_affine"])


def test_a_mask_on_another_grid_is_a_geometry_mismatch_in_build_and_dry_runs(
    tmp_path: Path, case: tuple[np.ndarray, np.ndarray]
) -> None:
    volume, labels = case
    for name in ("good", "shifted", "flipped"):
        write_nifti(tmp_path / f"raw/ct/{name}.nii.gz", volume, affine=IMAGE_AFFINE)
    write_nifti(tmp_path / "raw/masks/good.nii.gz", labels, affine=IMAGE_AFFINE)
    shifted = IMAGE_AFFINE.copy()
    shifted[:3, 3] += [5.0, 0.0, 0.0]  # 5 mm to the right: a misaligned mask
    write_nifti(tmp_path / "raw/masks/shifted.nii.gz", labels, affine=shifted)
    # x reversed, its affine says so, but its origin was not moved: not the same voxels
    flipped = IMAGE_AFFINE @ np.diag([-1.0, 1.0, 1.0, 1.0])
    write_nifti(tmp_path / "raw/masks/flipped.nii.gz", labels[:, :, ::-1], affine=flipped)
    spec = h5etl.load_spec(config(tmp_path))
    for dry_run, decode in ((True, False), (True, True), (False, False)):
        report = h5etl.build(spec, jobs=1, dry_run=dry_run, decode=decode)
        reasons = {Path(r.path).name: r.reason for r in report.rejects}
        assert reasons == {
            "shifted.nii.gz": "geometry_mismatch",
            "flipped.nii.gz": "geometry_mismatch",
        }, (dry_run, decode)
        detail = {Path(r.path).name: r.detail for r in report.rejects}
        assert "mask RAS" in detail["shifted.nii.gz"]
        assert "origin (-35, 12, 30)" in detail["shifted.nii.gz"]
        assert "mask LAS" in detail["flipped.nii.gz"]
        assert "vs its image ct RAS" in detail["flipped.nii.gz"]
    assert report.path is not None
    assert set(stored(report.path)) == {"good"}


def test_check_flags_a_release_whose_label_affines_are_not_their_images(
    tmp_path: Path, case: tuple[np.ndarray, np.ndarray]
) -> None:
    volume, labels = case
    write_nifti(tmp_path / "raw/ct/a.nii.gz", volume, affine=IMAGE_AFFINE)
    write_nifti(tmp_path / "raw/masks/a.nii.gz", labels, affine=IMAGE_AFFINE)
    report = h5etl.build(h5etl.load_spec(config(tmp_path)), jobs=1)
    assert report.path is not None
    assert check_release(report.path).ok
    # what an older build stored: the mask as it lay, with its own (x-flipped) affine
    with h5py.File(report.path, "r+") as f:
        layout = fileformat.read_layout(f)
        f[layout.path("train", "mask_affine")][0] = flip_x(IMAGE_AFFINE, SHAPE[2])
    found = check_release(report.path)
    assert not found.ok
    assert any(
        "1 of 1 cases lie on another grid than their image ct" in p and "LAS" in p
        for p in found.problems
    ), found.problems


def test_the_flipped_test_file_is_the_same_grid_to_nibabel(
    tmp_path: Path, case: tuple[np.ndarray, np.ndarray]
) -> None:
    # the expectation above checked independently of h5etl: nibabel brings it back itself
    _, labels = case
    path = tmp_path / "m.nii.gz"
    write_nifti(path, labels[:, :, ::-1], affine=flip_x(IMAGE_AFFINE, SHAPE[2]))
    image = nibabel.load(str(path))
    canonical = nibabel.as_closest_canonical(image)
    assert np.allclose(canonical.affine, IMAGE_AFFINE)
    assert np.array_equal(np.asarray(canonical.dataobj).transpose(2, 1, 0), labels)


def test_every_voxel_order_is_brought_back_exactly() -> None:
    # the pure rule, for all 48 axis orders and flips of a (z, y, x) label volume: a voxel
    # stored elsewhere lands where its world position says (the index maps are computed
    # here from np.indices, independently of nibabel)
    labels = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)  # (z, y, x), all distinct
    xyz = labels.transpose(2, 1, 0)
    where = np.indices(xyz.shape)  # (3, x, y, z): each voxel's own (x, y, z) index
    for axes in itertools.permutations(range(3)):
        for flips in itertools.product((False, True), repeat=3):
            moved, index = xyz.transpose(axes), where.transpose(0, *(a + 1 for a in axes))
            for axis, flip in enumerate(flips):
                if flip:
                    moved, index = np.flip(moved, axis), np.flip(index, axis + 1)
            # the stored voxel j holds the image's voxel index[:, j]: an affine map
            step = np.eye(4)
            step[:3, 3] = index[:, 0, 0, 0]
            origin = index[:, 0, 0, 0]
            step[:3, 0] = index[:, 1, 0, 0] - origin
            step[:3, 1] = index[:, 0, 1, 0] - origin
            step[:3, 2] = index[:, 0, 0, 1] - origin
            affine = IMAGE_AFFINE @ step
            stored = np.ascontiguousarray(moved.transpose(2, 1, 0))  # (z, y, x) as filed
            shape = (stored.shape[0], stored.shape[1], stored.shape[2])
            turn = orient.reorientation(affine, shape, IMAGE_AFFINE)
            assert turn is not None
            assert np.array_equal(turn.apply(stored), labels), (axes, flips)
            back = orient.reoriented_affine(affine, turn, shape)
            assert orient.disagreement(back, IMAGE_AFFINE, SPACING) is None


def test_a_degenerate_affine_is_no_voxel_order() -> None:
    flat = IMAGE_AFFINE @ np.diag([0.0, 1.0, 1.0, 1.0])  # an x axis of length 0
    assert orient.reorientation(flat, SHAPE, IMAGE_AFFINE) is None
    assert orient.axis_codes(flat) == "?AS"
    assert orient.disagreement(flat, IMAGE_AFFINE, SPACING) == "orientation"
