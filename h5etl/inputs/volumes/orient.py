"""Voxel grids of a case's fields: whether a label volume lies on its image's grid, and the
exact axis permutation and flips (no interpolation) that bring it there.

Two fields are on one grid when their affines (voxel (x, y, z, 1) -> RAS+ mm) agree: the
axis columns within ``AXIS_TOLERANCE`` of a voxel's size, the origins within
``ORIGIN_TOLERANCE`` of a voxel. A label volume stored in another voxel order (an axis
flipped, axes swapped, the affine saying so) is brought onto its image's grid with nibabel's
orientation tools; anything else is a ``geometry_mismatch``. The comparison itself is numpy
alone: nibabel is imported only when the grids differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from h5etl.inputs.volumes.case import medical

AXIS_TOLERANCE = 1e-3  # of a voxel's size: an axis column's length and direction
ORIGIN_TOLERANCE = 0.01  # of the smallest voxel size: where voxel (0, 0, 0) sits

Shape = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Reorientation:
    """How a label volume (z, y, x) as stored gets onto its image's grid: nibabel's
    orientation transform of its (x, y, z) axes, and the shape it has after it."""

    transform: np.ndarray  # (3, 2): per input axis (x, y, z), (output axis, +1 / -1)
    shape: Shape  # (z, y, x) after the transform

    def apply(self, voxels: np.ndarray) -> np.ndarray:
        """``voxels`` (z, y, x) on the image's grid: axes permuted and flipped, exactly."""
        orientations = medical("nibabel").orientations
        xyz = orientations.apply_orientation(voxels.transpose(2, 1, 0), self.transform)
        return np.ascontiguousarray(xyz.transpose(2, 1, 0))


def axis_codes(affine: np.ndarray) -> str:
    """The direction each voxel axis (x, y, z) points to, as three letters: ``RAS``, ``LPS``
    (the nearest anatomical axis; an oblique grid gets its closest)."""
    letters = (("L", "R"), ("P", "A"), ("I", "S"))
    codes = []
    for column in np.asarray(affine, dtype=np.float64)[:3, :3].T:
        axis = int(np.argmax(np.abs(column)))
        codes.append(letters[axis][int(column[axis] > 0)] if column[axis] else "?")
    return "".join(codes)


def disagreement(affine: np.ndarray, other: np.ndarray, spacing: tuple[float, ...]) -> str | None:
    """What differs between two affines of grids of voxel size ``spacing`` (z, y, x) mm:
    ``"orientation"``, ``"spacing"`` or ``"origin"`` (the first found), or None when they
    agree within the tolerances."""
    mine, theirs = np.asarray(affine, np.float64), np.asarray(other, np.float64)
    size = np.asarray(spacing[::-1], dtype=np.float64)  # x, y, z: the affine's column order
    if axis_codes(mine) != axis_codes(theirs):
        return "orientation"
    columns = np.abs(mine[:3, :3] - theirs[:3, :3]).max(axis=0)
    if (columns > AXIS_TOLERANCE * size).any():
        lengths = np.linalg.norm(mine[:3, :3], axis=0), np.linalg.norm(theirs[:3, :3], axis=0)
        differ = not np.allclose(*lengths, rtol=AXIS_TOLERANCE, atol=0)
        return "spacing" if differ else "orientation"
    if np.abs(mine[:3, 3] - theirs[:3, 3]).max() > ORIGIN_TOLERANCE * size.min():
        return "origin"
    return None


def reorientation(
    affine: np.ndarray, shape: Shape, image_affine: np.ndarray
) -> Reorientation | None:
    """The transform that puts a volume of ``shape`` (z, y, x) and ``affine`` into the voxel
    order of ``image_affine`` (identity when they already share it); None when no axis
    order maps one onto the other (a degenerate affine: an axis of length 0)."""
    orientations = medical("nibabel").orientations
    try:
        transform = orientations.ornt_transform(
            orientations.io_orientation(affine), orientations.io_orientation(image_affine)
        )
    except ValueError:  # nibabel: "Unable to find out axis ..." (a NaN row)
        return None
    xyz = shape[::-1]
    after = [0, 0, 0]
    for axis, (target, _) in enumerate(transform):
        after[int(target)] = xyz[axis]
    return Reorientation(transform, (after[2], after[1], after[0]))


def reoriented_affine(affine: np.ndarray, turn: Reorientation, shape: Shape) -> np.ndarray:
    """``affine`` of a volume of ``shape`` (z, y, x) after ``turn``: the same world points."""
    orientations = medical("nibabel").orientations
    step = np.asarray(orientations.inv_ornt_aff(turn.transform, shape[::-1]), np.float64)
    out: np.ndarray = np.asarray(affine, dtype=np.float64) @ step
    return out


def is_identity(turn: Reorientation) -> bool:
    return bool(np.array_equal(turn.transform, [[0, 1], [1, 1], [2, 1]]))


def described(affine: np.ndarray, spacing: tuple[float, ...]) -> str:
    """``LPS, 2.5x0.8x0.8 mm (z, y, x), origin (100, 120, 0) mm``: a grid in a message."""
    zyx = "x".join(f"{v:g}" for v in spacing)
    origin = ", ".join(f"{v:g}" for v in np.round(np.asarray(affine)[:3, 3], 3))
    return f"{axis_codes(affine)}, {zyx} mm (z, y, x), origin ({origin}) mm"
