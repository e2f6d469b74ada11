"""DICOM series folders: slices ordered by position along the slice normal, never by name.

Every file of the folder is a slice of one series (a stray file is an ``unreadable`` reject,
two series a ``mixed_series`` one). Slices are sorted by their ImagePositionPatient projected
on the normal of ImageOrientationPatient; the steps between them must be even: a step that is
a multiple of the others is a ``slice_gap`` naming the missing positions, any other step an
``uneven_spacing``. Values are ``raw * RescaleSlope + RescaleIntercept``, slice by slice.
The header pass reads each file only up to its pixels; the pixel pass reads each file once,
whole (``h5etl.inputs.volumes.dicom_pixels``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs
from h5etl.inputs.pixels import rejecting_surprises
from h5etl.inputs.volumes.case import Case, CaseHeader, Slab, case_files, folder_digest, medical
from h5etl.inputs.volumes.dicom_pixels import NativePixels, native_pixels, slice_pixels

RELATIVE_TOLERANCE = 0.01  # of the slice step: DICOM positions are rounded decimal strings
ABSOLUTE_TOLERANCE = 1e-3  # mm
SKIPPED = frozenset({"DICOMDIR"})  # the index file of a DICOM medium, no slice
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


@dataclass(frozen=True, slots=True)
class _Slice:
    name: str
    position: float  # along the slice normal, mm
    origin: np.ndarray  # ImagePositionPatient (LPS mm)
    slope: float
    intercept: float
    pixels: NativePixels | None  # where its native pixels sit; None: pydicom decodes them


@dataclass(frozen=True, slots=True)
class _Plane:
    """What every slice of a series must share."""

    series_uid: str
    orientation: tuple[float, ...]  # ImageOrientationPatient: row, then column cosines
    size: tuple[int, int]  # rows, columns
    pixel_spacing: tuple[float, float]  # between rows (y), between columns (x)


def _value(ds: Any, keyword: str, path: str) -> Any:
    value = ds.get(keyword)
    if value is None or value == "":
        raise RejectError(
            "no_geometry", f"no {keyword}: a slice of a volume needs its position", path=path
        )
    return value


def _header(pydicom: Any, folder: str, name: str) -> tuple[_Plane, _Slice, Any]:
    path = os.path.join(folder, name)
    with inputs.opened(path) as handle, rejecting_surprises(path, "read the DICOM header"):
        try:
            ds = pydicom.dcmread(handle, stop_before_pixels=True)
        except pydicom.errors.InvalidDicomError as exc:
            raise RejectError("unreadable", f"not a DICOM file: {exc}", path=path) from exc
        pixels = native_pixels(ds, handle.tell())  # stopped at the Pixel Data element
    with rejecting_surprises(path, "read the DICOM header"):
        if int(ds.get("NumberOfFrames", 1) or 1) > 1 or int(ds.get("SamplesPerPixel", 1)) != 1:
            raise RejectError(
                "unsupported",
                "a multi-frame or colour DICOM file; a series of single grey slices is read",
                path=path,
            )
        orientation = tuple(float(v) for v in _value(ds, "ImageOrientationPatient", path))
        origin = np.array([float(v) for v in _value(ds, "ImagePositionPatient", path)])
        spacing = tuple(float(v) for v in _value(ds, "PixelSpacing", path))
        plane = _Plane(
            str(ds.get("SeriesInstanceUID", "")),
            orientation,
            (int(_value(ds, "Rows", path)), int(_value(ds, "Columns", path))),
            (spacing[0], spacing[1]),
        )
        normal = np.cross(orientation[:3], orientation[3:])
        slope = float(ds.get("RescaleSlope", 1) or 1)
        intercept = float(ds.get("RescaleIntercept", 0) or 0)
    return plane, _Slice(name, float(origin @ normal), origin, slope, intercept, pixels), ds


def _same_plane(planes: list[tuple[str, _Plane]], folder: str) -> _Plane:
    uids: dict[str, int] = {}
    for _, plane in planes:
        uids[plane.series_uid] = uids.get(plane.series_uid, 0) + 1
    if len(uids) > 1:
        counted = ", ".join(f"{uid or '(none)'} ({n} files)" for uid, n in sorted(uids.items()))
        raise RejectError("mixed_series", f"files of {len(uids)} series: {counted}", path=folder)
    first_name, first = planes[0]
    for name, plane in planes[1:]:
        for what, mine, theirs in (
            ("Rows x Columns", plane.size, first.size),
            ("PixelSpacing", plane.pixel_spacing, first.pixel_spacing),
            ("ImageOrientationPatient", plane.orientation, first.orientation),
        ):
            if not np.allclose(mine, theirs, rtol=0, atol=1e-4):
                raise RejectError(
                    "inconsistent_series",
                    f"{what} {list(mine)} differs from {list(theirs)} of {first_name}",
                    path=os.path.join(folder, name),
                )
    return first


def slice_step(positions: list[float], names: list[str], folder: str) -> float:
    """The even step between sorted slice positions, or a reject naming the gap."""
    steps = np.diff(positions)
    step = float(np.median(steps))
    for k, found in enumerate(steps):
        where = f"{positions[k]:g} mm ({names[k]}) and {positions[k + 1]:g} mm ({names[k + 1]})"
        if found <= ABSOLUTE_TOLERANCE:
            raise RejectError("duplicate_slice", f"two slices at {where}", path=folder)
        slack = max(RELATIVE_TOLERANCE * step, ABSOLUTE_TOLERANCE)
        if abs(found - step) <= slack:
            continue
        missing = round(found / step) - 1
        if missing >= 1 and abs(found - (missing + 1) * step) <= slack * (missing + 1):
            raise RejectError(
                "slice_gap",
                f"{missing} slice{'s' * (missing > 1)} missing between {where}: the slices "
                f"are {step:g} mm apart elsewhere",
                path=folder,
            )
        raise RejectError(
            "uneven_spacing",
            f"{found:g} mm between {where}, the slices are {step:g} mm apart elsewhere",
            path=folder,
        )
    return step


def _single_step(ds: Any, path: str) -> float:
    for keyword in ("SpacingBetweenSlices", "SliceThickness"):
        value = ds.get(keyword)
        if value not in (None, "") and float(value) > 0:
            return float(value)
    raise RejectError(
        "no_geometry",
        "a single slice without SpacingBetweenSlices or SliceThickness: its spacing is unknown",
        path=path,
    )


def open_series(folder: str) -> DicomCase:
    """The series in ``folder`` with its slices ordered and checked (headers only)."""
    pydicom = medical("pydicom")
    names = [n for n in case_files(folder) if n not in SKIPPED]
    read = [_header(pydicom, folder, name) for name in names]
    plane = _same_plane([(s.name, p) for p, s, _ in read], folder)
    ordered = sorted((s for _, s, _ in read), key=lambda s: (s.position, s.name))
    if len(ordered) > 1:
        step = slice_step([s.position for s in ordered], [s.name for s in ordered], folder)
        along = (ordered[-1].origin - ordered[0].origin) / (len(ordered) - 1)
    else:
        step = _single_step(read[0][2], os.path.join(folder, ordered[0].name))
        along = np.cross(plane.orientation[:3], plane.orientation[3:]) * step
    dy, dx = plane.pixel_spacing
    lps = np.eye(4)
    lps[:3, 0] = np.asarray(plane.orientation[:3]) * dx  # along a row: the column index x
    lps[:3, 1] = np.asarray(plane.orientation[3:]) * dy  # down a column: the row index y
    lps[:3, 2] = along
    lps[:3, 3] = ordered[0].origin
    header = CaseHeader(
        "dicom",
        (len(ordered), *plane.size),
        (step, dy, dx),
        LPS_TO_RAS @ lps,
        plane.series_uid,
    )
    return DicomCase(folder, header, ordered)


class DicomCase(Case):
    def __init__(self, folder: str, header: CaseHeader, ordered: list[_Slice]):
        super().__init__(folder, header)
        self._slices = ordered
        self._digests: dict[str, str] = {}

    def raw_slabs(self) -> Iterator[Slab]:
        """Each slice, its file read once (hashed, then its pixels taken from the bytes)."""
        pydicom = medical("pydicom")
        for index, item in enumerate(self._slices):
            path = os.path.join(self.path, item.name)
            data = inputs.read_file(path)
            self._digests[item.name] = hashlib.sha256(data).hexdigest()
            raw = slice_pixels(pydicom, data, item.pixels, path)
            if raw.shape != self.header.shape[1:]:
                raise RejectError(
                    "unreadable",
                    f"pixels of shape {raw.shape}, its header says {self.header.shape[1:]}",
                    path=path,
                )
            yield Slab(index, raw[None], item.slope, item.intercept, path)

    def digest(self) -> str:
        return folder_digest(self._digests.items())
