"""diff: what changed between two releases, and the semantic label of that change.

``diff_releases(a, b)`` compares two snapshots (``h5etl.history.snapshot``): the layout (splits,
fields, their kinds, shapes, dtypes and facts, the dataset template, chunks and codecs), the
attributes, the config, samples per split, samples added, removed, changed and moved between
splits (matched by the strongest identity both releases carry), the write order and the class
counts. Any two releases compare, of any versions; a release against itself is empty.

The label: ``major`` when fields, splits or the dataset names changed, or a sample left a split
(removed, or moved to another); ``minor`` when samples were added or their content changed;
``patch`` when only the storage (chunks, codecs), the attributes or the config text changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from h5etl.format import contract as fileformat
from h5etl.format import yaml_load
from h5etl.format.contract import TRANSFORMS_KEY
from h5etl.history.changes import Change, Moved, ReleaseDiff, SampleChange, transform_change
from h5etl.history.diff_rejects import compare_rejects, reject_notes
from h5etl.history.snapshot import (
    FILENAME_FIELD,
    DatasetFacts,
    Identity,
    SampleFacts,
    Snapshot,
    read_snapshot,
)

__all__ = ["ReleaseDiff", "diff_paths", "diff_releases"]

# Root attributes shown in the diff's header or as the samples' changes, not as attributes:
# they differ between any two builds, or follow from the samples.
BOOKKEEPING = frozenset(
    {
        fileformat.VERSION_ATTR,
        fileformat.CREATED_AT_ATTR,
        fileformat.FINGERPRINT_ATTR,
        fileformat.SPLIT_POLICY_ATTR,  # its choices are config keys; its counts, the samples'
        fileformat.PARENT_ATTR,  # what an incremental build reused: bookkeeping
        fileformat.PARTS_ATTR,  # a virtual release's part files: named after its version
        *fileformat.STORY_ATTRS,
    }
)
# What a layout inferred from a release without a record knows of each field
INFERRED_PROPS = frozenset({"kind", "column", "dtype", "shape", fileformat.VALUES_KEY})
IDENTITY_WORDS: dict[Identity, str] = {
    "key": "their key (the sample keys)",
    "filename": f"their file name (the {FILENAME_FIELD!r} field)",
    "sources": "the SHA-256 of their source files",
}


def diff_paths(a: Path, b: Path) -> ReleaseDiff:
    """Diff the releases at ``a`` and ``b`` (files or links).

    Raises:
        UsageError: a path is no file (exit code 2).
        CheckFailed: a file is not HDF5 or HDF5 cannot open it (exit code 1).
        ReaderError: a layout record is damaged or newer than this version reads.
    """
    return diff_releases(read_snapshot(a), read_snapshot(b))


def diff_releases(a: Snapshot, b: Snapshot) -> ReleaseDiff:
    """Everything that differs from ``a`` to ``b``."""
    identity = next(i for i in a.identities if i in b.identities)  # both have "sources"
    out = ReleaseDiff(a, b, identity)
    out.layout = _layout_changes(a, b)
    for old in (s for s in (a, b) if s.layout.inferred):
        out.notes.append(
            f"{old.path.name} has no layout record (built by h5etl "
            f"{old.attrs.get(fileformat.TOOL_VERSION_ATTR, 'of an older version')}): its fields "
            "are compared by kind, dtype, shape and mask values only"
        )
    out.attrs = _mapping_changes("attribute", "", a.attrs, b.attrs, skip=BOOKKEEPING)
    out.attrs += _dataset_attr_changes(a, b)
    out.config = _mapping_changes("config", "", _config_keys(a.config), _config_keys(b.config))
    out.counts = {
        split: (a.counts.get(split), b.counts.get(split))
        for split in _union(a.layout.splits, b.layout.splits)
    }
    _compare_samples(out)
    out.classes = _class_changes(a, b)
    out.rejects = compare_rejects(a, b)
    out.notes += reject_notes(a, b)
    return out


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _mapping_changes(
    category: str,
    prefix: str,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    skip: Iterable[str] = (),
) -> list[Change]:
    skipped = set(skip)
    return [
        Change(category, f"{prefix}{name}", a.get(name), b.get(name))
        for name in _union(a, b)
        if name not in skipped and a.get(name) != b.get(name)
    ]


def _config_keys(text: str) -> dict[str, Any]:
    """The stored config as dotted keys (``fields.image.shape``); a null is no key, so an
    option a newer version added with its default does not show as a change."""
    try:
        data = yaml_load.safe_load(text) if text else {}
    except (yaml.YAMLError, RecursionError):
        return {"(config)": text}  # not YAML: compared as one text
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif value is not None:
            out[prefix or "(config)"] = value

    walk("", data)
    return out


def _layout_changes(a: Snapshot, b: Snapshot) -> list[Change]:
    out = [
        Change("split", split, *(split if split in s.layout.splits else None for s in (a, b)))
        for split in _union(a.layout.splits, b.layout.splits)
        if (split in a.layout.splits) != (split in b.layout.splits)
    ]
    if a.layout.template != b.layout.template:
        out.append(Change("template", "dataset names", a.layout.template, b.layout.template))
    inferred = a.layout.inferred or b.layout.inferred
    for name in _union(a.layout.fields, b.layout.fields):
        before, after = a.layout.fields.get(name), b.layout.fields.get(name)
        if before is None or after is None:
            shown = [None if r is None else r.as_json() for r in (before, after)]
            out.append(Change("field", name, *shown))
            continue
        code = transform_change(name, before.extra, after.extra)
        if code is not None:  # the code that makes its values (issue 28), by its digest
            out.append(code)
        for prop, was, now in _field_props(before.as_json(), after.as_json()):
            if prop == TRANSFORMS_KEY:
                continue
            if not inferred or prop in INFERRED_PROPS:
                out.append(Change("field", f"{name} {prop}", was, now))
    for split in a.layout.splits:
        if split not in b.layout.splits:
            continue
        for name, was in a.datasets[split].items():
            now = b.datasets[split].get(name)
            if now is not None:
                out.extend(_storage_changes(f"{split}/{name}", was, now))
    return out


def _field_props(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, a.get(k), b.get(k)) for k in _union(a, b) if a.get(k) != b.get(k)]


def _storage_changes(where: str, a: DatasetFacts, b: DatasetFacts) -> list[Change]:
    out = []
    if a.chunks != b.chunks:
        shown = [None if c is None else list(c) for c in (a.chunks, b.chunks)]
        out.append(Change("storage", f"{where} chunks", *shown))
    if a.codecs != b.codecs:
        out.append(Change("storage", f"{where} codecs", list(a.codecs), list(b.codecs)))
    return out


def _dataset_attr_changes(a: Snapshot, b: Snapshot) -> list[Change]:
    out = []
    for split, fields in a.datasets.items():
        for name, was in fields.items():
            now = b.datasets.get(split, {}).get(name)
            if now is not None:
                prefix = f"{split}/{name} "
                out.extend(_mapping_changes("dataset attribute", prefix, was.attrs, now.attrs))
    return out


def _class_changes(a: Snapshot, b: Snapshot) -> list[Change]:
    """Per split and field that both count (a release of 0.1 stores no histograms)."""
    out: list[Change] = []
    for split in _union(a.classes, b.classes):
        before, after = a.classes.get(split, {}), b.classes.get(split, {})
        for name in [n for n in before if n in after]:
            was, now = before[name], after[name]
            out.extend(
                Change("classes", f"{split}/{name} {label}", was.get(label, 0), now.get(label, 0))
                for label in _union(was, now)
                if was.get(label, 0) != now.get(label, 0)
            )
    return out


def _keyed(snapshot: Snapshot, identity: Identity, common: list[str]) -> dict[str, SampleFacts]:
    """The samples by the identity both releases carry; equal files twice get ``#2``, ``#3``."""
    if identity == "key":
        keys = [str(sample.key) for sample in snapshot.samples]
    elif identity == "filename":
        keys = [str(sample.filename) for sample in snapshot.samples]
    else:
        keys = [",".join(s.sources.get(c, "") for c in common) for s in snapshot.samples]
    out = dict(zip(keys, snapshot.samples, strict=True))
    if len(out) == len(keys):
        return out  # every key once (a release's keys are unique): no counting
    out = {}
    seen: Counter[str] = Counter()
    for key, sample in zip(keys, snapshot.samples, strict=True):
        seen[key] += 1
        out[key if seen[key] == 1 else f"{key}#{seen[key]}"] = sample
    return out


def _compare_samples(out: ReleaseDiff) -> None:
    a, b = out.a, out.b
    common = [c for c in _sources(a) if c in _sources(b)]
    contents = a.has_content_hashes and b.has_content_hashes
    _identity_notes(out, contents)
    before, after = _keyed(a, out.identity, common), _keyed(b, out.identity, common)
    for key, sample in after.items():
        was = before.get(key)
        if was is None:
            out.added.append(SampleChange(key, sample.split))
            continue
        if was.split != sample.split:
            out.moved.append(Moved(key, was.split, sample.split, sample.group or None))
        # "" is no group (a release without splits.group_by): adding group_by regroups nothing
        if was.group and sample.group and was.group != sample.group:
            out.regrouped.append(Moved(key, was.group, sample.group))
        if contents and was.content != sample.content:
            out.changed.append(SampleChange(key, sample.split, ("content",)))
        elif not contents and was.sources != sample.sources:  # most are equal: one comparison
            what = tuple(c for c in common if was.sources.get(c) != sample.sources.get(c))
            if what:
                out.changed.append(SampleChange(key, sample.split, what))
    out.removed = [SampleChange(k, s.split) for k, s in before.items() if k not in after]
    out.reordered = _reordered(before, after)
    for changes in (out.added, out.removed, out.changed):
        changes.sort(key=lambda c: (c.split, c.key))
    out.moved.sort(key=lambda m: m.key)
    out.regrouped.sort(key=lambda m: m.key)


def _identity_notes(out: ReleaseDiff, contents: bool) -> None:
    """Say how samples were matched, and what that cannot show."""
    if out.identity != "key":
        note = f"samples matched by {IDENTITY_WORDS[out.identity]}"
        weaker = [s.path.name for s in (out.a, out.b) if s.identities[0] == out.identity]
        if len(weaker) == 1:  # the other release has a stronger identity
            lacks = "per-sample key record" + (" or file names" * (out.identity == "sources"))
            note += f": {weaker[0]} has no {lacks}"
        out.notes.append(note)
    if out.identity == "sources":
        out.notes.append("a changed input shows as one sample removed and one added")
    if out.identity != "sources" and not contents:
        out.notes.append("changed samples: by the SHA-256 of their source files")


def _sources(snapshot: Snapshot) -> list[str]:
    return list(snapshot.samples[0].sources) if snapshot.samples else []


def _reordered(before: Mapping[str, SampleFacts], after: Mapping[str, SampleFacts]) -> list[str]:
    """Splits whose samples kept in place come in another relative order."""
    kept_before: dict[str, list[str]] = {}
    kept_after: dict[str, list[str]] = {}
    for key, sample in before.items():
        if key in after:
            kept_before.setdefault(sample.split, []).append(key)
    for key, sample in after.items():
        if key in before:
            kept_after.setdefault(sample.split, []).append(key)
    out = []
    splits = _union((s.split for s in before.values()), (s.split for s in after.values()))
    for split in splits:
        was, now = kept_before.get(split, []), kept_after.get(split, [])
        kept = set(was) & set(now)
        if [k for k in was if k in kept] != [k for k in now if k in kept]:
            out.append(split)
    return out
