"""The config contract: the frozen, validated ``Spec`` a build runs from.

One pydantic model per concern, unknown keys refused; values are checked against each other
(chunks against shapes, fields against sources). Reading YAML is ``h5etl.config``'s job.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
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
# A decode task holds a whole chunk of every image field: the lcm of their chunk rows. Fields
# that agree make that one chunk, the user's own choice; fields that disagree may grow it to
# this many samples (32 chunks of the default 32) before memory stops being "a few batches".
MAX_BATCH_SAMPLES = 1024
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
MAX_ATTR_NAME_BYTES = 65534  # HDF5's limit on an attribute name (UTF-8, without the NUL)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}..."


def _storable_text(text: str) -> str:
    """A string HDF5 stores as it is: no NUL (it ends C strings), valid UTF-8."""
    if "\x00" in text:
        raise ValueError(f"HDF5 text cannot hold a NUL character (\\0), got {_shown(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text must be valid UTF-8, got {_shown(text)}") from exc
    return text


def _storable_attr(value: Any) -> Any:
    """An attribute value h5py stores exactly: text as above, integers in 64 bits."""
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                _storable_text(item)
            elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
                # numpy turns such a list into float64 (or objects HDF5 cannot store)
                raise ValueError(
                    f"integers in a list must fit in int64 ({INT64_MIN}..{INT64_MAX}), got "
                    f"{item}; write it as a string"
                )
    elif isinstance(value, int) and not INT64_MIN <= value <= UINT64_MAX:
        raise ValueError(
            f"integers must fit in 64 bits ({INT64_MIN}..{UINT64_MAX}), got {value}; "
            f"write it as a string"
        )
    return value


def _attr_name_problem(name: str) -> str | None:
    """Why HDF5 would refuse (or truncate) an attribute name, or None."""
    if not name:
        return "attribute names cannot be empty"
    if "\x00" in name:
        return f"attribute names cannot hold a NUL character (\\0), got {_shown(name)}"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return f"attribute names must be valid UTF-8, got {_shown(name)}"
    if size > MAX_ATTR_NAME_BYTES:
        return (
            f"attribute names must be at most {MAX_ATTR_NAME_BYTES} bytes of UTF-8, got {size} "
            f"({_shown(name)})"
        )
    return None


Text = Annotated[str, AfterValidator(_storable_text)]
AttrValue = Annotated[
    str | int | float | bool | list[str] | list[int] | list[float],
    AfterValidator(_storable_attr),
]


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


PathKey = tuple[str, ...]  # ("output",) or ("sources", <name>, "dir")


class Spec(_Strict):
    """A validated build config; paths are absolute, recipe defaults applied.

    A spec read from a file also knows where it came from (``config_file``, and the paths as the
    config wrote them relative to its folder), so the stored config and its digest hold
    relative paths and stay the same when the project folder moves. That origin is no field:
    YAML cannot set it and it is not part of ``spec_text``.
    """

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
    pipeline: str = "segmentation"
    output: Path = Path("releases")
    description: Text = ""
    attrs: dict[str, AttrValue] = Field(default_factory=dict)
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
    _config_file: Path | None = PrivateAttr(default=None)
    _config_dir: Path | None = PrivateAttr(default=None)
    _written_paths: dict[PathKey, str] = PrivateAttr(default_factory=dict)

    def located(
        self, *, config_dir: Path, config_file: Path | None, written_paths: Mapping[PathKey, str]
    ) -> Spec:
        """This spec, knowing the config it came from.

        Parameters:
            config_dir: the absolute folder relative paths were resolved against.
            config_file: the absolute config file, or None when there is no real file.
            written_paths: the paths the config wrote relative, by key, as written.
        """
        copy = self.model_copy()
        copy._config_dir = config_dir
        copy._config_file = config_file
        copy._written_paths = dict(written_paths)
        return copy

    @property
    def config_file(self) -> Path | None:
        """The absolute path of the config file this spec was read from, if any."""
        return self._config_file

    def stored_path(self, key: PathKey, value: Path) -> str:
        """How a path is stored: as the config wrote it relative to its folder, while it still
        names the same place; otherwise (written absolute, or replaced in code) absolute."""
        written = self._written_paths.get(key)
        if (
            written is not None
            and self._config_dir is not None
            and self._config_dir / written == value
        ):
            return written
        return str(value)

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
        # HDF5 refuses these only when the file is finished, after all the decoding
        problems = [p for name in attrs if (p := _attr_name_problem(name)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
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
        chunk_problems: list[str] = []  # of every image field
        for field_name, field in self.fields.items():
            _check_name(field_name, "field")
            source = self.source_of(field_name)
            if source not in self.sources:
                problems.append(
                    f"fields.{field_name}: source {source!r} is not one of the sources "
                    f"{sorted(self.sources)}"
                )
            if not field.is_text:
                found = self._chunk_problems(field_name)
                chunk_problems.extend(found)
                problems.extend(found)
            if field.values is not None and self.pad.mask_fill not in field.values:
                problems.append(
                    f"pad.mask_fill: padding of mask fields.{field_name} must be one of its "
                    f"values {list(field.values)}, got {self.pad.mask_fill}"
                )
        if not chunk_problems:  # the chunk shapes are sound, so their sample rows are known
            problems.extend(self._batch_problems())
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

    def _batch_problems(self) -> list[str]:
        rows = {name: self.chunks_of(name)[0] for name in self.image_fields}
        batch = math.lcm(*rows.values())
        if batch <= max([MAX_BATCH_SAMPLES, *rows.values()]):
            return []
        keys = dict.fromkeys(
            f"fields.{name}.chunks"
            if self.fields[name].chunks is not None
            else "storage.chunk_samples"
            for name in rows
        )
        shown = ", ".join(f"{name} {count}" for name, count in rows.items())
        return [
            f"{', '.join(keys)}: chunk rows {shown} make decode tasks of {batch} samples (a "
            f"task holds a whole chunk of every image field: their least common multiple); "
            f"at most {MAX_BATCH_SAMPLES} or the largest chunk rows keeps memory bounded: use "
            f"chunk rows that divide one another, e.g. the same for every field"
        ]

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
    """The resolved config as YAML, as stored in every release it builds.

    Paths the config wrote relative to its folder stay relative, so a moved or copied project
    stores (and hashes) the same text.
    """
    data = spec.model_dump(mode="json")
    data["output"] = spec.stored_path(("output",), spec.output)
    for name, source in spec.sources.items():
        data["sources"][name]["dir"] = spec.stored_path(("sources", name, "dir"), source.dir)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def spec_sha256(spec: Spec) -> str:
    return hashlib.sha256(spec_text(spec).encode()).hexdigest()
