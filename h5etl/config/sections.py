"""The parts of a config: one frozen pydantic model per concern, unknown keys refused.

``h5etl.config.spec`` puts them together in ``Spec`` and checks them against each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from h5etl.config.scheduler_address import scheduler_problem
from h5etl.remote.errors import RemoteUsageError
from h5etl.remote.location import is_url, parse_location

__all__ = [
    "Compression",
    "DecodeSpec",
    "GroupBy",
    "PadSpec",
    "Problem",
    "SourceSpec",
    "SpecProblems",
    "StorageSpec",
    "Strict",
]


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule: the keys it is about (relative to the model that found it)."""

    keys: tuple[tuple[str, ...], ...]
    message: str

    def line(self) -> str:
        return f"{', '.join('.'.join(key) for key in self.keys)}: {self.message}"


class SpecProblems(ValueError):
    """Problems a model validator found, each with its own key, so ``h5etl.config.load`` can say
    which file wrote the value (the config or its recipe)."""

    def __init__(self, problems: Sequence[Problem]):
        super().__init__("; ".join(problem.line() for problem in problems))
        self.problems = list(problems)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compression(Strict):
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


def _folder_or_url(value: Any) -> Any:
    """A source's ``dir``: a URL stays text (as ``parse_location`` writes it back), anything
    else becomes a path."""
    if isinstance(value, str) and is_url(value):
        try:
            return parse_location(value).url
        except RemoteUsageError as exc:
            raise ValueError(exc.message) from exc
    return Path(value) if isinstance(value, str) else value


class SourceSpec(Strict):
    """One folder of inputs, or a URL on object storage (``s3://bucket/prefix``, ``gs://``,
    ``az://``, ``https://``); files are paired across sources by their relative stem.

    ``entries: folders``: each input is a folder (a DICOM series, a folder of slices, a
    recording's channel files) matched by ``glob`` and keyed by its relative path; the kind
    reading it lists its files.
    """

    # a local folder, or a URL on object storage (s3://bucket/prefix, gs://, az://, https://):
    # kept as its text, credentials refused (``h5etl.remote.parse_location``)
    dir: Annotated[Path | str, BeforeValidator(_folder_or_url)]
    glob: str = "*"
    entries: Literal["files", "folders"] = "files"


class StorageSpec(Strict):
    """Chunking and filters for every field, unless a field overrides them."""

    chunk_samples: Annotated[int, Field(gt=0, le=65536)] = 32
    # the recipe's default, chosen by measurement (docs/internals/decisions.md#codec)
    compression: Compression = Compression(codec="blosc", cname="lz4", level=5)
    shuffle: bool = True
    # HDF5's paged file-space strategy (fs_strategy="page") with pages of this many bytes:
    # metadata kept together in pages, so a reader over object storage opens the release in
    # a few range reads. None (the default): HDF5's default layout, the bytes of before.
    page_size: Annotated[int, Field(ge=4096, le=2**30)] | None = None


def _valid_scheduler(address: str) -> str:
    """Where decoding runs: this machine's cores, or a Dask scheduler (tcp://host:8786)."""
    problem = scheduler_problem(address)
    if problem is not None:
        raise ValueError(problem)
    return address


class DecodeSpec(Strict):
    """Where the decode tasks run. Not part of the stored config: it changes how a release is
    built, never what it holds (like ``--jobs``)."""

    scheduler: Annotated[str, AfterValidator(_valid_scheduler)] = "local"


class PadSpec(Strict):
    """How an image smaller or larger than its field's shape is fitted."""

    # each must fit every field it pads: the image fields' dtypes, every mask's values
    fill: Annotated[int, Field(ge=-32768, le=65535)] = 0
    mask_fill: Annotated[int, Field(ge=0, le=65535)] = 0
    oversize: Literal["reject", "crop", "resize"] = "reject"


class GroupBy(Strict):
    """What makes samples one group (``splits.group_by``): a regex on the relative path of
    the sample's first file (its first capture group, or the whole match), or the value of a
    field known at plan time (a label, a table column). Written as the regex alone or as
    ``{pattern: ...}`` / ``{field: ...}``."""

    pattern: str | None = None
    field: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_shorthand(cls, data: Any) -> Any:
        return {"pattern": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_rule(self) -> GroupBy:
        if (self.pattern is None) == (self.field is None):
            raise ValueError("give either pattern (a regex on the path) or field, not both")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r} is not a regex: {exc}") from exc
        return self

    def describe(self) -> str:
        return f"pattern {self.pattern}" if self.pattern is not None else f"field {self.field}"
