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

from h5etl import fileformat
from h5etl.fieldspecs import (
    FieldSpec,
    ImageField,
    JsonRef,
    LabelField,
    MaskField,
    TextField,
    ValueField,
)
from h5etl.specparts import (
    Compression,
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
RESERVED_NAMES = frozenset({fileformat.LINEAGE, fileformat.DIAGNOSTICS})
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
    field_name: str, *, source: str | None, reads_own_name: bool, sources: Sequence[str]
) -> str:
    """The source a field reads: ``source``, else (an image or mask) the same-named source,
    else the first source."""
    if source is not None:
        return source
    if field_name in sources or reads_own_name or not sources:
        return field_name
    return sources[0]


def unknown_source(source: str, sources: Iterable[str], *, implicit: bool) -> str:
    """The message for a field reading a source that does not exist, with a likely fix."""
    known = sorted(sources)
    text = f"no source named {source!r}"
    if implicit:
        text += " (an image or mask field reads the source of its own name unless it sets source)"
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
    layout: str = fileformat.DEFAULT_TEMPLATE
    stratify: str | None = None  # a label field: each class split in the split fractions
    storage: StorageSpec = StorageSpec()
    pad: PadSpec = PadSpec()
    on_error: Literal["skip", "fail"] = "skip"
    max_rejects: Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0, lt=1)] | None = None
    _config_file: Path | None = PrivateAttr(default=None)
    _config_dir: Path | None = PrivateAttr(default=None)
    _written_paths: dict[PathKey, str] = PrivateAttr(default_factory=dict)
    _inferred_kinds: dict[str, str] = PrivateAttr(default_factory=dict)

    def located(
        self,
        *,
        config_dir: Path,
        config_file: Path | None,
        written_paths: Mapping[PathKey, str],
        inferred_kinds: Mapping[str, str] | None = None,
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
        copy._inferred_kinds = dict(inferred_kinds or {})
        return copy

    @property
    def inferred_kinds(self) -> dict[str, str]:
        """Fields the config gave no ``kind:``, with the kind their keys implied."""
        return dict(self._inferred_kinds)

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

    @field_validator("layout")
    @classmethod
    def _layout_template(cls, template: str) -> str:
        if template not in fileformat.TEMPLATES:
            raise ValueError(
                f"layout must be one of {', '.join(repr(t) for t in fileformat.TEMPLATES)}, "
                f"got {template!r}"
            )
        return template

    @model_validator(mode="after")
    def _fields_match_sources(self) -> Spec:
        problems: list[Problem] = []
        chunk_problems: list[Problem] = []  # of every array field
        for field_name, field in self.fields.items():
            key = ("fields", field_name)
            name_problem = _name_problem(field_name, "field")
            if name_problem is not None:
                problems.append(Problem((key,), name_problem))
                continue
            problems.extend(self._source_problems(field_name, field))
            problems.extend(self._reference_problems(field_name, field))
            if isinstance(field, ImageField | MaskField):
                found = self._chunk_problems(field_name)
                chunk_problems.extend(found)
                problems.extend(found)
            if isinstance(field, MaskField) and self.pad.mask_fill not in field.values:
                problems.append(
                    Problem(
                        (("pad", "mask_fill"),),
                        f"padding of mask fields.{field_name} must be one of its values "
                        f"{list(field.values)}, got {self.pad.mask_fill}",
                    )
                )
        if not chunk_problems and self.image_fields:  # chunk rows are known and sound
            problems.extend(self._batch_problems())
        if not self.image_fields:
            problems.append(Problem((("fields",),), "at least one image or mask field is needed"))
        problems.extend(self._stratify_problems())
        used = {self.source_of(name) for name in self.fields if self.reads_content(name)}
        problems.extend(
            Problem(
                (("sources", name),),
                f"no field reads this source's files; add fields.{name}",
            )
            for name in self.sources
            if name not in used
        )
        if problems:
            raise SpecProblems(problems)
        return self

    def _source_problems(self, field_name: str, field: FieldSpec) -> list[Problem]:
        key = ("fields", field_name)
        source = self.source_of(field_name)
        if source is None or source in self.sources:
            return []
        if isinstance(field, TextField | ValueField) and isinstance(field.from_, JsonRef):
            return [
                Problem(
                    ((*key, "from", "json"),),
                    unknown_source(source, self.sources, implicit=False),
                )
            ]
        implicit = getattr(field, "source", None) is None
        return [
            Problem(
                (key if implicit else (*key, "source"),),
                unknown_source(source, self.sources, implicit=implicit),
            )
        ]

    def _reference_problems(self, field_name: str, field: FieldSpec) -> list[Problem]:
        """A derived, scaled or mask field names the image field it follows: it must be one."""
        key = ("fields", field_name)
        plain = [
            n for n, f in self.fields.items() if isinstance(f, ImageField) and f.derive is None
        ]
        refs: list[tuple[tuple[str, ...], str]] = []
        if isinstance(field, ImageField) and field.derive is not None:
            refs.append(((*key, "derive", "from"), field.derive.from_field))
        if isinstance(field, ImageField) and field.scale is not None:
            refs.append(((*key, "scale", "of"), field.scale.of))
        if isinstance(field, MaskField) and field.of is not None:
            refs.append(((*key, "of"), field.of))
        return [
            Problem(
                (where,),
                f"names {target!r}, which is not an image field read from files "
                f"(those are: {', '.join(plain) or 'none'})",
            )
            for where, target in refs
            if target not in plain or target == field_name
        ]

    def _stratify_problems(self) -> list[Problem]:
        if self.stratify is None or isinstance(self.fields.get(self.stratify), LabelField):
            return []
        labels = [n for n, f in self.fields.items() if isinstance(f, LabelField)]
        return [
            Problem(
                (("stratify",),),
                f"must name a label field, got {self.stratify!r} "
                f"(label fields: {', '.join(labels) or 'none'})",
            )
        ]

    def _chunk_problems(self, field_name: str) -> list[Problem]:
        field = self.fields[field_name]
        assert isinstance(field, ImageField | MaskField)
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
            if self.array_spec(name).chunks is not None
            else ("storage", "chunk_samples")
            for name in rows
        )
        shown = ", ".join(f"{name} {count}" for name, count in rows.items())
        return [
            Problem(
                tuple(keys),
                f"chunk rows {shown} make decode tasks of {batch} samples (a task holds a whole "
                f"chunk of every array field: their least common multiple); at most "
                f"{MAX_BATCH_SAMPLES} or the largest chunk rows keeps memory bounded: use chunk "
                f"rows that divide one another, e.g. the same for every field",
            )
        ]

    # Derived views; computed, never stored, so they cannot drift from the config.
    def kind_of(self, field_name: str) -> str:
        return self.fields[field_name].kind

    def array_spec(self, field_name: str) -> ImageField | MaskField:
        field = self.fields[field_name]
        assert isinstance(field, ImageField | MaskField), f"{field_name} is no array field"
        return field

    def source_of(self, field_name: str) -> str | None:
        """The source whose files a field reads (or whose file names it uses); None for a
        field computed from a table or from another field."""
        field = self.fields[field_name]
        if isinstance(field, ImageField) and field.derive is not None:
            return None
        if isinstance(field, TextField | ValueField | LabelField):
            origin = field.from_
            if isinstance(origin, JsonRef):
                return origin.json_source
            if not isinstance(origin, str):  # a table
                return None
        return source_for(
            field_name,
            source=getattr(field, "source", None),
            reads_own_name=isinstance(field, ImageField | MaskField),
            sources=list(self.sources),
        )

    def reads_content(self, field_name: str) -> bool:
        """Whether the field reads its source's files (not only their names)."""
        field = self.fields[field_name]
        if isinstance(field, ImageField):
            return field.derive is None
        if isinstance(field, MaskField):
            return True
        origin = getattr(field, "from_", None)
        return isinstance(origin, JsonRef)

    def chunks_of(self, field_name: str) -> tuple[int, ...]:
        """The HDF5 chunk shape of an array field, sample axis first."""
        field = self.array_spec(field_name)
        if field.chunks is not None:
            return field.chunks
        shape = field.shape or ()
        return (self.storage.chunk_samples, *shape)

    def compression_of(self, field_name: str) -> Compression:
        field = self.fields[field_name]
        own = field.compression if isinstance(field, ImageField | MaskField) else None
        return own or self.storage.compression

    def shuffle_of(self, field_name: str) -> bool:
        field = self.fields[field_name]
        own = field.shuffle if isinstance(field, ImageField | MaskField) else None
        return self.storage.shuffle if own is None else own

    @property
    def image_fields(self) -> list[str]:
        """The fixed-shape array fields (images and masks): workers compress their chunks."""
        return [n for n, f in self.fields.items() if isinstance(f, ImageField | MaskField)]

    @property
    def text_fields(self) -> list[str]:
        return [n for n, f in self.fields.items() if isinstance(f, TextField)]

    @property
    def batch_samples(self) -> int:
        """Samples per decode task: a whole chunk of every array field (their lcm)."""
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
    data = spec.model_dump(mode="json", by_alias=True)
    data["fields"] = {
        name: {"kind": field.pop("kind"), **field} for name, field in data["fields"].items()
    }
    data["output"] = spec.stored_path(("output",), spec.output)
    for name, source in spec.sources.items():
        data["sources"][name]["dir"] = spec.stored_path(("sources", name, "dir"), source.dir)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def spec_sha256(spec: Spec) -> str:
    return hashlib.sha256(spec_text(spec).encode()).hexdigest()
