"""snapshot: what a release holds, as plain data ``diff`` compares.

Read through the layout record (``fileformat.read_layout``), so any release of any version
gives one: its fields and how each dataset is stored, its attributes, its samples per split
with what identifies them (the per-sample key, else the ``filename`` text field, else the
source SHA-256 lineage, which every release since 0.1 carries), their groups and source
hashes, and the class counts of its labels and the value histograms of its masks. Reads only small
columns: no pixel is decoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from h5etl.errors import UsageError
from h5etl.format import contract as fileformat
from h5etl.format import fileinfo
from h5etl.format.contract import FieldRecord, LayoutRecord

__all__ = [
    "DatasetFacts",
    "Identity",
    "RejectFacts",
    "SampleFacts",
    "Snapshot",
    "WrittenRows",
    "read_snapshot",
    "snapshot_of",
]

Identity = Literal["key", "filename", "sources"]
IDENTITIES: tuple[Identity, ...] = ("key", "filename", "sources")  # strongest first
FILENAME_FIELD = "filename"  # the recipes' text field of each sample's relative path
# Dataset attributes the diff leaves out: they follow from the samples (statistics), are
# compared as class counts (histograms) or repeat the layout record (kind, class names).
DERIVED_ATTRS = frozenset(
    (*fileformat.STAT_ATTRS, *fileformat.HISTOGRAM_ATTRS, "kind", fileformat.CLASSES_ATTR)
)
# Root attributes the diff reports in their own sections, not as attribute changes.
OWN_SECTIONS = frozenset(
    {fileformat.LAYOUT_ATTR, fileformat.CONFIG_ATTR, fileformat.CONFIG_SHA256_ATTR}
)


@dataclass(frozen=True, slots=True)
class DatasetFacts:
    """How one field of one split is stored."""

    path: str
    chunks: tuple[int, ...] | None
    codecs: tuple[str, ...]  # filter names with their options, in pipeline order
    attrs: Mapping[str, Any] = field(default_factory=dict)  # without DERIVED_ATTRS


@dataclass(frozen=True, slots=True)
class SampleFacts:
    """One stored sample: where it is and what it holds."""

    split: str
    sources: Mapping[str, str]  # source name -> SHA-256 of its input file
    key: str | None = None  # the per-sample key record, when the release has one
    group: str | None = None  # the sample's group (splits.group_by), from the same record
    filename: str | None = None
    content: str | None = None  # SHA-256 of the stored rows, when the release records it


@dataclass(frozen=True, slots=True)
class RejectFacts:
    """One row of a release's ``/diagnostics/rejects``: a file left out, and why (paths as
    the release stores them, ``release_notes.stored_rejects``)."""

    path: str
    stage: str
    reason: str
    detail: str = ""
    key: str = ""  # the sample's key, as its stored samples carry it


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A release as ``diff`` sees it."""

    path: Path
    name: str
    version: int | None
    created_at: str
    layout: LayoutRecord
    attrs: Mapping[str, Any]  # root attributes, JSON-able, without OWN_SECTIONS
    config: str
    datasets: Mapping[str, Mapping[str, DatasetFacts]]  # split -> field -> facts
    counts: Mapping[str, int]  # samples per split
    samples: tuple[SampleFacts, ...]
    classes: Mapping[str, Mapping[str, Mapping[str, int]]]  # split -> field -> class -> n
    identities: tuple[Identity, ...]  # how its samples can be told apart, strongest first
    rejects: tuple[RejectFacts, ...] | None = None  # None: it stores no rejects table

    @property
    def has_content_hashes(self) -> bool:
        return bool(self.samples) and all(s.content is not None for s in self.samples)


def plain(value: Any) -> Any:
    """An HDF5 attribute value as JSON-able Python (numpy scalars and arrays, bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN: JSON has none, and NaN != NaN
        return "nan"
    return value


def read_snapshot(path: Path) -> Snapshot:
    """The snapshot of the release at ``path`` (a file or its link).

    Raises:
        UsageError: ``path`` is no file (exit code 2).
        CheckFailed: not an HDF5 file, or HDF5 cannot open it (exit code 1).
        ReaderError: its layout record is damaged or newer than this version reads.
    """
    with fileinfo.open_file(path) as handle:
        return snapshot_of(handle, path)


def _layout(handle: h5py.File, path: Path) -> LayoutRecord:
    try:
        return fileformat.read_layout(handle)
    except ValueError as exc:
        from h5etl.errors import ReaderError

        raise ReaderError(str(exc), path=path) from exc


def snapshot_of(
    handle: h5py.File, path: Path, *, written: Mapping[str, Sequence[SampleFacts]] | None = None
) -> Snapshot:
    """The snapshot of an open release (also of one being written, whose attrs are set).

    ``written``: a split's samples as the sink appended them (``WrittenRows``), taken
    instead of read back where they are as many as the split's lineage rows.
    """
    layout = _layout(handle, path)
    if not layout.splits and not layout.fields:
        raise UsageError("not an h5etl release: it holds no split", path=path)
    attrs = {k: plain(v) for k, v in handle.attrs.items() if k not in OWN_SECTIONS}
    version = attrs.get(fileformat.VERSION_ATTR)
    datasets = {split: _datasets(handle, layout, split) for split in layout.splits}
    samples: list[SampleFacts] = []
    counts: dict[str, int] = {}
    fallback = fileinfo.sample_counts(handle)  # samples of a split without lineage
    for split in layout.splits:
        rows = (written or {}).get(split)
        if rows is None or len(rows) != _lineage_rows(handle, layout, split):
            rows = _samples(handle, layout, split)
        counts[split] = len(rows) if rows else fallback[split]
        samples.extend(rows)
    identities: list[Identity] = []
    if samples and all(s.key is not None for s in samples):
        identities.append("key")
    if samples and all(s.filename is not None for s in samples):
        identities.append("filename")
    identities.append("sources")
    return Snapshot(
        path=path,
        name=str(attrs.get(fileformat.NAME_ATTR, path.stem)),
        version=int(version) if isinstance(version, int) else None,
        created_at=str(attrs.get(fileformat.CREATED_AT_ATTR, "")),
        layout=layout,
        attrs=attrs,
        config=str(plain(handle.attrs.get(fileformat.CONFIG_ATTR, ""))),
        datasets=datasets,
        counts=counts,
        samples=tuple(samples),
        classes={split: _classes(handle, layout, split) for split in layout.splits},
        identities=tuple(identities),
        rejects=_rejects(handle),
    )


def _rejects(handle: h5py.File) -> tuple[RejectFacts, ...] | None:
    """The rows of ``/diagnostics/rejects``; None for a release without the table (before
    0.2, or one being written: the sink stores it after the change label is made)."""
    node = handle.get(f"{fileformat.DIAGNOSTICS}/{fileformat.REJECTS_DATASET}")
    if not isinstance(node, h5py.Dataset) or node.dtype.names is None:
        return None
    columns = [c for c in fileformat.REJECT_COLUMNS if c in node.dtype.names]
    rows = node[...] if len(node) else []
    out = []
    for row in rows:
        values = dict.fromkeys(fileformat.REJECT_COLUMNS, "")
        values.update((c, str(plain(row[c]))) for c in columns)
        out.append(RejectFacts(**values))
    return tuple(out)


BLOSC_CNAMES = ("blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd")  # Blosc's codes 0..5
BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")


def _codec(entry: tuple[Any, ...]) -> str:
    """A filter as the config chose it: ``gzip(4)``, ``blosc(lz4, 5, shuffle)``, ``lzf``.

    Values HDF5 fills in itself (element and chunk sizes) are left out: they follow from the
    dtype and the chunks, which the diff compares on their own.
    """
    number, values = int(entry[0]), [int(v) for v in entry[2]]
    name = fileinfo.filter_name(number)
    if number == fileformat.FILTER_DEFLATE and values:
        return f"{name}({values[0]})"
    if number == fileformat.FILTER_ZSTD and values:
        return f"{name}({values[0]})"
    if number == fileformat.FILTER_BLOSC and len(values) >= 7:
        level, shuffle, cname = values[4:7]
        shown = BLOSC_CNAMES[cname] if 0 <= cname < len(BLOSC_CNAMES) else str(cname)
        mode = BLOSC_SHUFFLES[shuffle] if 0 <= shuffle < len(BLOSC_SHUFFLES) else str(shuffle)
        return f"{name}({shown}, {level}, {mode})"
    return name  # shuffle, lzf, fletcher32: nothing the config sets


def _dataset_facts(node: h5py.Dataset) -> DatasetFacts:
    plist = node.id.get_create_plist()
    codecs = tuple(_codec(plist.get_filter(i)) for i in range(plist.get_nfilters()))
    attrs = {k: plain(v) for k, v in node.attrs.items() if k not in DERIVED_ATTRS}
    return DatasetFacts(node.name, node.chunks, codecs, attrs)


def _datasets(handle: h5py.File, layout: LayoutRecord, split: str) -> dict[str, DatasetFacts]:
    out = {}
    for name, path in layout.paths(split).items():
        node = handle.get(path)
        if isinstance(node, h5py.Dataset):
            out[name] = _dataset_facts(node)
    return out


def _texts(node: object) -> list[str] | None:
    if not isinstance(node, h5py.Dataset) or h5py.check_string_dtype(node.dtype) is None:
        return None
    return [str(v) for v in node.asstr("utf-8", "backslashreplace")[...]]


def _lineage_rows(handle: h5py.File, layout: LayoutRecord, split: str) -> int:
    """Rows of the split's lineage dataset (-1: it has none)."""
    lineage = handle.get(layout.lineage_path(split))
    return len(lineage) if isinstance(lineage, h5py.Dataset) else -1


def _samples(handle: h5py.File, layout: LayoutRecord, split: str) -> list[SampleFacts]:
    lineage = handle.get(layout.lineage_path(split))
    if not isinstance(lineage, h5py.Dataset) or lineage.ndim != 2:
        return []
    columns = [str(plain(c)) for c in lineage.attrs.get(fileformat.LINEAGE_COLUMNS_ATTR, [])]
    if len(columns) != lineage.shape[1]:
        columns = [f"source{i}" for i in range(lineage.shape[1])]
    hashes = lineage[...]
    texts = {name: _texts(handle.get(path)) for name, path in layout.sample_paths(split).items()}
    if FILENAME_FIELD in layout.fields and layout.fields[FILENAME_FIELD].column == "text":
        texts[FILENAME_FIELD] = _texts(handle.get(layout.path(split, FILENAME_FIELD)))
    column = {n: v for n, v in texts.items() if v is not None and len(v) == len(hashes)}
    return sample_facts(split, columns, hashes, column)


def sample_facts(
    split: str, sources: Sequence[str], hashes: np.ndarray, texts: Mapping[str, Sequence[str]]
) -> list[SampleFacts]:
    """The facts of a split's rows from its columns: the lineage (S64 digests, a column per
    source) and the texts of the sample keys and the ``filename`` field, where stored."""
    nothing: list[str | None] = [None] * len(hashes)
    keys, groups, filenames = (
        texts.get(name, nothing)
        for name in (fileformat.SAMPLE_KEY, fileformat.SAMPLE_GROUP, FILENAME_FIELD)
    )
    # whole columns at a time: per row and digest in Python, a 3,000-pair release took 0.03 s
    return [
        SampleFacts(split, dict(zip(sources, row, strict=True)), key, group, filename)
        for row, key, group, filename in zip(
            _hex_rows(hashes), keys, groups, filenames, strict=True
        )
    ]


class WrittenRows:
    """Collects each split's samples as the sink appends its small rows (``small_columns``), so
    that the snapshot of the file it finishes need not read them back: that read was most
    of the change label's 0.09 s at the end of an incremental 3,150-pair build, where the
    appends come while the decoders work."""

    def __init__(self) -> None:
        self.samples: dict[str, list[SampleFacts]] = {}

    def __call__(
        self,
        split: str,
        sources: Sequence[str],
        texts: Mapping[str, Sequence[str]],
        lineage: np.ndarray,
    ) -> None:
        """Rows appended to ``split``: its text columns' values and the S64 lineage rows."""
        kept = {name: [str(v) for v in texts[name]] for name in _RECORD_TEXTS if name in texts}
        self.samples.setdefault(split, []).extend(sample_facts(split, sources, lineage, kept))


_RECORD_TEXTS = (fileformat.SAMPLE_KEY, fileformat.SAMPLE_GROUP, FILENAME_FIELD)


def _hex_rows(hashes: np.ndarray) -> list[list[str]]:
    """Each row's stored digests as text (``?`` for a byte that is no ASCII: a damaged one)."""
    try:
        rows: list[list[str]] = hashes.astype(f"U{hashes.dtype.itemsize}").tolist()
    except UnicodeDecodeError:
        return [[bytes(h).decode("ascii", "replace") for h in row] for row in hashes]
    return rows


def _classes(handle: h5py.File, layout: LayoutRecord, split: str) -> dict[str, dict[str, int]]:
    """Samples per class of each label field; pixels per value of each mask (its histogram)."""
    out: dict[str, dict[str, int]] = {}
    for name, record in layout.fields.items():
        node = handle.get(layout.path(split, name))
        if not isinstance(node, h5py.Dataset):
            continue
        if record.kind == "label":
            out[name] = _label_counts(node, record)
        elif fileformat.HISTOGRAM_ATTRS[0] in node.attrs:
            values, counts = (node.attrs[a] for a in fileformat.HISTOGRAM_ATTRS)
            out[name] = {str(int(v)): int(n) for v, n in zip(values, counts, strict=True)}
    return out


def _label_counts(node: h5py.Dataset, record: FieldRecord) -> dict[str, int]:
    names = fileformat.class_names(record, node)
    values = np.asarray(node[...]).astype(np.int64, copy=False).reshape(-1)
    found = np.bincount(values[values >= 0], minlength=len(names))
    counts = {names[i] if i < len(names) else str(i): int(n) for i, n in enumerate(found.tolist())}
    if (values < 0).any():
        counts["(negative)"] = int((values < 0).sum())
    return counts
