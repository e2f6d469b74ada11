"""What every case form shares: its header, slab-by-slab reading, exact dtype casts."""

from __future__ import annotations

import hashlib
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np

from h5etl.errors import RejectError

Form = Literal["dicom", "nifti", "slices"]
FORMS: tuple[Form, ...] = ("dicom", "nifti", "slices")
NIFTI_SUFFIXES = (".nii", ".nii.gz")
SLICE_SUFFIXES = (".png", ".npy")
SLAB_ROWS = 8  # slices decoded and converted at a time: a few MB of float64 for 512x512

# The exact range of each dtype a volume is stored in.
_RANGES: dict[str, tuple[float, float]] = {
    "uint8": (0, 255),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "int32": (-(2**31), 2**31 - 1),
    "float32": (-3.4e38, 3.4e38),
}


def medical(module: str) -> ModuleType:
    """``pydicom`` or ``nibabel``, or a one-line reject naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RejectError(
            "missing_dependency",
            f"reading this case needs {module}: pip install 'h5etl[medical]'",
        ) from exc


@dataclass(frozen=True, slots=True)
class CaseHeader:
    """What a case's headers say, before any voxel is decoded."""

    form: Form
    shape: tuple[int, int, int]  # (z, y, x)
    spacing: tuple[float, float, float]  # (z, y, x) mm
    affine: np.ndarray  # (4, 4): voxel (x, y, z, 1) -> RAS+ mm
    series_uid: str  # DICOM SeriesInstanceUID; "" for the other forms
    geometry_known: bool = True  # False: a slice folder without a sidecar (a mask's)
    # False: the affine says nothing of orientation and origin (a slice folder: spacing only)
    affine_known: bool = True


@dataclass(frozen=True, slots=True)
class Slab:
    """Slices ``start`` on of a case, as a file stores them: values are ``raw * slope +
    intercept``."""

    start: int
    raw: np.ndarray  # (k, y, x)
    slope: float
    intercept: float
    source: str  # the file they came from


class Case(ABC):
    """One opened case: its header, its voxels slab by slab, its lineage digest."""

    def __init__(self, path: str, header: CaseHeader):
        self.path = path
        self.header = header

    @abstractmethod
    def raw_slabs(self) -> Iterator[Slab]:
        """The voxels a slab at a time, as stored in the files, with their rescale."""

    @abstractmethod
    def digest(self) -> str:
        """SHA-256 (hex) of what was read: the file, or each file of the folder by name."""

    def slabs(self, dtype: str) -> Iterator[tuple[int, np.ndarray, str]]:
        """(first slice, values (k, y, x) rescaled into ``dtype`` exactly, their file)."""
        for slab in self.raw_slabs():
            values = rescaled_exact(slab.raw, slab.slope, slab.intercept, dtype, where=slab.source)
            yield slab.start, values, slab.source

    def read(self, dtype: str) -> np.ndarray:
        """The whole (z, y, x) volume in ``dtype``, converted exactly, filled slab by slab."""
        out = np.empty(self.header.shape, dtype=dtype)
        for start, values, _ in self.slabs(dtype):
            out[start : start + len(values)] = values
        return out


def cast_exact(values: np.ndarray, dtype: str, *, where: str) -> np.ndarray:
    """``values`` in ``dtype`` without losing anything, else a ``lossy_conversion`` reject
    that names the values found and a dtype that holds them."""
    target = np.dtype(dtype)
    if values.dtype == target:
        return values
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise RejectError("lossy_conversion", "holds NaN or infinity", path=where)
    low, high = (values.min(), values.max()) if values.size else (0, 0)
    integral = values.dtype.kind in "iub" or bool(np.array_equal(values, np.rint(values)))
    top, bottom = _RANGES[dtype][1], _RANGES[dtype][0]
    if target.kind == "f" and bottom <= low and high <= top:
        return values.astype(target)
    if integral and bottom <= low and high <= top:
        return values.astype(target)
    fits = [n for n, (lo, hi) in _RANGES.items() if integral and lo <= low and high <= hi]
    fix = f"use dtype {fits[0]}" if fits and fits[0] != "int32" else "use dtype float32"
    found = f"values {_shown(low)}..{_shown(high)}"
    raise RejectError(
        "lossy_conversion",
        f"{found}{'' if integral else ' (not all integers)'} do not fit {dtype} exactly: {fix}",
        path=where,
    )


def _shown(value: object) -> str:
    if isinstance(value, np.floating | float):
        return np.format_float_positional(float(value), precision=6, trim="-")
    return str(value)


def rescaled_exact(
    raw: np.ndarray, slope: float, intercept: float, dtype: str, *, where: str
) -> np.ndarray:
    """``raw * slope + intercept`` in ``dtype`` without losing anything, else the
    ``lossy_conversion`` reject of ``cast_exact``.

    Integer values with integer factors into an integer dtype are computed in ``dtype``
    itself: the result's range follows from ``raw``'s minimum and maximum, and once it fits,
    arithmetic modulo 2**bits (what numpy's integer casts and operations do) gives exactly
    the true values. No int64 or float64 copy of the slab (four times an int16 one) is made.
    """
    target = np.dtype(dtype)
    integers = raw.dtype.kind in "iu" and target.kind in "iu" and raw.size > 0
    if integers and float(slope).is_integer() and float(intercept).is_integer():
        factor, offset = int(slope), int(intercept)
        ends = (int(raw.min()) * factor + offset, int(raw.max()) * factor + offset)
        bottom, top = _RANGES.get(target.name, (1, 0))  # (1, 0): no exact range known
        if bottom <= min(ends) and max(ends) <= top:
            if raw.dtype == target and factor == 1 and offset == 0:
                return raw
            out = raw.astype(target)  # wraps modulo 2**bits, as the steps below
            if factor != 1:
                np.multiply(out, _wrapped(factor, target), out=out)
            if offset != 0:
                np.add(out, _wrapped(offset, target), out=out)
            return out
    return cast_exact(rescaled(raw, slope, intercept), dtype, where=where)


def _wrapped(value: int, dtype: np.dtype[Any]) -> np.generic:
    """``value`` modulo 2**bits as a scalar of the integer ``dtype``."""
    bits = 8 * dtype.itemsize
    value %= 2**bits
    if dtype.kind == "i" and value >= 2 ** (bits - 1):
        value -= 2**bits
    scalar: np.generic = dtype.type(value)
    return scalar


def rescaled(raw: np.ndarray, slope: float, intercept: float) -> np.ndarray:
    """``raw * slope + intercept``: exact in int64 for integer factors, else float64."""
    if slope == 1 and intercept == 0:
        return raw
    if raw.dtype.kind in "iu" and float(slope).is_integer() and float(intercept).is_integer():
        return raw.astype(np.int64) * int(slope) + int(intercept)
    return raw.astype(np.float64) * slope + intercept


def folder_digest(parts: Iterable[tuple[str, str]]) -> str:
    """One SHA-256 over (file name, its SHA-256) pairs, in name order: the folder's lineage."""
    total = hashlib.sha256()
    for name, digest in sorted(parts):
        total.update(os.fsencode(name) + b"\0" + digest.encode() + b"\n")
    return total.hexdigest()


def case_files(folder: str) -> list[str]:
    """The non-hidden entries of a case folder, by name (no walking deeper)."""
    try:
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except NotADirectoryError as exc:
        raise RejectError("not_a_folder", "a case of this source is a folder", path=folder) from exc
    except OSError as exc:
        raise RejectError("unreadable", f"cannot list: {exc.strerror}", path=folder) from exc
    if not names:
        raise RejectError("empty_case", "the case folder holds no files", path=folder)
    return names
