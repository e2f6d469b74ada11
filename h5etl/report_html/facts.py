"""facts: everything the HTML report shows, read through the modules that read releases.

The layout, the samples per split, the class counts and the rejects come from
``snapshot`` (over the layout record); the parent, change and notes from ``release_notes``; the
verdict from ``check``; the pictures from ``preview``. This module only adds what none of
them keeps: each stored dataset's shape and dtype as HDF5 reports them, and the
normalisation statistics that ``snapshot`` leaves out (``fileformat.dataset_stats``).
Nothing here writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image

from h5etl.check.health import CheckReport, check_release
from h5etl.errors import CheckFailed, H5EtlError, UsageError
from h5etl.format import contract as fileformat
from h5etl.format import fileinfo
from h5etl.history.release_notes import Story, read_story
from h5etl.history.snapshot import Snapshot, plain, snapshot_of

__all__ = ["ColumnFacts", "PreviewFacts", "ReleaseFacts", "StatFacts", "gather"]


@dataclass(frozen=True, slots=True)
class ColumnFacts:
    """One stored dataset of one split: where it is and how HDF5 stores it."""

    split: str
    name: str  # the storage column (dataset name)
    field: str  # the field it belongs to
    kind: str
    column: str  # fixed | text | ragged
    path: str
    shape: tuple[int, ...]
    dtype: str  # numpy's name, or "str" for UTF-8 text
    chunks: tuple[int, ...] | None
    codecs: tuple[str, ...]
    stored: int  # bytes on disk
    raw: int  # bytes uncompressed (0 for text: its heap is not in the dataset)


@dataclass(frozen=True, slots=True)
class StatFacts:
    """The normalisation statistics of one dataset of one split, a row per channel."""

    split: str
    name: str
    rows: tuple[dict[str, float], ...]  # STAT_ATTRS -> value, per channel


@dataclass(frozen=True, slots=True)
class PreviewFacts:
    """The preview of one split: a picture, or why there is none."""

    split: str
    picture: Image.Image | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ReleaseFacts:
    """What the HTML report shows of one release."""

    path: Path  # as given (a link or a file)
    file: Path  # the release file it resolves to
    snapshot: Snapshot
    story: Story
    check: CheckReport
    columns: tuple[ColumnFacts, ...]
    stats: tuple[StatFacts, ...]
    previews: tuple[PreviewFacts, ...]
    policy: dict[str, Any] = field(default_factory=dict)  # SPLIT_POLICY_ATTR, parsed
    reuse: dict[str, Any] = field(default_factory=dict)  # PARENT_ATTR, parsed


def gather(path: Path, *, shown: int = 16) -> ReleaseFacts:
    """Read what the report shows of the release at ``path`` (a file or its link).

    Parameters:
        path: a release file or the link to one.
        shown: samples per split in each preview grid.

    Raises:
        UsageError: no such file, or not an h5etl release (exit code 2).
        ReaderError: its layout record is damaged or newer than this version reads.
    """
    file = Path(os.path.realpath(path))
    try:
        handle = fileinfo.open_file(path)
    except CheckFailed as exc:  # not HDF5 at all, or a damaged one: nothing to report on
        raise UsageError(f"not a release: {exc.message}", path=path) from exc
    with handle:
        snapshot = snapshot_of(handle, path)
        columns, stats = _columns(handle, snapshot)
        policy = _json_attr(handle, fileformat.SPLIT_POLICY_ATTR)
        reuse = _json_attr(handle, fileformat.PARENT_ATTR)
    return ReleaseFacts(
        path=path,
        file=file,
        snapshot=snapshot,
        story=read_story(file),
        check=check_release(path),
        columns=tuple(columns),
        stats=tuple(stats),
        previews=tuple(_preview(path, split, shown) for split in snapshot.layout.splits),
        policy=policy,
        reuse=reuse,
    )


def _json_attr(handle: h5py.File, name: str) -> dict[str, Any]:
    """A root attribute holding a JSON object; {} where absent or not one."""
    try:
        value = json.loads(str(plain(handle.attrs.get(name, "{}"))))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _columns(handle: h5py.File, snapshot: Snapshot) -> tuple[list[ColumnFacts], list[StatFacts]]:
    """Each split's stored datasets in layout order, and the statistics stored on them."""
    layout = snapshot.layout
    columns, stats = [], []
    for split in layout.splits:
        facts = snapshot.datasets.get(split, {})
        for name, record in layout.storage.items():
            node = handle.get(layout.path(split, name))
            if not isinstance(node, h5py.Dataset) or name not in facts:
                continue
            text = h5py.check_string_dtype(node.dtype) is not None
            columns.append(
                ColumnFacts(
                    split=split,
                    name=name,
                    field=layout.field_of(name),
                    kind=record.kind,
                    column=record.column,
                    path=node.name,
                    shape=tuple(int(n) for n in node.shape),
                    dtype="str" if text else node.dtype.name,
                    chunks=facts[name].chunks,
                    codecs=facts[name].codecs,
                    stored=int(node.id.get_storage_size()),
                    raw=0 if text else int(node.size) * node.dtype.itemsize,
                )
            )
            rows = _stat_rows(fileformat.dataset_stats(node))
            if rows:
                stats.append(StatFacts(split, name, rows))
    return columns, stats


def _stat_rows(attrs: dict[str, Any]) -> tuple[dict[str, float], ...]:
    """The statistics attributes as one row per channel (a scalar is one channel)."""
    found = {k: np.atleast_1d(np.asarray(attrs[k], dtype=np.float64)) for k in attrs}
    found = {k: v for k, v in found.items() if k in fileformat.STAT_ATTRS}
    if "mean" not in found:
        return ()
    channels = len(found["mean"])
    return tuple(
        {k: float(v[c]) for k, v in found.items() if len(v) == channels} for c in range(channels)
    )


def _preview(path: Path, split: str, shown: int) -> PreviewFacts:
    """The preview grid of ``split`` (``h5etl.preview.sheet`` draws it), or why there is none."""
    from h5etl.preview.sheet import render_preview

    try:
        return PreviewFacts(split, render_preview(path, split=split, n=shown))
    except H5EtlError as exc:  # a release of no drawable field, an empty split
        return PreviewFacts(split, None, f"no preview: {exc.message}")
