"""h5etl.inputs.volumes: DICOM series, NIfTI files and slice folders read against what was written.

The expectations are the numpy arrays the tests wrote (through pydicom, nibabel, imagecodecs
and numpy directly), never the product's own decoding.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import imagecodecs
import nibabel
import numpy as np
import pydicom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from h5etl.errors import RejectError
from h5etl.examples.volumes import ct_case, write_dicom_series
from h5etl.inputs.volumes import cast_exact, open_case


@pytest.fixture
def volume() -> np.ndarray:
    return ct_case(np.random.default_rng(3), (8, 16, 12))[0]


def shuffled_names(n: int, seed: int = 0) -> list[str]:
    # names whose order is not the slices' order: sorting by name would scramble the volume
    return [f"{v:06x}" for v in np.random.default_rng(seed).permutation(4096)[:n]]


def rejected(path: Path, form: str = "auto") -> RejectError:
    with pytest.raises(RejectError) as caught:
        open_case(str(path), form).read("int16")  # type: ignore[arg-type]
    return caught.value


def test_dicom_slices_are_ordered_by_position_not_by_file_name(
    tmp_path: Path, volume: np.ndarray
) -> None:
    uid = write_dicom_series(
        tmp_path / "s", volume, spacing=(2.5, 0.7, 0.9), names=shuffled_names(8)
    )
    case = open_case(str(tmp_path / "s"))
    assert np.array_equal(case.read("int16"), volume)
    assert case.header.spacing == (2.5, 0.7, 0.9)
    assert case.header.series_uid == uid
    # RAS+: DICOM's x (L) and y (P) flip; columns step 0.9 mm along x, rows 0.7 mm along y
    expected = np.array([[-0.9, 0, 0, 100.0], [0, -0.7, 0, 120.0], [0, 0, 2.5, 0.0], [0, 0, 0, 1]])
    assert np.allclose(case.header.affine, expected)


def test_dicom_rescale_slope_and_intercept_give_hounsfield_units(
    tmp_path: Path, volume: np.ndarray
) -> None:
    even = (volume // 2) * 2  # slope 2 stores every other HU exactly
    write_dicom_series(tmp_path / "s", even, slope=2.0, intercept=-2048.0)
    raw = pydicom.dcmread(tmp_path / "s" / "IM0000.dcm").pixel_array
    assert raw.dtype == np.uint16  # stored unsigned: the values are the rescale's doing
    assert np.array_equal(open_case(str(tmp_path / "s")).read("int16"), even)


def test_an_oblique_series_is_ordered_along_its_own_normal(tmp_path: Path) -> None:
    # a sagittal series: rows along y, columns along -z; the normal is -x
    planes = np.arange(4 * 6 * 5, dtype=np.int16).reshape(4, 6, 5)
    folder = tmp_path / "sag"
    write_dicom_series(folder, planes, names=shuffled_names(4, seed=2))
    for k, name in enumerate(sorted(folder.iterdir())):
        ds = pydicom.dcmread(name)
        ds.ImageOrientationPatient = [0, 1, 0, 0, 0, -1]
        ds.ImagePositionPatient = [-3.0 * int(ds.InstanceNumber), 10.0, 20.0 + k]
        ds.save_as(name)
    case = open_case(str(folder))
    assert np.array_equal(case.read("int16"), planes)  # InstanceNumber order = along -x
    assert case.header.spacing[0] == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("positions", "reason", "words"),
    [
        pytest.param([0, 2.5, 5, 10, 12.5], "slice_gap", "1 slice missing between 5 mm", id="gap"),
        pytest.param([0, 2, 4, 10, 12], "slice_gap", "2 slices missing", id="two-missing"),
        pytest.param([0, 2.5, 5, 8.5, 11], "uneven_spacing", "3.5 mm between 5 mm", id="uneven"),
        pytest.param([0, 2.5, 2.5, 5, 7.5], "duplicate_slice", "two slices at 2.5 mm", id="dup"),
    ],
)
def test_a_missing_or_uneven_slice_is_a_reject_naming_the_gap(
    tmp_path: Path, volume: np.ndarray, positions: list[float], reason: str, words: str
) -> None:
    write_dicom_series(tmp_path / "s", volume[:5], positions=positions, names=shuffled_names(5))
    error = rejected(tmp_path / "s")
    assert error.reason == reason
    assert words in error.message
    assert str(error.path) == str(tmp_path / "s")


def test_two_series_in_one_folder_are_a_mixed_series_reject(
    tmp_path: Path, volume: np.ndarray
) -> None:
    write_dicom_series(tmp_path / "s", volume[:3], series="a")
    write_dicom_series(tmp_path / "s", volume[3:6], series="b", names=["x1", "x2", "x3"])
    error = rejected(tmp_path / "s")
    assert error.reason == "mixed_series"
    assert "(3 files)" in error.message


@pytest.mark.parametrize("damage", ["text", "truncated"])
def test_an_unreadable_slice_file_is_a_reject_naming_it(
    tmp_path: Path, volume: np.ndarray, damage: str
) -> None:
    write_dicom_series(tmp_path / "s", volume[:4])
    victim = tmp_path / "s" / "IM0002.dcm"
    if damage == "text":
        victim.write_text("not DICOM\n")
    else:
        victim.write_bytes(victim.read_bytes()[:-100])
    error = rejected(tmp_path / "s")
    assert str(error.path) == str(victim)
    assert error.reason in {"unreadable", "decode_error"}


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_nifti_is_stored_z_y_x_with_its_affine(
    tmp_path: Path, volume: np.ndarray, suffix: str
) -> None:
    affine = np.array([[0, 0, 2.5, -40], [0, -0.8, 0, 30], [0.7, 0, 0, 5], [0, 0, 0, 1]])
    path = tmp_path / f"case{suffix}"
    nibabel.save(nibabel.Nifti1Image(volume.transpose(2, 1, 0), affine), str(path))
    case = open_case(str(path))
    assert np.array_equal(case.read("int16"), volume)
    loaded = nibabel.load(str(path))
    assert np.allclose(case.header.affine, loaded.affine)
    z, y, x = (
        loaded.header.get_zooms()[2],
        loaded.header.get_zooms()[1],
        loaded.header.get_zooms()[0],
    )
    assert case.header.spacing == pytest.approx((z, y, x))


def test_nifti_scaling_is_applied(tmp_path: Path, volume: np.ndarray) -> None:
    image = nibabel.Nifti1Image((volume + 1024).astype(np.uint16).transpose(2, 1, 0), np.eye(4))
    image.header.set_slope_inter(1.0, -1024.0)
    nibabel.save(image, str(tmp_path / "c.nii.gz"))
    expected = np.asarray(nibabel.load(str(tmp_path / "c.nii.gz")).get_fdata()).transpose(2, 1, 0)
    assert np.array_equal(open_case(str(tmp_path / "c.nii.gz")).read("int16"), expected)


def test_a_4d_or_truncated_nifti_is_a_reject(tmp_path: Path, volume: np.ndarray) -> None:
    four = np.stack([volume, volume], axis=-1).transpose(2, 1, 0, 3)
    nibabel.save(nibabel.Nifti1Image(four, np.eye(4)), str(tmp_path / "t.nii"))
    assert rejected(tmp_path / "t.nii").reason == "unsupported"
    nibabel.save(nibabel.Nifti1Image(volume.transpose(2, 1, 0), np.eye(4)), str(tmp_path / "c.nii"))
    data = (tmp_path / "c.nii").read_bytes()
    (tmp_path / "cut.nii").write_bytes(data[: len(data) - 50])
    assert rejected(tmp_path / "cut.nii").reason == "truncated"
    (tmp_path / "cut.nii.gz").write_bytes(gzip.compress(data)[:-40])
    assert rejected(tmp_path / "cut.nii.gz").reason in {"truncated", "unreadable"}
    (tmp_path / "junk.nii").write_bytes(b"\0" * 600)
    assert rejected(tmp_path / "junk.nii").reason == "unreadable"


def write_png_slices(folder: Path, planes: np.ndarray, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for plane, name in zip(planes, names, strict=True):
        (folder / name).write_bytes(imagecodecs.png_encode(plane))


def test_sixteen_bit_png_slices_with_a_sidecar(tmp_path: Path, volume: np.ndarray) -> None:
    stored = (volume.astype(np.int32) + 1024).astype(np.uint16)  # HU + 1024, as exported
    names = [f"s{k}.png" for k in (10, 11, 12, 13, 14, 15, 16, 17)]
    write_png_slices(tmp_path / "c", stored, names[::-1][::-1])
    (tmp_path / "c" / "spacing.json").write_text(
        json.dumps({"spacing": [3, 0.5, 0.5], "intercept": -1024})
    )
    case = open_case(str(tmp_path / "c"))
    assert case.header.form == "slices"
    assert np.array_equal(case.read("int16"), volume)
    assert case.header.spacing == (3.0, 0.5, 0.5)


def test_npy_slices_in_the_order_the_sidecar_lists(tmp_path: Path, volume: np.ndarray) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    names = [f"{name}.npy" for name in ("top", "mid", "low", "a", "b", "c", "d", "e")]
    for plane, name in zip(volume, names, strict=True):
        np.save(folder / name, plane)
    (folder / "spacing.json").write_text(json.dumps({"spacing": [1, 1, 1], "slices": names}))
    assert np.array_equal(open_case(str(folder)).read("int16"), volume)


@pytest.mark.parametrize(
    ("names", "sidecar", "reason", "words"),
    [
        pytest.param(["s0.png", "s1.png", "s3.png"], {}, "slice_gap", "no slice 2", id="gap"),
        pytest.param(["a0.png", "b0.png"], {}, "duplicate_slice", "both are slice 0", id="dup"),
        pytest.param(["top.png", "s1.png"], {}, "unordered_slices", "no number", id="unnumbered"),
        pytest.param(["s0.png"], {"spacing": [1, 0]}, "bad_sidecar", "[z, y, x]", id="spacing"),
        pytest.param(
            ["s0.png"], {"spacing": [1, 1, 1], "zoom": 2}, "bad_sidecar", "zoom", id="key"
        ),
    ],
)
def test_broken_slice_folders_are_rejects(
    tmp_path: Path, names: list[str], sidecar: dict[str, object], reason: str, words: str
) -> None:
    planes = np.zeros((len(names), 4, 4), dtype=np.uint16)
    write_png_slices(tmp_path / "c", planes, names)
    if sidecar:
        (tmp_path / "c" / "spacing.json").write_text(json.dumps(sidecar))
    error = rejected(tmp_path / "c")
    assert error.reason == reason
    assert words in error.message


def test_a_slice_of_another_size_is_a_reject_naming_it(tmp_path: Path) -> None:
    write_png_slices(tmp_path / "c", np.zeros((2, 4, 4), np.uint8), ["s0.png", "s1.png"])
    (tmp_path / "c" / "s2.png").write_bytes(imagecodecs.png_encode(np.zeros((4, 5), np.uint8)))
    error = rejected(tmp_path / "c")
    assert error.reason == "inconsistent_series"
    assert str(error.path).endswith("s2.png")


def test_a_mask_folder_without_sidecar_has_no_geometry(tmp_path: Path) -> None:
    write_png_slices(tmp_path / "m", np.ones((2, 4, 4), np.uint8), ["m0.png", "m1.png"])
    case = open_case(str(tmp_path / "m"))
    assert not case.header.geometry_known
    assert np.array_equal(case.read("uint8"), np.ones((2, 4, 4), np.uint8))


def test_the_digest_covers_every_file_of_the_case(tmp_path: Path, volume: np.ndarray) -> None:
    write_dicom_series(tmp_path / "s", volume[:3])
    first = open_case(str(tmp_path / "s"))
    first.read("int16")
    ds = pydicom.dcmread(tmp_path / "s" / "IM0001.dcm")
    ds.PatientName = "changed"
    ds.save_as(tmp_path / "s" / "IM0001.dcm")
    second = open_case(str(tmp_path / "s"))
    second.read("int16")
    assert first.digest() != second.digest()
    assert len(first.digest()) == 64


@settings(max_examples=60, deadline=None)
@given(
    values=hnp.arrays(np.int64, st.integers(1, 20), elements=st.integers(-40000, 40000)),
    dtype=st.sampled_from(["uint8", "uint16", "int16", "float32"]),
)
def test_cast_is_exact_or_a_lossy_conversion_reject(values: np.ndarray, dtype: str) -> None:
    info = np.iinfo(dtype) if dtype != "float32" else None
    fits = info is None or (info.min <= values.min() and values.max() <= info.max)
    if fits:
        cast = cast_exact(values, dtype, where="x")
        assert cast.dtype == np.dtype(dtype)
        assert np.array_equal(cast.astype(np.int64), values)
    else:
        with pytest.raises(RejectError) as caught:
            cast_exact(values, dtype, where="x")
        assert caught.value.reason == "lossy_conversion"


def test_a_fraction_into_an_integer_dtype_is_a_lossy_conversion() -> None:
    with pytest.raises(RejectError, match=r"not all integers.*use dtype float32"):
        cast_exact(np.array([0.5, 1.0]), "int16", where="x")
    with pytest.raises(RejectError, match=r"use dtype int16"):
        cast_exact(np.array([-5, 300]), "uint8", where="x")


def test_a_missing_medical_library_is_one_line_naming_the_extra(
    tmp_path: Path, volume: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    real = importlib.import_module

    def without_pydicom(name: str, *args: object) -> object:
        if name == "pydicom":
            raise ImportError("No module named 'pydicom'")
        return real(name, *args)  # type: ignore[arg-type]

    write_dicom_series(tmp_path / "s", volume[:2])
    monkeypatch.setattr(importlib, "import_module", without_pydicom)
    error = rejected(tmp_path / "s")
    assert error.reason == "missing_dependency"
    assert "pip install 'h5etl[medical]'" in error.message


def test_signed_dicom_pixels_below_the_intercept(tmp_path: Path) -> None:
    planes = np.full((2, 4, 4), -1030, dtype=np.int16)  # below -1024: stored signed
    write_dicom_series(tmp_path / "s", planes)
    assert pydicom.dcmread(tmp_path / "s" / "IM0000.dcm").PixelRepresentation == 1
    assert np.array_equal(open_case(str(tmp_path / "s")).read("int16"), planes)
