"""The config contract: the frozen, validated ``Spec`` a build runs from.

One pydantic model per concern, unknown keys refused; values are checked against each other
(chunks against shapes, fields against sources). Reading YAML is ``h5etl.config``'s job.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from h5etl.specparts import (
    Compression,
    FieldSpec,
    PadSpec,
    Problem,
    SourceSpec,
    SpecProblems,
    StorageSpec,
    Strict,
)
from h5etl.storable import AttrValue, Text, attr_name_problem

__all__ = [
    "Compression",
    "FieldSpec",
    "PadSpec",
    "Problem",
    "SourceSpec",
    "Spec",
    "SpecProblems",
    "StorageSpec",
    "source_for",
    "spec_sha256",
    "spec_text",
    "unknown_source",
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
MAX_CHUNK_BYTES = 2**32 - 1  # HDF5 refuses chunks of 4 GiB or more
# A decode task holds a whole chunk of every image field: the lcm of their chunk rows. Fields
# that agree make that one chunk, the user's own choice; fields that disagree may grow it to
# this many samples (32 chunks of the default 32) before memory stops being "a few batches".
MAX_BATCH_SAMPLES = 1024


def source_for(
    field_name: str, *, source: str | None, is_text: bool, sources: Sequence[str]
) -> str:
    """The source a field reads: ``source``, else the same-named source, else (a text field)
    the first source."""
    if source is not None:
        return source
    if field_name in sources or not is_text or not sources:
        return field_name
    return sources[0]


def unknown_source(source: str, sources: Iterable[str], *, implicit: bool) -> str:
    """The message for a field reading a source that does not exist, with a likely fix."""
    known = sorted(sources)
    text = f"no source named {source!r}"
    if implicit:
        text += " (an image field reads the source of its own name unless it sets source)"
    text += f"; sources: {', '.join(known)}"
    close = difflib.get_close_matches(source, known, n=1)
    return f"{text}; did you mean {close[0]!r}?" if close else f"{text}; set source: to one of them"


PathKey = tuple[str, ...]  # ("output",) or ("sources", <name>, "dir")


class Spec(Strict):
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
        problems = [p for name in attrs if (p := attr_name_problem(name)) is not None]
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
        problems: list[Problem] = []
        chunk_problems: list[Problem] = []  # of every image field
        for field_name, field in self.fields.items():
            key = ("fields", field_name)
            name_problem = _name_problem(field_name, "field")
            if name_problem is not None:
                problems.append(Problem((key,), name_problem))
                continue
            source = self.source_of(field_name)
            if source not in self.sources:
                implicit = field.source is None
                problems.append(
                    Problem(
                        (key if implicit else (*key, "source"),),
                        unknown_source(source, self.sources, implicit=implicit),
                    )
                )
            if not field.is_text:
                found = self._chunk_problems(field_name)
                chunk_problems.extend(found)
                problems.extend(found)
            if field.values is not None and self.pad.mask_fill not in field.values:
                problems.append(
                    Problem(
                        (("pad", "mask_fill"),),
                        f"padding of mask fields.{field_name} must be one of its values "
                        f"{list(field.values)}, got {self.pad.mask_fill}",
                    )
                )
        if not chunk_problems:  # the chunk shapes are sound, so their sample rows are known
            problems.extend(self._batch_problems())
        used = {self.source_of(name) for name, f in self.fields.items() if not f.is_text}
        problems.extend(
            Problem((("sources", name),), f"no image field reads this source; add fields.{name}")
            for name in self.sources
            if name not in used
        )
        if problems:
            raise SpecProblems(problems)
        return self

    def _chunk_problems(self, field_name: str) -> list[Problem]:
        field = self.fields[field_name]
        assert field.shape is not None
        key = (("fields", field_name, "chunks"),)
        chunks = self.chunks_of(field_name)
        expected_rank = len(field.shape) + 1
        if len(chunks) != expected_rank:
            return [
                Problem(
                    key,
                    f"needs {expected_rank} numbers (samples, then one per axis of shape "
                    f"{list(field.shape)}), got {list(chunks)}",
                )
            ]
        too_big = [c for c, s in zip(chunks[1:], field.shape, strict=True) if c > s]
        if too_big:
            return [
                Problem(
                    key, f"each axis must fit the shape {list(field.shape)}, got {list(chunks)}"
                )
            ]
        if math.prod(chunks) * np.dtype(field.dtype).itemsize > MAX_CHUNK_BYTES:
            return [Problem(key, f"a chunk must be under 4 GiB, got {list(chunks)}")]
        return []

    def _batch_problems(self) -> list[Problem]:
        rows = {name: self.chunks_of(name)[0] for name in self.image_fields}
        batch = math.lcm(*rows.values())
        if batch <= max([MAX_BATCH_SAMPLES, *rows.values()]):
            return []
        keys = dict.fromkeys(
            ("fields", name, "chunks")
            if self.fields[name].chunks is not None
            else ("storage", "chunk_samples")
            for name in rows
        )
        shown = ", ".join(f"{name} {count}" for name, count in rows.items())
        return [
            Problem(
                tuple(keys),
                f"chunk rows {shown} make decode tasks of {batch} samples (a task holds a whole "
                f"chunk of every image field: their least common multiple); at most "
                f"{MAX_BATCH_SAMPLES} or the largest chunk rows keeps memory bounded: use chunk "
                f"rows that divide one another, e.g. the same for every field",
            )
        ]

    # Derived views; computed, never stored, so they cannot drift from the config.
    def source_of(self, field_name: str) -> str:
        """The source a field reads: ``source``, else the same-named source, else the first."""
        field = self.fields[field_name]
        return source_for(
            field_name, source=field.source, is_text=field.is_text, sources=list(self.sources)
        )

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


def _name_problem(name: str, what: str) -> str | None:
    if not re.match(NAME_PATTERN, name) or name in RESERVED_NAMES:
        return (
            f"{what} name {name!r} must match {NAME_PATTERN} and not be one of "
            f"{sorted(RESERVED_NAMES)}"
        )
    return None


def _check_name(name: str, what: str) -> None:
    problem = _name_problem(name, what)
    if problem is not None:
        raise ValueError(problem)


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
