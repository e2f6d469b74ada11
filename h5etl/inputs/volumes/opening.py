"""Opening a case: which form it is (DICOM folder, NIfTI file, slice folder) and its reader.

Apart from ``case.py`` so the forms import what they share from there and only this module
imports the forms, when a case is opened (no cycle between ``case`` and the forms).
"""

from __future__ import annotations

import os
from typing import Literal

from h5etl.errors import RejectError
from h5etl.inputs.volumes.case import NIFTI_SUFFIXES, SLICE_SUFFIXES, Case, Form, case_files


def detect_form(path: str) -> Form:
    """The form of a case from what it is: a ``.nii``/``.nii.gz`` file, a folder of ``.png``
    or ``.npy`` slices, else a DICOM folder (DICOM files often have no suffix)."""
    if os.path.isdir(path):
        names = [n.lower() for n in case_files(path)]
        if any(n.endswith(SLICE_SUFFIXES) for n in names):
            return "slices"
        return "dicom"
    if path.lower().endswith(NIFTI_SUFFIXES):
        return "nifti"
    raise RejectError(
        "unreadable",
        "not a case: expected a .nii or .nii.gz file, or a folder (DICOM series or slices)",
        path=path,
    )


def open_case(path: str, form: Form | Literal["auto"] = "auto") -> Case:
    """The case at ``path`` with its header read (no voxels yet).

    Raises:
        RejectError: unreadable files, a missing or uneven slice, no geometry, and so on.
    """
    # here, not at the top: importing the package stays cheap (the forms bring Pillow and
    # imagecodecs); the forms import only case.py, so this is no cycle
    from h5etl.inputs.volumes import dicom, nifti, slices

    chosen = detect_form(path) if form == "auto" else form
    if chosen == "dicom":
        return dicom.open_series(path)
    if chosen == "nifti":
        return nifti.open_nifti(path)
    return slices.open_slices(path)
