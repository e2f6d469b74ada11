"""The config of the ``volume`` kind: a 3-D case per sample (DICOM series, NIfTI, slices)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from h5etl.config.fields.base import FieldModel, key_problem
from h5etl.config.sections import Compression, Problem, SourceSpec, Strict

VolumeDtype = Literal["int16", "uint16", "uint8", "float32"]
LABEL_DTYPES = {"uint8": 255, "uint16": 65535}
# in-plane chunk edge: a 3-D patch reads only the tiles it covers. 256 px measured against
# 128 (docs/benchmarks/volumes.md): a 4th of the chunks for the writer, patches of
# (64, 128, 128) and (96, 160, 160) read as fast or faster; small (32, 64, 64) ones 1.7x slower
DEFAULT_TILE = 256
DEFAULT_CHUNK_SLICES = 1  # slices per chunk: every case starts on a chunk (docs/how-to/volumes.md)
Positive = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(gt=0)]


class ResampleSpec(Strict):
    """Resample every case to a fixed ``spacing`` (z, y, x) mm or a fixed ``shape`` (z, y, x):
    linear for images, nearest for label volumes. Never done unless asked."""

    spacing: tuple[Positive, Positive, Positive] | None = None
    shape: tuple[Count, Count, Count] | None = None

    @model_validator(mode="after")
    def _one_target(self) -> ResampleSpec:
        if (self.spacing is None) == (self.shape is None):
            raise ValueError(
                "give exactly one of spacing: [z, y, x] (mm) or shape: [z, y, x] (voxels)"
            )
        return self


class VolumeField(FieldModel):
    """A case per sample, stored (z, y, x) ragged along z: images in HU (int16 by default),
    or labels (``values``) that must have the shape of their image volume (``of``)."""

    kind: Literal["volume"]
    source: str | None = None
    form: Literal["auto", "dicom", "nifti", "slices"] = "auto"
    dtype: VolumeDtype | None = None  # int16 for images, uint8 for label volumes
    slice_shape: tuple[Count, Count] | None = None  # (y, x) of every case
    chunks: tuple[Count, Count, Count] | None = None  # (slices, y, x) per chunk
    compression: Compression | None = None
    shuffle: bool | None = None
    values: tuple[Annotated[int, Field(ge=0)], ...] | None = None  # a label volume's labels
    of: str | None = None  # the image volume a label volume belongs to (default: the first)
    resample: ResampleSpec | None = None
    fill: float = 0  # around a resampled case smaller in-plane than slice_shape
    stats: bool = True

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return self.source if self.source is not None else field_name

    @property
    def reads_files(self) -> bool:
        return True

    @property
    def is_label(self) -> bool:
        return self.values is not None

    @property
    def stored_dtype(self) -> str:
        return self.dtype or ("uint8" if self.is_label else "int16")

    @property
    def plane(self) -> tuple[int, int]:
        """The (y, x) of every stored slice."""
        if self.slice_shape is not None:
            return self.slice_shape
        assert self.resample is not None
        assert self.resample.shape is not None
        return (self.resample.shape[1], self.resample.shape[2])

    def chunk_shape(self) -> tuple[int, int, int]:
        if self.chunks is not None:
            return self.chunks
        y, x = self.plane
        return (DEFAULT_CHUNK_SLICES, min(DEFAULT_TILE, y), min(DEFAULT_TILE, x))

    def dataset_names(self, field_name: str) -> tuple[str, ...]:
        from h5etl.format import contract as fileformat

        return (
            field_name,
            field_name + fileformat.OFFSETS_SUFFIX,
            *(f"{field_name}_{suffix}" for suffix in EXTRA_COLUMNS),
        )

    @model_validator(mode="after")
    def _consistent(self) -> VolumeField:
        if self.slice_shape is None and (self.resample is None or self.resample.shape is None):
            raise key_problem(
                "slice_shape", "a volume needs slice_shape: [y, x], the size of every slice"
            )
        if (
            self.slice_shape is not None
            and self.resample is not None
            and self.resample.shape is not None
            and tuple(self.resample.shape[1:]) != tuple(self.slice_shape)
        ):
            raise key_problem(
                "slice_shape",
                f"must be resample.shape's [y, x] {list(self.resample.shape[1:])}, "
                f"got {list(self.slice_shape)}",
            )
        if self.chunks is not None and any(
            c > p for c, p in zip(self.chunks[1:], self.plane, strict=True)
        ):
            raise key_problem(
                "chunks",
                f"the tile must fit slice_shape {list(self.plane)}, got {list(self.chunks)}",
            )
        if self.is_label:
            self._check_labels()
        elif self.of is not None:
            raise key_problem("of", "only a label volume (with values) belongs to an image volume")
        return self

    def _check_labels(self) -> None:
        assert self.values is not None
        if self.stored_dtype not in LABEL_DTYPES:
            raise key_problem(
                "dtype", f"a label volume is uint8 or uint16, got {self.stored_dtype}"
            )
        if len(set(self.values)) != len(self.values) or not self.values:
            raise key_problem("values", f"values must be distinct labels, got {list(self.values)}")
        top = LABEL_DTYPES[self.stored_dtype]
        if max(self.values) > top:
            raise key_problem(
                "values", f"{self.stored_dtype} holds labels 0..{top}, got {max(self.values)}"
            )
        if self.resample is not None:
            raise key_problem(
                "resample", "a label volume is resampled as its image volume is (nearest)"
            )


EXTRA_COLUMNS = ("spacing", "affine", "series_uid")  # row-aligned per case: <field>_<suffix>


def volume_problems(
    fields: Mapping[str, Any], sources: Mapping[str, SourceSpec], source_of: Any
) -> list[Problem]:
    """Rules between volume fields and the rest: a label volume's image, the forms' entries."""
    images = [n for n, f in fields.items() if isinstance(f, VolumeField) and not f.is_label]
    problems = []
    for name, field in fields.items():
        if not isinstance(field, VolumeField):
            continue
        key = ("fields", name)
        if field.is_label:
            of = field.of or (images[0] if images else None)
            if of is None or of not in images:
                problems.append(
                    Problem(
                        ((*key, "of") if field.of else key,),
                        f"a label volume needs an image volume field to belong to (of:); "
                        f"image volumes: {', '.join(images) or 'none'}",
                    )
                )
            elif tuple(fields[of].plane) != tuple(field.plane):
                problems.append(
                    Problem(
                        ((*key, "slice_shape"),),
                        f"must be {of}'s slice_shape {list(fields[of].plane)}, "
                        f"got {list(field.plane)}",
                    )
                )
        source = sources.get(source_of(name))
        wanted = {"dicom": "folders", "slices": "folders", "nifti": "files"}.get(field.form)
        if source is not None and wanted is not None and source.entries != wanted:
            problems.append(
                Problem(
                    (("sources", source_of(name), "entries"),),
                    f"fields.{name} reads form {field.form}, whose cases are {wanted}: "
                    f"set entries: {wanted}",
                )
            )
    return problems
