"""parent: what a new build reads of the release before it (the link's target), read-only.

Its identity (version, source fingerprint, stored config, layout record) and its per-sample
record: each split's sample keys and groups, row-aligned with its fields and lineage. Splits
keep every recorded sample where it is (``h5etl.plan.split_assign``); an incremental build carries
the chunks of unchanged samples (``h5etl.incremental.reuse``). Plain data out; no handle leaves this
module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from h5etl.format import contract as fileformat
from h5etl.release.folder import OutputFolder

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ParentSplit:
    """One split of the parent: per row, the sample's key, group and source digests."""

    keys: list[str]
    groups: list[str]
    lineage: np.ndarray  # (N, sources) S64


@dataclass(frozen=True, slots=True)
class Parent:
    """The previous release, as far as a new build needs it."""

    path: Path
    version: int
    fingerprint: str
    config: str
    layout: fileformat.LayoutRecord
    splits: dict[str, ParentSplit] = field(default_factory=dict)
    notes: str = ""
    tool_version: str = ""  # the h5etl that built it
    rejects: tuple[tuple[str, ...], ...] = ()  # its /diagnostics/rejects rows (REJECT_COLUMNS)

    def split_of(self) -> dict[str, str]:
        """Sample key -> the split the parent stored it in."""
        return {key: name for name, split in self.splits.items() for key in split.keys}

    @property
    def total(self) -> int:
        return sum(len(split.keys) for split in self.splits.values())


class NoSampleKeys(Exception):
    """The parent cannot serve as one: no sample keys, or unreadable (the message says)."""


def _texts(dataset: h5py.Dataset) -> list[str]:
    return [str(text) for text in dataset.asstr()[...]] if len(dataset) else []


def _stored_rejects(handle: h5py.File) -> tuple[tuple[str, ...], ...]:
    """The rows of ``/diagnostics/rejects`` as texts (none in a release from before it)."""
    node = handle.get(f"{fileformat.DIAGNOSTICS}/{fileformat.REJECTS_DATASET}")
    if not isinstance(node, h5py.Dataset) or not len(node):
        return ()
    columns = [c for c in fileformat.REJECT_COLUMNS if c in (node.dtype.names or ())]
    rows = node[...]

    def text(value: object) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    return tuple(tuple(text(row[c]) for c in columns) for row in rows)


def read_parent(path: Path, version: int) -> Parent:
    """Read the parent release at ``path``.

    Raises:
        NoSampleKeys: it is not readable as HDF5, its layout record is damaged, or it is of a
            version of h5etl that stored no sample keys.
    """
    try:
        with h5py.File(path, "r") as handle:
            layout = fileformat.read_layout(handle)
            if set(fileformat.SAMPLE_KEYS) - set(layout.samples):
                raise NoSampleKeys(f"{path.name} stores no sample keys (an older h5etl)")
            splits = {}
            for split in layout.splits:
                record = layout.sample_paths(split)
                splits[split] = ParentSplit(
                    _texts(handle[record[fileformat.SAMPLE_KEY]]),
                    _texts(handle[record[fileformat.SAMPLE_GROUP]]),
                    np.asarray(handle[layout.lineage_path(split)][...]),
                )
            attrs = handle.attrs
            return Parent(
                path,
                version,
                str(attrs.get(fileformat.FINGERPRINT_ATTR, "")),
                str(attrs.get(fileformat.CONFIG_ATTR, "")),
                layout,
                splits,
                notes=str(attrs.get(fileformat.NOTES_ATTR, "")),
                tool_version=str(attrs.get(fileformat.TOOL_VERSION_ATTR, "")),
                rejects=_stored_rejects(handle),
            )
    except NoSampleKeys:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise NoSampleKeys(f"{path.name} cannot be read ({type(exc).__name__}: {exc})") from exc


def parent_of(output: OutputFolder) -> tuple[Parent | None, list[str]]:
    """The release ``output``'s link points at, and warnings (one that cannot be read)."""
    found = output.current_release()
    if found is None:
        return None, []
    version, path = found
    try:
        return read_parent(path, version), []
    except NoSampleKeys as exc:
        return None, [f"{exc}: splits are assigned afresh, not kept from v{version:04d}"]
