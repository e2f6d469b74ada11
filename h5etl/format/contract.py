"""The file-format contract: every name a release file is made of, in one place.

Dataset paths (from the layout template), the attributes a build writes, the ``/diagnostics``
layout, the statistics attributes and the layout record: a JSON root attribute that says which
dataset holds which field of which split, its kind and its storage column. The sink writes it;
``check``, ``preview`` and the readers read it (``read_layout``), so none of them assumes
``/train/image``. Releases of older versions carry no record: ``read_layout`` infers one from
their groups and stored config, exactly as those versions laid files out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

# h5py and yaml load where an older release is read (``_inferred_layout``): the workers
# import this module for its names and never read one.
if TYPE_CHECKING:
    import h5py

__all__ = [
    "COLUMN_TYPES",
    "DEFAULT_TEMPLATE",
    "DIAGNOSTICS",
    "DIAGNOSTICS_DATASETS",
    "FORMAT",
    "LAYOUT_ATTR",
    "LINEAGE",
    "PARENT_ATTR",
    "PARTS_ATTR",
    "REJECTS_DATASET",
    "REJECT_COLUMNS",
    "REQUIRED_ATTRS",
    "SAMPLE_GROUP",
    "SAMPLE_KEY",
    "SAMPLE_KEYS",
    "SPLIT_POLICY_ATTR",
    "STAT_ATTRS",
    "STORY_ATTRS",
    "TEMPLATES",
    "FieldRecord",
    "LayoutRecord",
    "dataset_path",
    "read_layout",
]

# version of the layout record; a reader refuses records newer than it knows.
# 2: fields of several storage columns ("columns"), ragged columns, column "none".
FORMAT = 2
LAYOUT_ATTR = "layout"  # root attribute: the layout record, JSON
DIAGNOSTICS = "diagnostics"  # root group: build facts as attributes
DATASETS_GROUP = "datasets"  # in /diagnostics: one group per dataset, digests and sizes
DIAGNOSTICS_DATASETS = f"{DIAGNOSTICS}/{DATASETS_GROUP}"
BLOCK_DIGESTS = "block_sha256"  # in each of those groups: S64 digests of its row blocks
LINEAGE = "source_sha256"  # per split: (N, sources) S64, the SHA-256 of each input file
LINEAGE_COLUMNS_ATTR = "columns"  # on the lineage dataset: the source names, in order
# The sample keys, per split, row-aligned with the split's fields and lineage:
SAMPLE_KEY = "sample_key"  # (N,) UTF-8: the name the sample's split is seeded by (NFC)
SAMPLE_GROUP = "sample_group"  # (N,) UTF-8: the sample's group (splits.group_by), "" if none
SAMPLE_KEYS = (SAMPLE_KEY, SAMPLE_GROUP)
# Root attributes (the required ones, then the tool's version, which older files may lack)
NAME_ATTR, VERSION_ATTR, CREATED_AT_ATTR = "name", "version", "created_at"
CONFIG_ATTR, CONFIG_SHA256_ATTR, FINGERPRINT_ATTR = "config", "config_sha256", "source_fingerprint"
REQUIRED_ATTRS = (
    NAME_ATTR,
    VERSION_ATTR,
    CREATED_AT_ATTR,
    CONFIG_ATTR,
    CONFIG_SHA256_ATTR,
    FINGERPRINT_ATTR,
)
TOOL_VERSION_ATTR = "h5etl_version"
# Root attribute, JSON: how the splits were assigned (h5etl.plan.split_assign): rule (exact | sticky
# | grouped), fractions, seed, stratify, group_by, parent (version or null), kept, assigned,
# dropped, moved, counts per split
SPLIT_POLICY_ATTR = "split_policy"
# Root attribute, JSON: the release an incremental build started from and what it reused:
# version, source_fingerprint, samples_reused, bytes_reused (stored chunk bytes copied),
# samples_decoded; absent when the build decoded everything
PARENT_ATTR = "parent"
# Root attribute, JSON, of a virtual release (build --shards K --vds): its part files in write
# order, each {file, bytes, shard, index} (h5etl.format.partfiles); the identity is what each part
# carries as its own root attributes SHARD_ATTR and SHARD_INDEX_ATTR.
PARTS_ATTR = "parts"
SHARD_ATTR, SHARD_INDEX_ATTR = "h5etl_shard", "shard_index"
# The release's story (root attributes; releases before them carry none): its notes, the
# release it was built after and the semantic label of the change from it (h5etl.history.diff).
NOTES_ATTR = "notes"
PARENT_VERSION_ATTR, PARENT_FINGERPRINT_ATTR = "parent_version", "parent_fingerprint"
CHANGE_ATTR, CHANGE_SUMMARY_ATTR = "change", "change_summary"  # major|minor|patch|initial
STORY_ATTRS = (
    NOTES_ATTR,
    PARENT_VERSION_ATTR,
    PARENT_FINGERPRINT_ATTR,
    CHANGE_ATTR,
    CHANGE_SUMMARY_ATTR,
)
# In DIAGNOSTICS: one row per rejected input, as in the rejects report beside the release
REJECTS_DATASET = "rejects"
# a field's layout record entry naming the user code that made its values (issue 28): its
# digest (what an incremental build compares) and each call; only on fields a transform made
TRANSFORMS_KEY = "transforms"
REJECT_COLUMNS = ("path", "stage", "reason", "detail", "key")
# On the DIAGNOSTICS group: reject counts by reason (rejects_<reason>, rejects_total)
REJECTS_PREFIX = "rejects_"
REJECTS_TOTAL = "rejects_total"
# Attributes of each DIAGNOSTICS_DATASETS node (beside its BLOCK_DIGESTS dataset)
NODE_DATASET, NODE_SHA256, NODE_BLOCK_ROWS = "dataset", "sha256", "block_rows"
NODE_RAW_BYTES, NODE_STORED_BYTES, NODE_RATIO = "raw_bytes", "stored_bytes", "ratio"
CLASSES_ATTR = "classes"  # on a label dataset: the class names its int64 values index
# FieldRecord.extra keys: a label's class names (CLASSES_ATTR), a mask's declared values
VALUES_KEY = "values"
# Normalisation statistics on a numeric dataset (per channel, over the unpadded pixels,
# float64), and the value histogram of masks and labels.
STAT_ATTRS = ("mean", "std", "min", "max", "count")
HISTOGRAM_ATTRS = ("histogram_values", "histogram_counts")
# HDF5 filter ids a release's datasets may use: built into HDF5 (deflate is gzip), h5py's own
# (lzf), hdf5plugin's (Blosc, Zstd); readers decode these outside HDF5, check names them.
FILTER_DEFLATE, FILTER_SHUFFLE, FILTER_FLETCHER32 = 1, 2, 3
FILTER_LZF, FILTER_BLOSC, FILTER_ZSTD = 32000, 32001, 32015
DEFAULT_TEMPLATE = "{split}/{field}"
TEMPLATES = ("{split}/{field}", "{field}_{split}")
# "none": a field with no dataset of its own name, only its ``columns`` (a recording's channels)
ColumnType = Literal["fixed", "text", "ragged", "none"]
COLUMN_TYPES: tuple[ColumnType, ...] = ("fixed", "text", "ragged", "none")
OFFSETS_SUFFIX = "_offsets"  # a ragged column: values at its path, (N+1,) int64 offsets here
FIELD_KEY = "field"  # in a column's record (``LayoutRecord.storage``): the field it belongs to
COLUMNS_KEY = "columns"  # in a field's JSON record: its other storage columns, by dataset name


def offsets_path(path: str) -> str:
    """Where a ragged column at ``path`` keeps its (N+1,) int64 offsets."""
    return path + OFFSETS_SUFFIX


def dataset_path(template: str, split: str, field_name: str) -> str:
    """The absolute dataset path of a field of a split, e.g. ``/train/image`` or ``/x_train``."""
    return "/" + template.format(split=split, field=field_name)


def diagnostics_node(path: str) -> str:
    """The ``/diagnostics/datasets`` member that describes the dataset at ``path``."""
    return path.strip("/").replace("/", ".")


@dataclass(frozen=True, slots=True)
class FieldRecord:
    """One field as a release records it: its kind, storage column and kind-specific facts."""

    kind: str
    column: ColumnType
    dtype: str
    shape: tuple[int, ...]  # per sample (per row of values, ragged); () for a scalar or text
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. classes, values, source
    # the field's other storage columns by dataset name (``<field>_<suffix>``), each described
    # like a field (its own column, dtype, shape; its dataset attributes in ``extra``)
    columns: Mapping[str, FieldRecord] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "column": self.column,
            "dtype": self.dtype,
            "shape": list(self.shape),
            **self.extra,
        }
        if self.columns:
            out[COLUMNS_KEY] = {
                name: {k: v for k, v in record.as_json().items() if k != "kind"}
                for name, record in self.columns.items()
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], kind: str | None = None) -> FieldRecord:
        known = {"kind", "column", "dtype", "shape", COLUMNS_KEY}
        own = str(data["kind"]) if kind is None else kind
        return cls(
            own,
            data["column"],
            str(data["dtype"]),
            tuple(int(n) for n in data["shape"]),
            {k: v for k, v in data.items() if k not in known},
            {
                str(name): cls.from_json(column, own)
                for name, column in (data.get(COLUMNS_KEY) or {}).items()
            },
        )


@dataclass(frozen=True, slots=True)
class LayoutRecord:
    """Which dataset holds which field of which split; written as JSON in ``LAYOUT_ATTR``."""

    template: str
    splits: tuple[str, ...]
    fields: Mapping[str, FieldRecord]
    inferred: bool = False  # no record in the file: read from an older release's shape
    samples: tuple[str, ...] = ()  # the sample-key datasets (older releases: none)

    def path(self, split: str, field_name: str) -> str:
        return dataset_path(self.template, split, field_name)

    def lineage_path(self, split: str) -> str:
        return dataset_path(self.template, split, LINEAGE)

    def sample_paths(self, split: str) -> dict[str, str]:
        """The sample-key dataset paths in ``split`` (empty for older releases)."""
        return {name: dataset_path(self.template, split, name) for name in self.samples}

    def paths(self, split: str) -> dict[str, str]:
        """Every storage column's dataset path in ``split`` (``storage`` order): a field of
        one column is one dataset named like it. A ragged column's offsets sit beside its
        path (``offsets_path``)."""
        return {name: self.path(split, name) for name in self.storage}

    @property
    def storage(self) -> dict[str, FieldRecord]:
        """Every storage column by dataset name, in field order, each described as a field:
        a field's main column is its record (without ``columns``), its other columns carry
        the field's name under ``FIELD_KEY``. A field of column "none" has no main one."""
        out: dict[str, FieldRecord] = {}
        for name, record in self.fields.items():
            if record.column != "none":
                out[name] = FieldRecord(
                    record.kind, record.column, record.dtype, record.shape, record.extra
                )
            for column, part in record.columns.items():
                extra = {**part.extra, FIELD_KEY: name}
                out[column] = FieldRecord(part.kind, part.column, part.dtype, part.shape, extra)
        return out

    def field_of(self, column: str) -> str:
        """The field a storage column belongs to."""
        return str(self.storage[column].extra.get(FIELD_KEY, column))

    @property
    def format(self) -> int:
        """The oldest record format that holds this layout: a release of fixed and text
        columns only stays readable by the versions before ragged columns."""
        plain = all(r.column in ("fixed", "text") and not r.columns for r in self.fields.values())
        return 1 if plain else FORMAT

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": self.format,
                "template": self.template,
                "splits": list(self.splits),
                "lineage": LINEAGE,
                "samples": list(self.samples),
                "fields": {name: record.as_json() for name, record in self.fields.items()},
            },
            sort_keys=False,
        )

    @classmethod
    def from_json(cls, text: str) -> LayoutRecord:
        """Parse a record. Raises ValueError when it is not one this version can read."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the layout record is damaged (not JSON: {exc})") from exc
        if not isinstance(data, dict) or "fields" not in data:
            raise ValueError("the layout record is damaged (not a JSON object with fields)")
        try:
            version = int(data.get("format", 0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the layout record is damaged (format {exc})") from exc
        if version > FORMAT:
            raise ValueError(
                f"layout record format {version} is newer than this h5etl reads ({FORMAT}): "
                f"upgrade h5etl"
            )
        try:
            record = cls(
                str(data["template"]),
                tuple(str(s) for s in data["splits"]),
                {str(n): FieldRecord.from_json(r) for n, r in data["fields"].items()},
                samples=tuple(str(n) for n in data.get("samples", ())),
            )
            record.path("split", "field")  # a template of other placeholders fails here
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"the layout record is damaged ({type(exc).__name__}: {exc})") from exc
        bad = [n for n, r in record.storage.items() if r.column not in COLUMN_TYPES]
        if bad:
            raise ValueError(f"the layout record is damaged (unknown column of {bad[0]!r})")
        return record


def read_layout(handle: h5py.File) -> LayoutRecord:
    """The layout a release records, or (a release of an older version) the one it has.

    Raises:
        ValueError: the record is damaged or newer than this version reads.
    """
    text = handle.attrs.get(LAYOUT_ATTR)
    if text is not None:
        return LayoutRecord.from_json(text.decode() if isinstance(text, bytes) else str(text))
    return _inferred_layout(handle)


def _stored_fields(handle: h5py.File) -> dict[str, Any]:
    import yaml

    from h5etl.format import yaml_load

    try:
        config = yaml_load.safe_load(str(handle.attrs.get("config", ""))) or {}
    except (yaml.YAMLError, RecursionError):
        return {}
    fields = config.get("fields") if isinstance(config, dict) else None
    return fields if isinstance(fields, dict) else {}


def _inferred_layout(handle: h5py.File) -> LayoutRecord:
    """Before the record: ``/<split>/<field>``, kinds as the config implied them then."""
    import h5py

    splits = tuple(
        name
        for name, node in handle.items()
        if name != DIAGNOSTICS and isinstance(node, h5py.Group)
    )
    config = _stored_fields(handle)
    fields: dict[str, FieldRecord] = {}
    for split in splits:
        for name, node in handle[split].items():
            beside = name in (LINEAGE, *SAMPLE_KEYS)
            if beside or name in fields or not isinstance(node, h5py.Dataset):
                continue
            entry = config.get(name)
            declared: dict[str, Any] = entry if isinstance(entry, dict) else {}
            if h5py.check_string_dtype(node.dtype) is not None:
                fields[name] = FieldRecord("text", "text", "str", ())
            elif declared.get("values") is not None:
                values = [int(v) for v in declared["values"]]
                fields[name] = FieldRecord(
                    "mask", "fixed", str(node.dtype), tuple(node.shape[1:]), {"values": values}
                )
            else:
                fields[name] = FieldRecord("image", "fixed", str(node.dtype), tuple(node.shape[1:]))
    return LayoutRecord(DEFAULT_TEMPLATE, splits, fields, inferred=True)


# --- reader-side helpers: check, preview and the readers ----------------------------------


def split_group(template: str, split: str) -> str | None:
    """The group holding every dataset of ``split`` (``/train``), or None (a flat template)."""
    head, sep, _ = template.partition("/")
    if not sep or "{field}" in head:
        return None
    return "/" + head.format(split=split)


def inferred_layout(handle: h5py.File) -> LayoutRecord:
    """The layout as releases before the record laid files out, whatever ``handle`` records."""
    return _inferred_layout(handle)


def dataset_stats(dataset: h5py.Dataset) -> dict[str, Any]:
    """The statistics and histogram attributes stored on ``dataset``; empty when it has none."""
    return {k: dataset.attrs[k] for k in (*STAT_ATTRS, *HISTOGRAM_ATTRS) if k in dataset.attrs}


def class_names(record: FieldRecord, dataset: h5py.Dataset | None = None) -> tuple[str, ...]:
    """A label field's class names: from its record, else from its dataset's attribute."""
    names = record.extra.get(CLASSES_ATTR)
    if names is None and dataset is not None:
        names = dataset.attrs.get(CLASSES_ATTR)
    if names is None:
        return ()
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def declared_values(record: FieldRecord) -> list[int] | None:
    """A mask field's declared values, or None when the record declares none."""
    values = record.extra.get(VALUES_KEY)
    return None if values is None else [int(v) for v in values]
