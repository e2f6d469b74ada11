"""CT-like volumes in every form a case comes in: DICOM series (pydicom), NIfTI (nibabel),
folders of 16-bit PNG or ``.npy`` slices with a spacing sidecar; and the ``ct-volumes``
example built from them. The writers are public: the tests make their cases with them and
compare what a build stores with the arrays they wrote."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from h5etl.examples import draw
from h5etl.examples.registry import Broken, register

AIR, TISSUE, BONE = -1000, 40, 1200  # Hounsfield units
Spacing = tuple[float, float, float]  # (z, y, x) mm


def ct_case(
    rng: np.random.Generator, shape: tuple[int, int, int] = (8, 16, 16)
) -> tuple[np.ndarray, np.ndarray]:
    """An int16 (z, y, x) volume in HU (air, soft tissue, a bone) and its 0/1/2 labels."""
    z, y, x = shape
    zz, yy, xx = np.meshgrid(
        np.linspace(-1, 1, z), np.linspace(-1, 1, y), np.linspace(-1, 1, x), indexing="ij"
    )
    centre = rng.uniform(-0.15, 0.15, size=3)
    body = (zz / 1.1) ** 2 + ((yy - centre[1]) / 0.8) ** 2 + ((xx - centre[2]) / 0.7) ** 2 < 1
    bone = (zz - centre[0]) ** 2 + ((yy - centre[1]) / 0.3) ** 2 + (xx / 0.25) ** 2 < 0.3
    labels = body.astype(np.uint8) + (bone & body).astype(np.uint8)
    hu = np.choose(labels, [AIR, TISSUE, BONE]).astype(np.float64)
    hu += np.where(body, rng.normal(0, 20, size=shape), rng.normal(0, 5, size=shape))
    return np.rint(hu).astype(np.int16), labels


def write_dicom_series(
    folder: Path,
    volume: np.ndarray,
    *,
    spacing: Spacing = (2.5, 0.8, 0.8),
    positions: Sequence[float] | None = None,
    origin: tuple[float, float] = (-100.0, -120.0),
    intercept: float = -1024.0,
    slope: float = 1.0,
    series: str = "1",
    names: Sequence[str] | None = None,
    first: int = 0,
    orientation: Sequence[float] = (1, 0, 0, 0, 1, 0),
) -> str:
    """One CT slice file per z of ``volume`` (HU), stored as ``(hu - intercept) / slope``
    unsigned; ``positions`` (mm along z) default to ``spacing[0]`` apart. ``first``: the
    slice number of ``volume[0]`` (to write a series a slice at a time); ``orientation``:
    ImageOrientationPatient. Returns the SeriesInstanceUID."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    series_uid = generate_uid(entropy_srcs=["h5etl", series])
    where = positions or [(first + k) * spacing[0] for k in range(len(volume))]
    for index, plane in enumerate(volume):
        k = first + index
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[series_uid, str(k)])
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID = CTImageStorage
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.SeriesInstanceUID = series_uid
        ds.StudyInstanceUID = generate_uid(entropy_srcs=["h5etl-study", series])
        ds.Modality = "CT"
        ds.InstanceNumber = k + 1
        ds.Rows, ds.Columns = plane.shape
        ds.PixelSpacing = [spacing[1], spacing[2]]
        ds.SliceThickness = spacing[0]
        ds.ImageOrientationPatient = list(orientation)
        ds.ImagePositionPatient = [origin[0], origin[1], float(where[index])]
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.BitsAllocated = ds.BitsStored = 16
        ds.HighBit = 15
        ds.RescaleSlope = slope
        ds.RescaleIntercept = intercept
        stored = np.rint((plane.astype(np.float64) - intercept) / slope)
        signed = bool(stored.min() < 0)  # below the intercept: signed pixels, as scanners do
        ds.PixelRepresentation = int(signed)
        ds.PixelData = stored.astype("<i2" if signed else "<u2").tobytes()
        name = names[index] if names is not None else f"IM{k:04d}.dcm"
        ds.save_as(folder / name, enforce_file_format=True)
    return str(series_uid)


def series_affine(
    spacing: Spacing = (2.5, 0.8, 0.8), origin: tuple[float, float, float] = (-100.0, -120.0, 0.0)
) -> np.ndarray:
    """The affine (voxel (x, y, z) -> RAS+ mm) of a series ``write_dicom_series`` writes with
    its default orientation, first slice at ``origin`` (LPS mm): a NIfTI label volume written
    with it lies on that series' grid."""
    affine = np.diag([-spacing[2], -spacing[1], spacing[0], 1.0])  # LPS: x and y flip
    affine[:3, 3] = [-origin[0], -origin[1], origin[2]]
    return affine


def write_nifti(
    path: Path,
    volume: np.ndarray,
    *,
    spacing: Spacing = (2.5, 0.8, 0.8),
    affine: np.ndarray | None = None,
) -> None:
    """``volume`` (z, y, x) as a NIfTI file of (x, y, z) voxels, affine diag(spacing) unless
    given (``series_affine``: the grid of a DICOM series)."""
    import nibabel

    if affine is None:
        affine = np.diag([spacing[2], spacing[1], spacing[0], 1.0])
    voxels = np.ascontiguousarray(volume.transpose(2, 1, 0))
    image = nibabel.Nifti1Image(voxels, affine)
    image.header.set_xyzt_units("mm")
    path.parent.mkdir(parents=True, exist_ok=True)
    nibabel.save(image, str(path))


def write_slices(
    folder: Path,
    volume: np.ndarray,
    *,
    spacing: Spacing | None = (2.5, 0.8, 0.8),
    suffix: str = ".png",
    offset: int = 0,
) -> None:
    """One file per z slice (16-bit PNG or ``.npy``), ``slice_000`` on, plus ``spacing.json``
    (``offset`` is added to the values and taken off again by the sidecar's intercept)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, plane in enumerate(volume):
        stored = plane.astype(np.int64) + offset
        target = folder / f"slice_{k:03d}{suffix}"
        if suffix == ".npy":
            np.save(target, stored.astype(plane.dtype if offset == 0 else np.int32))
        else:
            draw.save(target, stored.astype(np.uint16 if stored.max() > 255 else np.uint8))
    if spacing is not None:
        sidecar: dict[str, object] = {"spacing": list(spacing)}
        if offset:
            sidecar["intercept"] = -offset
        (folder / "spacing.json").write_text(json.dumps(sidecar), encoding="utf-8")


@register(
    "ct-volumes",
    config="ct-volumes.yaml",
    summary="CT volumes as DICOM series folders (int16 HU), label masks as NIfTI files",
)
def ct_volumes(raw: Path, *, samples: int = 6, seed: int = 13) -> dict[str, Broken]:
    """``raw/ct/case_NNN/`` (DICOM series, file names shuffled) and ``raw/masks/case_NNN.nii.gz``
    (labels 0, 1, 2), and broken cases: a missing slice, uneven spacing, a mask of another
    shape, a slice file that is no DICOM."""
    rng = np.random.default_rng(seed)
    for index in range(samples + 4):
        name = f"case_{index:03d}" if index < samples else f"case_{900 + index - samples}"
        slices = int(rng.integers(6, 11))
        volume, labels = ct_case(rng, (slices, 24, 24))
        positions = [2.5 * k for k in range(slices)]
        if name == "case_900":
            positions = positions[:3] + positions[4:]
            volume, labels = volume[: slices - 1], labels[: slices - 1]
        if name == "case_901":
            positions[-1] += 1.0
        names = [f"{n:08x}" for n in rng.permutation(1 << 20)[:slices]]
        write_dicom_series(
            raw / "ct" / name, volume, positions=positions, series=name, names=names[: len(volume)]
        )
        write_nifti(
            raw / "masks" / f"{name}.nii.gz",
            labels[:, :20] if name == "case_902" else labels,
            affine=series_affine(),  # the grid of its DICOM series
        )
        if name == "case_903":
            (raw / "ct" / name / names[1]).write_bytes(b"not a DICOM file\n")
    return {
        "ct/case_900": Broken("slice_gap", "the slice at 7.5 mm is missing"),
        "ct/case_901": Broken("uneven_spacing", "its last slice is 3.5 mm from the one before"),
        "masks/case_902.nii.gz": Broken("size_mismatch", "the mask is 24 wide, 20 high"),
        "ct/case_903": Broken("unreadable", "one of its files is no DICOM file"),
    }
