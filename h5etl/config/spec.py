"""The config contract: the frozen, validated ``Spec`` a build runs from.

One pydantic model per concern, unknown keys refused; values are checked against each other
(chunks against shapes, fields against sources) by ``h5etl.config.rules``, called from ``Spec``'s
model validator. Reading YAML is ``h5etl.config.load``'s job.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    PlainValidator,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from h5etl.config import rules
from h5etl.config.calls import SampleCallModel
from h5etl.config.fields import ArrayField, FieldSpec, SeriesField
from h5etl.config.rules import NAME_PATTERN, check_name
from h5etl.config.sections import (
    Compression,
    DecodeSpec,
    GroupBy,
    PadSpec,
    SourceSpec,
    SpecProblems,
    StorageSpec,
    Strict,
)
from h5etl.config.storable import AttrValue, Text, attr_name_problem
from h5etl.errors import ConfigError
from h5etl.format import contract as fileformat
from h5etl.release.naming import DEFAULT_OUTPUT

__all__ = ["Spec", "spec_sha256", "spec_text"]

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
        fileformat.LAYOUT_ATTR,
        fileformat.SPLIT_POLICY_ATTR,
        fileformat.PARENT_ATTR,
        *fileformat.STORY_ATTRS,
    }
)  # file attributes every build writes (provenance.file_attrs)

PathKey = tuple[str, ...]


def _output_place(value: Any) -> Path | str:
    """``output:`` as a Path, or an ``s3://`` URL as its normal form (a str)."""
    from h5etl.remote.errors import RemoteUsageError
    from h5etl.remote.location import is_url, parse_location

    if isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise ValueError("output must be a folder or an s3:// URL")
    if not is_url(value):
        return Path(value)
    try:
        place = parse_location(value)
    except RemoteUsageError as exc:
        raise ValueError(exc.message) from None
    if place.protocol != "s3":
        raise ValueError(f"releases are published to a folder or s3://, not {place.protocol}://")
    return place.url  # ("output",) or ("sources", <name>, "dir")


class Spec(Strict):
    """A validated build config; paths are absolute, recipe defaults applied.

    A spec read from a file also knows where it came from (``config_file``, and the paths as the
    config wrote them relative to its folder), so the stored config and its digest hold
    relative paths and stay the same when the project folder moves. That origin is no field:
    YAML cannot set it and it is not part of ``spec_text``.
    """

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=100)]
    pipeline: str = "segmentation"
    # a local folder, or an s3:// URL (``h5etl.release.remote_folder``): a URL stays a str
    output: Annotated[Path | str, PlainValidator(_output_place)] = Path(DEFAULT_OUTPUT)
    description: Text = ""
    notes: Text = ""  # release notes: stored as the `notes` attribute, not in the config text
    attrs: dict[str, AttrValue] = Field(default_factory=dict)
    sources: Annotated[dict[str, SourceSpec], Field(min_length=1)]
    splits: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: {"train": 1.0}
    )
    seed: int = 0
    group_by: GroupBy | None = None  # written as splits.group_by (see _group_by_in_splits)
    fields: Annotated[dict[str, FieldSpec], Field(min_length=1)]
    # sample-level user code (issue 28): each call sees several fields and returns them
    transforms: list[SampleCallModel] = Field(default_factory=list)
    layout: str = fileformat.DEFAULT_TEMPLATE
    stratify: str | None = None  # a label field: each class split in the split fractions
    storage: StorageSpec = StorageSpec()
    pad: PadSpec = PadSpec()
    decode: DecodeSpec = DecodeSpec()
    on_error: Literal["skip", "fail"] = "skip"
    # the loss guards (h5etl.history.build_report): a build that loses more does not publish
    max_rejects: Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0, lt=1)] | None = 0.05
    max_shrink: Annotated[float, Field(ge=0, le=1)] | None = 0.1  # of the parent's samples
    allow_empty: bool = False  # publish a release with an empty split or class
    _config_file: Path | None = PrivateAttr(default=None)
    _config_dir: Path | None = PrivateAttr(default=None)
    _written_paths: dict[PathKey, str] = PrivateAttr(default_factory=dict)
    _inferred_kinds: dict[str, str] = PrivateAttr(default_factory=dict)
    _loss_allowed: bool = PrivateAttr(default=False)  # build --allow-loss: not in the config

    @property
    def output_path(self) -> Path:
        """``output`` as the local folder it is (ValueError for an ``s3://`` output)."""
        if isinstance(self.output, str):
            raise ValueError(f"the output {self.output} is no local folder")
        return self.output

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

    def with_notes(self, notes: str | None) -> Spec:
        """This spec with the release notes of the command line (they replace the config's).

        Raises:
            ConfigError: the notes are no text HDF5 stores (a NUL character).
        """
        if notes is None:
            return self
        try:
            TypeAdapter(Text).validate_python(notes)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ConfigError(reason, key="--notes") from exc
        return self.model_copy(update={"notes": notes})

    def allowing_loss(self) -> Spec:
        """This spec, for a build whose loss is intended (``--allow-loss``): the loss guards
        warn instead of failing it. Its config text is this one's."""
        copy = self.model_copy()
        copy._loss_allowed = True
        return copy

    @property
    def loss_allowed(self) -> bool:
        return self._loss_allowed

    @property
    def inferred_kinds(self) -> dict[str, str]:
        """Fields the config gave no ``kind:``, with the kind their keys implied."""
        return dict(self._inferred_kinds)

    @property
    def config_file(self) -> Path | None:
        """The absolute path of the config file this spec was read from, if any."""
        return self._config_file

    def stored_path(self, key: PathKey, value: Path | str) -> str:
        """How a path is stored: as the config wrote it relative to its folder, while it still
        names the same place; otherwise (written absolute, or replaced in code) absolute. A
        URL (a source on object storage) as it is."""
        if isinstance(value, str):
            return value
        written = self._written_paths.get(key)
        if (
            written is not None
            and self._config_dir is not None
            and self._config_dir / written == value
        ):
            return written
        return str(value)

    @model_validator(mode="before")
    @classmethod
    def _group_by_in_splits(cls, data: Any) -> Any:
        """``splits.group_by`` is no split: it moves to ``group_by`` (``spec_text`` puts it
        back), so ``splits`` stays a mapping of fractions."""
        if not isinstance(data, dict):
            return data
        if "group_by" in data:
            raise ValueError("group_by belongs under splits: splits: {..., group_by: ...}")
        splits = data.get("splits")
        if isinstance(splits, dict) and "group_by" in splits:
            data = dict(data)
            data["splits"] = {k: v for k, v in splits.items() if k != "group_by"}
            data["group_by"] = splits["group_by"]
        return data

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
            check_name(split, "split")
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
        problems = rules.spec_problems(self)
        if problems:
            raise SpecProblems(problems)
        return self

    # Derived views; computed, never stored, so they cannot drift from the config.
    def kind_of(self, field_name: str) -> str:
        return self.fields[field_name].kind

    def array_spec(self, field_name: str) -> ArrayField:
        field = self.fields[field_name]
        assert isinstance(field, ArrayField), f"{field_name} is no array field"
        return field

    def source_of(self, field_name: str) -> str | None:
        """The source whose files a field reads (or whose file names it uses); None for a
        field computed from a table or from another field."""
        return self.fields[field_name].source_name(field_name, list(self.sources))

    def reads_content(self, field_name: str) -> bool:
        """Whether the field reads its source's files (not only their names)."""
        return self.fields[field_name].reads_files

    def chunks_of(self, field_name: str) -> tuple[int, ...]:
        """The HDF5 chunk shape of an array field, sample axis first."""
        field = self.array_spec(field_name)
        if field.chunks is not None:
            return tuple(field.chunks)
        shape = field.shape or ()
        return (self.storage.chunk_samples, *shape)

    def compression_of(self, field_name: str) -> Compression:
        return self.array_spec(field_name).compression or self.storage.compression

    def shuffle_of(self, field_name: str) -> bool:
        own = self.array_spec(field_name).shuffle
        return self.storage.shuffle if own is None else own

    @property
    def image_fields(self) -> list[str]:
        """The fixed-shape array fields (images and masks): workers compress their chunks."""
        return [n for n, f in self.fields.items() if isinstance(f, ArrayField)]

    @property
    def text_fields(self) -> list[str]:
        return [n for n, f in self.fields.items() if f.kind == "text"]

    @property
    def batch_samples(self) -> int:
        """Samples per decode task: a whole chunk of every array field (their lcm); a series
        cut to a fixed size stores fixed arrays of ``storage.chunk_samples`` rows a chunk."""
        rows = [self.chunks_of(name)[0] for name in self.image_fields]
        if any(isinstance(f, SeriesField) and (f.fixed or f.window) for f in self.fields.values()):
            rows.append(self.storage.chunk_samples)
        return math.lcm(*rows)


_LAST_TEXT: list[tuple[Spec, str]] = []  # the last spec's text: a build asks five times


def spec_text(spec: Spec) -> str:
    """The resolved config as YAML, as stored in every release it builds (a spec is frozen:
    its text is made once for the spec asked last, 7 ms of YAML a time here).

    Paths the config wrote relative to its folder stay relative, so a moved or copied project
    stores (and hashes) the same text. ``decode`` (where decoding runs) is left out: a build on
    a cluster stores the text a local build stores, and a killed one resumes on either. So are
    the notes: they are the release's own attribute, and new notes must not make a build's
    config another (``--resume``).
    """
    last = _LAST_TEXT[:1]
    if last and last[0][0] is spec:
        return last[0][1]
    data = spec.model_dump(mode="json", by_alias=True, exclude={"notes"})
    del data["decode"]  # where decoding ran: how the release was built, not what it holds
    data["fields"] = {
        name: {"kind": field.pop("kind"), **_without_unused_calls(field)}
        for name, field in data["fields"].items()
    }
    if not data["transforms"]:  # configs without user code keep their text and digest
        del data["transforms"]
    group_by = data.pop("group_by")
    if group_by is not None:
        data["splits"]["group_by"] = {k: v for k, v in group_by.items() if v is not None}
    if isinstance(spec.output, Path):  # a URL is stored as it is
        data["output"] = spec.stored_path(("output",), spec.output)
    if spec.storage.page_size is None:  # the default: configs from before it keep their digest
        del data["storage"]["page_size"]
    for name, source in spec.sources.items():
        data["sources"][name]["dir"] = spec.stored_path(("sources", name, "dir"), source.dir)
        if source.entries == "files":  # the default: configs from before it keep their digest
            del data["sources"][name]["entries"]
    for name, field in spec.fields.items():
        table = getattr(getattr(field, "from_", None), "table", None)
        if table is not None:
            key = ("fields", name, "from", "table")
            data["fields"][name]["from"]["table"] = spec.stored_path(key, table)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    _LAST_TEXT[:] = [(spec, text)]
    return text


def _without_unused_calls(field: dict[str, Any]) -> dict[str, Any]:
    """A field's config without the user-code keys it does not use (issue 28), so a config
    without them stores the text (and digest) it stored before they existed."""
    if not field.get("transform"):
        field.pop("transform", None)
    derive = field.get("derive")
    if isinstance(derive, dict):
        for key in ("call", "args"):
            if derive.get(key) is None:
                derive.pop(key, None)
    return field


def spec_sha256(spec: Spec) -> str:
    return hashlib.sha256(spec_text(spec).encode()).hexdigest()
