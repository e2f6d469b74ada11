"""The config contract: the frozen, validated ``Spec`` a build runs from.

One pydantic model per concern, unknown keys refused; values are checked against each other
(chunks against shapes, fields against sources). Reading YAML is ``h5etl.config``'s job.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = [
    "Compression",
    "FieldSpec",
    "PadSpec",
    "SourceSpec",
    "Spec",
    "StorageSpec",
    "spec_sha256",
    "spec_text",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
RESERVED_NAMES = frozenset({"source_sha256", "diagnostics"})
RESERVED_ATTRS = frozenset(
    {
        "name",
        "version",
        "description",
        "created_at",
        "config",
        "config_sha256",
        "h5etl_version",
        "h5py_version",
        "hdf5_version",
        "source_fingerprint",
    }
)  # file attributes every build writes (pipeline._file_attrs)
IMAGE_MODES: dict[str, int] = {"RGB": 3, "L": 1}
MAX_CHUNK_BYTES = 2**32 - 1  # HDF5 refuses chunks of 4 GiB or more


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compression(_Strict):
    """A compression filter; written in YAML as ``lzf`` or as a mapping with options."""

    codec: Literal["none", "lzf", "gzip", "blosc", "zstd"]
    level: int | None = None
    cname: Literal["lz4", "lz4hc", "zstd", "blosclz", "zlib"] = "lz4"
    blosc_shuffle: Literal["none", "byte", "bit"] = "byte"

    @model_validator(mode="before")
    @classmethod
    def _from_shorthand(cls, data: Any) -> Any:
        if data is None or data is False:
            return {"codec": "none"}
        if isinstance(data, str):
            return {"codec": data}
        return data

    @model_validator(mode="after")
    def _level_in_range(self) -> Compression:
        ranges = {"gzip": (0, 9), "blosc": (0, 9), "zstd": (1, 22)}
        if self.level is not None:
            if self.codec not in ranges:
                raise ValueError(f"codec {self.codec} takes no level, got level {self.level}")
            low, high = ranges[self.codec]
            if not low <= self.level <= high:
                raise ValueError(f"{self.codec} level must be in {low}..{high}, got {self.level}")
        return self

    @property
    def effective_level(self) -> int | None:
        defaults = {"gzip": 4, "blosc": 5, "zstd": 3}
        return self.level if self.level is not None else defaults.get(self.codec)


class SourceSpec(_Strict):
    """One folder of inputs; files are paired across sources by their relative stem."""

    dir: Path
    glob: str = "*"


class StorageSpec(_Strict):
    """Chunking and filters for every field, unless a field overrides them."""

    chunk_samples: Annotated[int, Field(gt=0, le=65536)] = 32
    compression: Compression = Compression(codec="lzf")
    shuffle: bool = True


class PadSpec(_Strict):
    """How an image smaller or larger than its field's shape is fitted."""

    fill: Annotated[int, Field(ge=0, le=255)] = 0
    mask_fill: Annotated[int, Field(ge=0, le=255)] = 0  # a label: must be in every mask's values
    oversize: Literal["reject", "crop", "resize"] = "reject"


class FieldSpec(_Strict):
    """One dataset per split: decoded pixels of a source, or the source's file name."""

    dtype: str = "uint8"
    shape: tuple[Annotated[int, Field(gt=0)], ...] | None = None
    mode: Literal["RGB", "L"] | None = None
    values: tuple[Annotated[int, Field(ge=0, le=255)], ...] | None = None
    source: str | None = None
    chunks: tuple[Annotated[int, Field(gt=0)], ...] | None = None
    compression: Compression | None = None
    shuffle: bool | None = None

    @property
    def is_text(self) -> bool:
        return self.dtype == "str"

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        if self.is_text:
            for key in ("shape", "mode", "values", "chunks", "compression", "shuffle"):
                if getattr(self, key) is not None:
                    raise ValueError(f"a str field takes no {key}")
            return self
        try:
            np.dtype(self.dtype)
        except TypeError as exc:
            raise ValueError(
                f"dtype must be a numpy dtype name or str, got {self.dtype!r}"
            ) from exc
        if self.shape is None:
            raise ValueError("an image field needs a shape, e.g. [3, 224, 224]")
        if self.mode is None:
            raise ValueError("an image field needs a mode: RGB or L")
        if np.dtype(self.dtype) != np.uint8:
            raise ValueError(
                f"mode {self.mode} is stored as uint8 (16-bit inputs are scaled to 8 bits), "
                f"got dtype {self.dtype}"
            )
        channels = IMAGE_MODES[self.mode]
        if len(self.shape) != 3 or self.shape[0] != channels:
            raise ValueError(
                f"mode {self.mode} needs shape [{channels}, H, W] (channels first), "
                f"got {list(self.shape)}"
            )
        if self.values is not None:
            if self.mode != "L":
                raise ValueError("values (a mask's allowed labels) need mode L")
            if len(set(self.values)) != len(self.values):
                raise ValueError(f"values must be distinct, got {list(self.values)}")
        return self


class Spec(_Strict):
    """A validated build config; paths are absolute, recipe defaults applied."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
    pipeline: str = "segmentation"
    output: Path = Path("releases")
    description: str = ""
    attrs: dict[str, str | int | float | bool | list[str] | list[int] | list[float]] = Field(
        default_factory=dict
    )
    sources: Annotated[dict[str, SourceSpec], Field(min_length=1)]
    splits: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: {"train": 1.0}
    )
    seed: int = 0
    fields: Annotated[dict[str, FieldSpec], Field(min_length=1)]
    storage: StorageSpec = StorageSpec()
    pad: PadSpec = PadSpec()
    on_error: Literal["skip", "fail"] = "skip"
    max_rejects: Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0, lt=1)] | None = None

    @field_validator("attrs")
    @classmethod
    def _attrs_not_reserved(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        # the build writes these itself; a user value would be silently replaced
        clash = sorted(set(attrs) & RESERVED_ATTRS)
        if clash:
            raise ValueError(
                f"names reserved for the attributes h5etl writes itself, pick others: "
                f"{', '.join(clash)}"
            )
        return attrs

    @field_validator("splits")
    @classmethod
    def _splits_sum_to_one(cls, splits: dict[str, float]) -> dict[str, float]:
        if not splits:
            raise ValueError("at least one split is needed, e.g. {train: 1.0}")
        total = math.fsum(splits.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"split fractions must sum to 1, got {total:g}")
        for split in splits:
            _check_name(split, "split")
        return splits

    @model_validator(mode="after")
    def _fields_match_sources(self) -> Spec:
        problems: list[str] = []
        for field_name, field in self.fields.items():
            _check_name(field_name, "field")
            source = self.source_of(field_name)
            if source not in self.sources:
                problems.append(
                    f"fields.{field_name}: source {source!r} is not one of the sources "
                    f"{sorted(self.sources)}"
                )
            if not field.is_text:
                problems.extend(self._chunk_problems(field_name))
            if field.values is not None and self.pad.mask_fill not in field.values:
                problems.append(
                    f"pad.mask_fill: padding of mask fields.{field_name} must be one of its "
                    f"values {list(field.values)}, got {self.pad.mask_fill}"
                )
        used = {self.source_of(name) for name, f in self.fields.items() if not f.is_text}
        problems.extend(
            f"sources.{name}: no image field reads this source; add fields.{name}"
            for name in self.sources
            if name not in used
        )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _chunk_problems(self, field_name: str) -> list[str]:
        field = self.fields[field_name]
        assert field.shape is not None
        chunks = self.chunks_of(field_name)
        expected_rank = len(field.shape) + 1
        if len(chunks) != expected_rank:
            return [
                f"fields.{field_name}.chunks: needs {expected_rank} numbers (samples, then one "
                f"per axis of shape {list(field.shape)}), got {list(chunks)}"
            ]
        too_big = [c for c, s in zip(chunks[1:], field.shape, strict=True) if c > s]
        if too_big:
            return [
                f"fields.{field_name}.chunks: each axis must fit the shape "
                f"{list(field.shape)}, got {list(chunks)}"
            ]
        if math.prod(chunks) * np.dtype(field.dtype).itemsize > MAX_CHUNK_BYTES:
            return [f"fields.{field_name}.chunks: a chunk must be under 4 GiB, got {list(chunks)}"]
        return []

    # Derived views; computed, never stored, so they cannot drift from the config.
    def source_of(self, field_name: str) -> str:
        """The source a field reads: ``source``, else the same-named source, else the first."""
        field = self.fields[field_name]
        if field.source is not None:
            return field.source
        if field_name in self.sources or not field.is_text:
            return field_name
        return next(iter(self.sources))

    def chunks_of(self, field_name: str) -> tuple[int, ...]:
        """The HDF5 chunk shape of a field, sample axis first."""
        field = self.fields[field_name]
        if field.chunks is not None:
            return field.chunks
        shape = field.shape or ()
        return (self.storage.chunk_samples, *shape)

    def compression_of(self, field_name: str) -> Compression:
        return self.fields[field_name].compression or self.storage.compression

    def shuffle_of(self, field_name: str) -> bool:
        field = self.fields[field_name]
        return self.storage.shuffle if field.shuffle is None else field.shuffle

    @property
    def image_fields(self) -> list[str]:
        return [name for name, field in self.fields.items() if not field.is_text]

    @property
    def text_fields(self) -> list[str]:
        return [name for name, field in self.fields.items() if field.is_text]

    @property
    def batch_samples(self) -> int:
        """Samples per decode task: a whole chunk of every image field (their lcm)."""
        return math.lcm(*(self.chunks_of(name)[0] for name in self.image_fields))


def _check_name(name: str, what: str) -> None:
    if not re.match(NAME_PATTERN, name) or name in RESERVED_NAMES:
        raise ValueError(
            f"{what} name {name!r} must match {NAME_PATTERN} and not be one of "
            f"{sorted(RESERVED_NAMES)}"
        )


def spec_text(spec: Spec) -> str:
    """The resolved config as YAML, as stored in every release it builds."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def spec_sha256(spec: Spec) -> str:
    return hashlib.sha256(spec_text(spec).encode()).hexdigest()
