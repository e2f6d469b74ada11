"""Folders of 2-D slices: grey PNGs (8 or 16 bits) or ``.npy`` arrays, and a spacing sidecar.

The sidecar ``spacing.json`` holds ``{"spacing": [z, y, x]}`` in mm, and may add ``"slope"``
and ``"intercept"`` (values = raw * slope + intercept, e.g. HU from PNGs saved as HU + 1024)
and ``"slices"``, the file names in slice order. Without ``"slices"`` a slice's place is the
last number in its name (``slice_007.png`` is 7): numbers must be distinct and consecutive,
a missing one is a ``slice_gap``. A mask's folder may omit the sidecar: it has its image's
geometry.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import imagecodecs
import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs
from h5etl.inputs.channels import NPY_HEADER_LOCK
from h5etl.inputs.pixels import rejecting_surprises
from h5etl.inputs.volumes.case import (
    SLICE_SUFFIXES,
    Case,
    CaseHeader,
    Slab,
    case_files,
    folder_digest,
)

SIDECAR = "spacing.json"
_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def _sidecar(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, SIDECAR)
    if not os.path.lexists(path):
        return None
    try:
        document = json.loads(inputs.read_file(path))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RejectError("bad_sidecar", f"not valid JSON: {exc}", path=path) from exc
    if not isinstance(document, dict):
        raise RejectError("bad_sidecar", "the sidecar must be a JSON object", path=path)
    unknown = sorted(set(document) - {"spacing", "slope", "intercept", "slices"})
    if unknown:
        raise RejectError(
            "bad_sidecar",
            f"unknown keys {unknown}: it takes spacing, slope, intercept, slices",
            path=path,
        )
    spacing = document.get("spacing")
    if (
        not isinstance(spacing, list)
        or len(spacing) != 3
        or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in spacing
        )
    ):
        raise RejectError(
            "bad_sidecar",
            f'"spacing" must be [z, y, x] in mm, each > 0, got {json.dumps(spacing)}',
            path=path,
        )
    return document


def _ordered(folder: str, names: list[str], listed: Any) -> list[str]:
    """The slice files in slice order: as the sidecar lists them, else by their numbers."""
    if listed is not None:
        if not isinstance(listed, list) or sorted(map(str, listed)) != sorted(names):
            raise RejectError(
                "bad_sidecar",
                f'"slices" must list each slice file of the folder once ({len(names)} files)',
                path=os.path.join(folder, SIDECAR),
            )
        return [str(name) for name in listed]
    numbered: dict[int, str] = {}
    for name in names:
        match = _NUMBER.search(os.path.splitext(name)[0])
        if match is None:
            raise RejectError(
                "unordered_slices",
                'no number in the name: name slices slice_000.png... or list "slices" in '
                f"{SIDECAR}",
                path=os.path.join(folder, name),
            )
        number = int(match.group(1))
        if number in numbered:
            raise RejectError(
                "duplicate_slice",
                f"{numbered[number]} and {name} both are slice {number}",
                path=folder,
            )
        numbered[number] = name
    order = sorted(numbered)
    for before, after in itertools.pairwise(order):
        if after != before + 1:
            missing = after - before - 1
            raise RejectError(
                "slice_gap",
                f"{missing} slice{'s' * (missing > 1)} missing between {numbered[before]} and "
                f"{numbered[after]} (no slice {before + 1}"
                f"{f'..{after - 1}' if missing > 1 else ''})",
                path=folder,
            )
    return [numbered[n] for n in order]


def decode_slice(data: bytes, path: str) -> np.ndarray:
    """One 2-D slice of a PNG (grey, 8 or 16 bits) or an ``.npy`` file, as stored."""
    if path.lower().endswith(".npy"):
        with rejecting_surprises(path, "read the .npy slice"):
            try:
                with NPY_HEADER_LOCK:  # (a slice is small: its copy under the lock is too)
                    array = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as exc:
                raise RejectError("unreadable", f"not a .npy array: {exc}", path=path) from exc
        if array.dtype.kind not in "iufb":
            raise RejectError("unsupported", f"a slice of {array.dtype}: not numbers", path=path)
    else:
        try:
            array = imagecodecs.png_decode(data)
        except imagecodecs.PngError as exc:
            raise RejectError("unreadable", f"not a readable PNG: {exc}", path=path) from exc
    if array.ndim != 2:
        raise RejectError(
            "unsupported", f"a slice is 2-D (grey), got shape {array.shape}", path=path
        )
    return np.asarray(array)


def open_slices(folder: str) -> SliceCase:
    """The slice folder with its order, geometry and first slice's size read."""
    names = [n for n in case_files(folder) if n != SIDECAR]
    odd = [n for n in names if not n.lower().endswith(SLICE_SUFFIXES)]
    if odd:
        raise RejectError(
            "unreadable", "not a slice (.png or .npy)", path=os.path.join(folder, odd[0])
        )
    if len({os.path.splitext(n)[1].lower() for n in names}) > 1:
        raise RejectError("unsupported", "both .png and .npy slices in one case", path=folder)
    if not names:
        raise RejectError("empty_case", "the case folder holds no slices", path=folder)
    sidecar = _sidecar(folder)
    ordered = _ordered(folder, names, (sidecar or {}).get("slices"))
    first_path = os.path.join(folder, ordered[0])
    first = decode_slice(inputs.read_file(first_path), first_path)
    spacing = tuple(float(v) for v in sidecar["spacing"]) if sidecar else (1.0, 1.0, 1.0)
    header = CaseHeader(
        "slices",
        (len(ordered), first.shape[0], first.shape[1]),
        (spacing[0], spacing[1], spacing[2]),
        np.diag([spacing[2], spacing[1], spacing[0], 1.0]),
        "",
        geometry_known=sidecar is not None,
        affine_known=False,
    )
    slope = float((sidecar or {}).get("slope", 1))
    intercept = float((sidecar or {}).get("intercept", 0))
    return SliceCase(folder, header, ordered, slope, intercept)


class SliceCase(Case):
    def __init__(
        self, folder: str, header: CaseHeader, ordered: list[str], slope: float, intercept: float
    ):
        super().__init__(folder, header)
        self._names = ordered
        self._slope, self._intercept = slope, intercept
        self._digests: dict[str, str] = {}

    def raw_slabs(self) -> Iterator[Slab]:
        sidecar = os.path.join(self.path, SIDECAR)
        if os.path.lexists(sidecar):
            self._digests[SIDECAR] = hashlib.sha256(inputs.read_file(sidecar)).hexdigest()
        for index, name in enumerate(self._names):
            path = os.path.join(self.path, name)
            data = inputs.read_file(path)
            self._digests[name] = hashlib.sha256(data).hexdigest()
            values = decode_slice(data, path)
            if values.shape != self.header.shape[1:]:
                raise RejectError(
                    "inconsistent_series",
                    f"slice of {values.shape[0]}x{values.shape[1]}, the first slice "
                    f"({self._names[0]}) is {self.header.shape[1]}x{self.header.shape[2]}",
                    path=path,
                )
            yield Slab(index, values[None], self._slope, self._intercept, path)

    def digest(self) -> str:
        return folder_digest(self._digests.items())
