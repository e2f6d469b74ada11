"""The ``volume`` kind: one 3-D case per sample, stored (z, y, x) ragged along z.

Its columns: the voxels (a ragged column: values of every case end to end, chunked a slice by
in-plane tiles, offsets beside), and row-aligned per case ``<field>_spacing`` (z, y, x) mm,
``<field>_affine`` (4, 4) (voxel (x, y, z, 1) -> RAS+ mm, nibabel's convention) and
``<field>_series_uid`` (DICOM SeriesInstanceUID, "" for the other forms). A label volume
(``values``) must lie on its image volume's (``of``) voxel grid, checked on the headers before
any of its voxels is decoded (``probe_header``, which a dry run runs alone): one stored in
another voxel order is turned onto it exactly (``h5etl.inputs.volumes.orient``), and is stored with
its image's spacing and affine. The kind reads its own files (a folder is no byte string), a
slab at a time, and gives decode the lineage digest of what it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from h5etl.dataflow import EncodedRows
from h5etl.errors import RejectError
from h5etl.format.codec import ChunkLayout
from h5etl.inputs.volumes import CaseHeader, open_case, orient
from h5etl.inputs.volumes import resample as resampling
from h5etl.inputs.volumes.case import SLAB_ROWS
from h5etl.inputs.volumes.orient import Reorientation
from h5etl.kinds.base import EncodedValue, Kind, SampleContext
from h5etl.kinds.columns import Column, RaggedColumn, ScalarColumn, StatsKind, TextColumn

if TYPE_CHECKING:
    from h5etl.transforms.apply import Expectation

AFFINE_MEANS = "voxel (x, y, z, 1) = (column, row, slice, 1) -> RAS+ mm (nibabel)"
TYPICAL_SLICES = 512  # for the decoded-size estimate that sizes decode tasks
# what reads each form (with "auto" a worker imports all: 0.15 s, nibabel after pydicom 0.03)
FORM_LIBRARIES: dict[str, tuple[str, ...]] = {
    "dicom": ("pydicom",),
    "nifti": ("nibabel",),
    "slices": (),
}
GEOMETRY_TOLERANCE = 1e-3  # relative: spacings of an image and its labels must agree


@dataclass(frozen=True, slots=True)
class _Geometry:
    """What a volume field learnt of its case, for the label volume that follows it."""

    shape: tuple[int, int, int]  # as stored before any resampling (a label: turned)
    spacing: tuple[float, float, float]
    affine: np.ndarray
    path: str
    affine_known: bool  # False: a slice folder's (spacing only)


@dataclass(frozen=True, slots=True)
class VolumeKind(Kind):
    kind: ClassVar[str] = "volume"
    header_checks: ClassVar[str] = (
        "volume headers (files that are no DICOM or NIfTI, mixed series, missing or uneven "
        "slices, NIfTI shape and size, slice_shape, a label volume's shape and grid against "
        "its image's)"
    )
    layout: ChunkLayout  # shape: the (y, x) of a slice; chunks (slices, tile y, tile x)
    form: str = "auto"
    values: tuple[int, ...] | None = None
    of: str | None = None
    resample_spacing: tuple[float, float, float] | None = None
    resample_shape: tuple[int, int, int] | None = None
    fill: float = 0
    with_stats: bool = True

    @property
    def columns(self) -> Mapping[str, Column]:
        stats: StatsKind = None
        if self.with_stats:
            stats = "histogram" if self.values is not None else "channels"
        attrs: dict[str, Any] = {"axes": "zyx"}
        if self.values is not None:
            attrs["values"] = list(self.values)
            attrs["of"] = self.of or ""
            # its voxels lie on its image's grid (turned there if stored otherwise); older
            # releases stored them as they lay, so their layout differs and no build carries
            # their label volumes forward
            attrs["on_grid_of"] = self.of or ""
        return {
            self.name: RaggedColumn(self.layout, attrs, stats, None),
            f"{self.name}_spacing": ScalarColumn("float64", (3,), {"axes": "zyx", "units": "mm"}),
            f"{self.name}_affine": ScalarColumn("float64", (4, 4), {"maps": AFFINE_MEANS}),
            f"{self.name}_series_uid": TextColumn(),
        }

    @property
    def depends_on(self) -> tuple[str, ...]:
        return () if self.of is None else (self.of,)

    @property
    def reads_values_of(self) -> tuple[str, ...]:
        return ()  # its image's geometry (header notes) places it, not the image's values

    def expectation(self) -> Expectation:
        from h5etl.transforms.apply import Expectation  # parent side, for transforms only

        values = frozenset(self.values) if self.values is not None else None
        return Expectation(self.layout.dtype, shape=(None, *self.layout.shape), values=values)

    @property
    def reads_own_files(self) -> bool:
        return True

    @property
    def worker_modules(self) -> tuple[str, ...]:
        forms = tuple(FORM_LIBRARIES) if self.form == "auto" else (self.form,)  # auto: any
        readers = (f"h5etl.inputs.volumes.{form}" for form in forms)
        return (__name__, *readers, *(lib for form in forms for lib in FORM_LIBRARIES[form]))

    @property
    def optional_modules(self) -> tuple[str, ...]:
        forms = tuple(FORM_LIBRARIES) if self.form == "auto" else (self.form,)  # auto: any
        found = [lib for form in forms for lib in FORM_LIBRARIES[form]]
        if self.values is not None and self.form != "slices":
            found.append("nibabel")  # brings a label volume onto its image's grid (orient)
        if self.resample_spacing is not None or self.resample_shape is not None:
            found.append("scipy")
        return tuple(dict.fromkeys(found))

    @property
    def sample_nbytes(self) -> int:
        y, x = self.layout.shape
        return TYPICAL_SLICES * y * x * np.dtype(self.layout.dtype).itemsize

    def decode(self, context: SampleContext) -> dict[str, Any]:
        assert self.source_index is not None
        path = context.path(self.source_index)
        case = open_case(path, self.form)  # type: ignore[arg-type]
        turn = self._placed(case.header, path, context.notes)
        geometry: _Geometry = context.notes[self.name]
        spacing, affine = geometry.spacing, geometry.affine
        value: np.ndarray | EncodedValue
        if turn is None and self._streams(context):
            value = self._encoded(case.slabs(self.layout.dtype), case.header.shape[0], path)
        else:
            voxels = case.read(self.layout.dtype)
            if self.values is not None:
                voxels = LabelCheck(self.values, path)(voxels)  # as the files lie
            if turn is not None:
                voxels = turn.apply(voxels)  # onto its image's grid, exactly
            if self._streams(context):
                value = self._encoded(_slabs_of(voxels), len(voxels), path, checked=True)
            else:
                value, spacing, affine = self._fitted(voxels, spacing, affine, geometry, path)
        context.digests[self.source_index] = case.digest()
        return {
            self.name: value,
            f"{self.name}_spacing": np.asarray(spacing, dtype=np.float64),
            f"{self.name}_affine": np.asarray(affine, dtype=np.float64),
            f"{self.name}_series_uid": case.header.series_uid,
        }

    def probe_header(self, path: str, notes: dict[str, Any]) -> Reorientation | None:
        """Check the case's headers (no voxel decoded) against the field and, for a label
        volume, against its image's (``notes[self.of]``); note the geometry it is stored
        with in ``notes[self.name]``. Returns how a label volume in another voxel order
        gets onto its image's grid (None: it lies on it)."""
        return self._placed(open_case(path, self.form).header, path, notes)  # type: ignore[arg-type]

    def _placed(self, header: CaseHeader, path: str, notes: dict[str, Any]) -> Reorientation | None:
        image = notes.get(self.of) if self.of is not None else None
        turn = self._check_header(header, image, path)
        # a label volume that passed lies on its image's grid: it has the image's geometry
        notes[self.name] = (
            _Geometry(header.shape, header.spacing, header.affine, path, header.affine_known)
            if image is None
            else _Geometry(image.shape, image.spacing, image.affine, path, image.affine_known)
        )
        return turn

    def _streams(self, context: SampleContext) -> bool:
        """Whether the case is compressed as it is read, never whole in memory: one slice per
        chunk (every case starts a chunk), no resampling (which needs the whole case) and
        not a raw task (crash isolation joins raw values)."""
        resampled = self.resample_spacing is not None or self.resample_shape is not None
        whole = context.raw or self.name in context.whole  # a transform takes the array
        return self.layout.rows == 1 and not resampled and not whole

    def _encoded(
        self,
        slabs: Iterable[tuple[int, np.ndarray, str]],
        rows: int,
        path: str,
        *,
        checked: bool = False,
    ) -> EncodedValue:
        """The case's slices compressed a slab at a time, with its digests and statistics
        (``checked``: its labels were checked already)."""
        from h5etl.format import digest
        from h5etl.format.codec import BlockEncoder
        from h5etl.stats import normalisation as stats

        blocks, digests = [], []
        found: Any = None
        labels = None if self.values is None or checked else LabelCheck(self.values, path)
        with BlockEncoder(self.layout) as encoder:
            for start, slab, _ in slabs:
                if labels is not None:
                    slab = labels(slab, first=start)  # a 0/255 case as 0/1
                if self.with_stats:
                    part: Any = (
                        stats.Histogram.of(slab)
                        if self.values is not None
                        else stats.ChannelStats.of(slab, channel_axis=None)
                    )
                    found = part if found is None else found.merge(part)
                for row in range(len(slab)):
                    block = slab[row : row + 1]
                    digests.append(digest.block_digest(block))
                    blocks.append(encoder.encode(block))
        return EncodedValue(rows, EncodedRows(blocks, digests), found)

    def _check_header(
        self, header: CaseHeader, image: _Geometry | None, path: str
    ) -> Reorientation | None:
        if image is not None:
            return self._against_image(header, image, path)
        if not header.geometry_known:
            raise RejectError(
                "no_geometry",
                'a slice folder of an image volume needs spacing.json ({"spacing": [z, y, x]})',
                path=path,
            )
        plane = tuple(self.layout.shape)
        resampled = self.resample_spacing is not None or self.resample_shape is not None
        if header.shape[1:] != plane and not resampled:
            raise RejectError(
                "size_mismatch",
                f"slices are {header.shape[1]}x{header.shape[2]} (y x), fields.{self.name}."
                f"slice_shape is {plane[0]}x{plane[1]}; resample (resample: {{spacing: ...}}) "
                "to keep cases of other sizes",
                path=path,
            )
        return None

    def _against_image(
        self, header: CaseHeader, image: _Geometry, path: str
    ) -> Reorientation | None:
        """A label volume's grid against its image's: the same (None), the same in another
        voxel order (how to turn it), else a ``size_mismatch`` or ``geometry_mismatch``."""
        if not (header.affine_known and image.affine_known):  # a slice folder: spacing only
            self._same_size(header.shape, image, path)
            if header.geometry_known and not np.allclose(
                header.spacing, image.spacing, rtol=GEOMETRY_TOLERANCE
            ):
                raise RejectError(
                    "geometry_mismatch",
                    f"spacing {_zyx(header.spacing)} mm, its image {self.of} has "
                    f"{_zyx(image.spacing)} mm ({image.path})",
                    path=path,
                )
            return None
        if orient.disagreement(header.affine, image.affine, image.spacing) is None:
            self._same_size(header.shape, image, path)
            return None
        turn = orient.reorientation(header.affine, header.shape, image.affine)
        if turn is None:
            raise self._off_grid(header, image, path)
        turned = "" if orient.is_identity(turn) else " in its image's voxel order"
        self._same_size(turn.shape, image, path, turned)
        affine = orient.reoriented_affine(header.affine, turn, header.shape)
        if orient.disagreement(affine, image.affine, image.spacing) is not None:
            raise self._off_grid(header, image, path)
        return None if orient.is_identity(turn) else turn

    def _off_grid(self, header: CaseHeader, image: _Geometry, path: str) -> RejectError:
        return RejectError(
            "geometry_mismatch",
            f"{self.name} {orient.described(header.affine, header.spacing)} vs its image "
            f"{self.of} {orient.described(image.affine, image.spacing)} ({image.path}): "
            "not the same grid, nor the same in another voxel order",
            path=path,
        )

    def _same_size(
        self, shape: tuple[int, int, int], image: _Geometry, path: str, turned: str = ""
    ) -> None:
        if shape != image.shape:
            raise RejectError(
                "size_mismatch",
                f"the label volume is {_zyx(shape)} (z, y, x){turned}, its image "
                f"{self.of} {_zyx(image.shape)} ({image.path})",
                path=path,
            )

    def _fitted(
        self,
        voxels: np.ndarray,
        spacing: tuple[float, float, float],
        affine: np.ndarray,
        geometry: _Geometry,
        path: str,
    ) -> tuple[np.ndarray, tuple[float, float, float], np.ndarray]:
        """The voxels resampled as asked (a label volume as its image is: it has its
        image's geometry by now), else as read."""
        if self.resample_spacing is None and self.resample_shape is None:
            return voxels, spacing, affine
        shape = resampling.target_shape(
            voxels.shape,
            geometry.spacing,
            to_spacing=self.resample_spacing,
            to_shape=self.resample_shape,
        )
        from h5etl.transforms import builtin  # the few builds that resample

        before = voxels.shape
        try:  # the built-in transform resample: the mechanism a config's call runs
            voxels = builtin.resample(voxels, shape=shape, labels=self.values is not None)
        except RejectError as exc:
            raise RejectError(exc.reason, exc.message, path=path) from exc
        spacing, affine = resampling.regrid(spacing, affine, before, voxels.shape)
        plane = (self.layout.shape[0], self.layout.shape[1])
        fill = self.fill if self.values is None else 0
        voxels, affine = resampling.centre_plane(voxels, affine, plane, fill)
        return voxels, spacing, affine


def _slabs_of(voxels: np.ndarray) -> Iterator[tuple[int, np.ndarray, str]]:
    for start in range(0, len(voxels), SLAB_ROWS):
        yield start, voxels[start : start + SLAB_ROWS], ""


def _zyx(values: tuple[float, ...]) -> str:
    return "x".join(f"{v:g}" for v in values)


class LabelCheck:
    """The labels of one case, checked a slab at a time: every voxel one of ``values``, else
    a ``mask_values`` reject naming where. A binary label volume (``values`` [0, 1]) stored
    0/255 reads as 0/1, as a 2-D mask does (``mask_values.check_mask``): over the whole case,
    so a case holding both 1 and 255 is a reject, whichever slab shows which first."""

    def __init__(self, values: tuple[int, ...], path: str):
        self.values, self.path = values, path
        self.binary = set(values) == {0, 1}
        self.one: int | None = None  # what "1" is written as in this case: 1 or 255

    def __call__(self, voxels: np.ndarray, *, first: int = 0) -> np.ndarray:
        """``voxels`` as stored (``first``: the slice number of ``voxels[0]``)."""
        present = set(np.flatnonzero(np.bincount(voxels.ravel(), minlength=1)).tolist())
        stray = sorted(present - set(self.values))
        if self.binary and stray == [255] and 1 not in present and self.one != 1:
            self.one = 255
            binary: np.ndarray = (voxels == 255).astype(voxels.dtype)
            return binary
        if self.binary and 1 in present and self.one == 255:
            stray = [1]  # 0/255 so far: a 1 now is a third value, as 255 after a 1 is
        elif self.binary and 1 in present:
            self.one = 1
        if stray:
            z, y, x = (int(v) for v in np.argwhere(voxels == stray[0])[0])
            raise RejectError(
                "mask_values",
                f"labels {stray} are not among values {list(self.values)} (first {stray[0]} "
                f"at z={z + first}, y={y}, x={x})",
                path=self.path,
            )
        return voxels
