"""check, per field: what the values hold, as the layout record says they should.

A label field gets its per-class counts (from the stored values; class names from the
record) and a problem for any value that indexes no class; a mask its value histogram against
the values the record declares; a numeric field its stored statistics, and a mask or label its
stored histogram, on one line each. ``check`` (``h5etl.check.health``) calls ``field_lines`` for
every field of every split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import h5py
import numpy as np

from h5etl.format import contract as fileformat
from h5etl.format.contract import FieldRecord

BLOCK_BYTES = 1 << 26  # read masks in whole-chunk blocks of about 64 MiB: bounded memory
LABEL_ROWS = 1 << 20  # label values read this many at a time
SHOWN_STATS = ("mean", "std", "min", "max")  # of fileformat.STAT_ATTRS, on the stats line
HISTOGRAM_KINDS = ("mask", "label")
Problem = Callable[[str], None]


def value_histogram(dataset: h5py.Dataset) -> tuple[dict[int, int], int]:
    """Pixel count per value, and how many samples hold nothing but 0, chunk block by block."""
    rows = dataset.chunks[0] if dataset.chunks else 1
    row_bytes = max(1, int(np.prod(dataset.shape[1:])) * dataset.dtype.itemsize)
    step = max(rows, BLOCK_BYTES // (row_bytes * rows) * rows)
    small = dataset.dtype.kind in "ub" and dataset.dtype.itemsize == 1
    counts: dict[int, int] = {}
    dense = np.zeros(256, dtype=np.int64)
    empty = 0
    for start in range(0, len(dataset), step):
        block = dataset[start : start + step]
        empty += int(np.count_nonzero(block.reshape(len(block), -1).max(axis=1, initial=0) == 0))
        if small:
            dense += np.bincount(block.ravel().view(np.uint8), minlength=256)
            continue
        values, found = np.unique(block, return_counts=True)
        for value, count in zip(values.tolist(), found.tolist(), strict=True):
            counts[int(value)] = counts.get(int(value), 0) + int(count)
    if small:
        counts = {v: int(c) for v, c in enumerate(dense.tolist()) if c}
    return counts, empty


def _compact(value: Any) -> str:
    """A stored statistic in few characters: ``12.5`` or ``[0.1, 0.2, 0.3]``."""
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if array.size == 1:
        return f"{array[0]:.4g}"
    return "[" + ", ".join(f"{v:.4g}" for v in array.tolist()) + "]"


def stats_line(name: str, dataset: h5py.Dataset) -> str | None:
    """``  image stats: mean [..], std [..], min [..], max [..]``, or None when none stored."""
    shown = [f"{k} {_compact(dataset.attrs[k])}" for k in SHOWN_STATS if k in dataset.attrs]
    return f"  {name} stats: " + ", ".join(shown) if shown else None


def histogram_line(name: str, dataset: h5py.Dataset) -> str | None:
    """``  label histogram: 0 12, 1 36`` from the stored histogram, or None without one.

    An array's histogram counts its unpadded pixels (the build's statistics do), so it says
    so: the ``values`` line beside it counts every stored pixel, padding included.
    """
    values_attr, counts_attr = fileformat.HISTOGRAM_ATTRS
    if values_attr not in dataset.attrs or counts_attr not in dataset.attrs:
        return None
    values = np.asarray(dataset.attrs[values_attr]).reshape(-1).tolist()
    counts = np.asarray(dataset.attrs[counts_attr]).reshape(-1).tolist()
    pairs = ", ".join(f"{v} {c}" for v, c in zip(values, counts, strict=False))
    where = " (unpadded pixels)" if dataset.ndim > 1 else ""
    return f"  {name} histogram{where}: {pairs or 'empty'}"


def label_counts(dataset: h5py.Dataset) -> dict[int, int]:
    """How many rows hold each value of a label dataset, read in blocks."""
    counts: dict[int, int] = {}
    for start in range(0, len(dataset), LABEL_ROWS):
        values, found = np.unique(dataset[start : start + LABEL_ROWS], return_counts=True)
        for value, count in zip(values.tolist(), found.tolist(), strict=True):
            counts[int(value)] = counts.get(int(value), 0) + int(count)
    return counts


def _label_lines(name: str, record: FieldRecord, dataset: h5py.Dataset, problem: Problem) -> str:
    classes = fileformat.class_names(record, dataset)
    counts = label_counts(dataset)
    if not classes:
        shown = ", ".join(f"{v} {c}" for v, c in sorted(counts.items()))
        return f"  {name} values: {shown or 'none'} (no class names recorded)"
    stray = sorted(v for v in counts if not 0 <= v < len(classes))
    if stray:
        problem(
            f"{dataset.name}: label values {stray} outside 0..{len(classes) - 1} "
            f"(classes {', '.join(classes)})"
        )
    shown = ", ".join(f"{c} {counts.get(i, 0)}" for i, c in enumerate(classes))
    return f"  {name} classes: {shown}"


def _mask_values_line(
    name: str, dataset: h5py.Dataset, declared: list[int], problem: Problem, unit: str
) -> str | None:
    try:
        counts, empty = value_histogram(dataset)
    except OSError as exc:  # a damaged chunk: report it, keep checking the rest
        problem(f"{dataset.name}: unreadable while counting values: {exc}")
        return None
    total = sum(counts.values()) or 1
    shown = ", ".join(f"{v} {100 * c / total:.2f}% ({c:,} px)" for v, c in sorted(counts.items()))
    stray = sorted(set(counts) - set(declared))
    if stray:
        problem(f"{dataset.name}: values {stray} outside the declared {declared}")
    return f"  {name} values: {shown or 'none'}; {empty} of {len(dataset)} {unit} all 0"


def field_lines(
    name: str, record: FieldRecord, dataset: h5py.Dataset, problem: Problem
) -> list[str]:
    """The report lines of one field's values; ``problem`` is told what is wrong in them."""
    lines: list[str | None] = []
    numeric = dataset.dtype.kind in "uibf" and record.column in ("fixed", "ragged")
    if numeric:
        lines.append(stats_line(name, dataset))
    if record.kind == "label" and dataset.dtype.kind in "ui" and dataset.ndim == 1:
        lines.append(_label_lines(name, record, dataset, problem))
    if record.kind in HISTOGRAM_KINDS:
        lines.append(histogram_line(name, dataset))
    declared = fileformat.declared_values(record)
    if declared is not None and dataset.dtype.kind in "uib" and dataset.ndim >= 1:
        # a ragged column's rows are rows of values (slices of a volume), not samples
        unit = "rows" if record.column == "ragged" else "samples"
        lines.append(_mask_values_line(name, dataset, declared, problem, unit))
    return [line for line in lines if line is not None]


def empty_classes(
    handle: h5py.File, record: fileformat.LayoutRecord, splits: Iterable[str]
) -> list[str]:
    """A problem for each class of a label field that none of ``splits`` stores (a class
    folder whose every file was rejected): a build publishes one only when told to."""
    out = []
    for name, field in record.fields.items():
        if field.kind != "label":
            continue
        totals: dict[str, int] = {}
        for split in splits:
            node = handle.get(record.path(split, name))
            if not isinstance(node, h5py.Dataset) or node.ndim != 1 or node.dtype.kind not in "ui":
                continue  # a missing or damaged dataset is reported with its split
            classes = fileformat.class_names(field, node)
            counts = label_counts(node)
            for i, label in enumerate(classes):
                totals[label] = totals.get(label, 0) + counts.get(i, 0)
        out += [
            f"field {name}: class {label!r} has 0 samples in every split (all of its inputs "
            "were rejected, or none was found)"
            for label, count in totals.items()
            if not count
        ]
    return out


def group_lines(handle: h5py.File, record: fileformat.LayoutRecord, problem: Problem) -> list[str]:
    """The groups of the sample keys: how many, and a problem for each group found in
    more than one split (leakage: one patient's images in train and valid)."""
    if fileformat.SAMPLE_GROUP not in record.samples:
        return []
    where: dict[str, dict[str, int]] = {}
    for split in record.splits:
        node = handle.get(record.sample_paths(split)[fileformat.SAMPLE_GROUP])
        if not isinstance(node, h5py.Dataset) or not len(node):
            continue  # a missing dataset is reported with the split
        for group in node.asstr()[...]:
            if group:
                counts = where.setdefault(str(group), {})
                counts[split] = counts.get(split, 0) + 1
    if not where:
        return []  # built without splits.group_by
    leaked = {group: splits for group, splits in where.items() if len(splits) > 1}
    for group, splits in sorted(leaked.items()):
        shown = ", ".join(f"{split} {count}" for split, count in splits.items())
        problem(f"group {group!r} is in {len(splits)} splits ({shown}): leakage between splits")
    return [f"groups: {len(where)}, {len(leaked)} in more than one split"]


def grid_problems(
    record: fileformat.LayoutRecord, datasets: dict[str, h5py.Dataset], problem: Problem
) -> None:
    """A problem for each label volume whose stored affines are not its image's (``of``) in
    one split: its voxels would be read as lying where they do not."""
    from h5etl.inputs.volumes import orient

    for name, field in record.fields.items():
        of = field.extra.get("of") if field.kind == "volume" else None
        columns = [f"{name}_affine", f"{of}_affine", f"{of}_spacing"]
        if not of or not all(c in datasets for c in columns):
            continue
        mine, theirs, spacing = (datasets[c][...] for c in columns)
        off = [
            i
            for i in range(min(len(mine), len(theirs), len(spacing)))
            if orient.disagreement(mine[i], theirs[i], tuple(spacing[i])) is not None
        ]
        if not off:
            continue
        first = off[0]
        keys = datasets.get(fileformat.SAMPLE_KEY)
        which = repr(keys.asstr()[first]) if keys is not None else f"#{first}"
        problem(
            f"{datasets[columns[0]].name}: {len(off)} of {len(mine)} cases lie on another "
            f"grid than their image {of} (first {which}: "
            f"{orient.described(mine[first], tuple(spacing[first]))} vs "
            f"{orient.described(theirs[first], tuple(spacing[first]))})"
        )


def transform_lines(record: fileformat.LayoutRecord) -> list[str]:
    """``transforms:`` lines, one per field whose values user code made (issue 28): each
    call in the order it ran, its arguments, and the field's code digest."""
    lines = []
    for name, field in record.fields.items():
        entry = field.extra.get(fileformat.TRANSFORMS_KEY)
        if not isinstance(entry, dict):
            continue
        calls = []
        for call in entry.get("calls", []):
            text = str(call.get("call"))
            step = call.get("step")
            if step == "sample":
                text = f"{text} (sample: {'+'.join(call.get('fields', []))})"
            elif step == "derive":
                text = f"{text} (derive from {', '.join(call.get('from', []))})"
            args = call.get("args")
            if args and args != "{}":
                text += f" {args}"
            calls.append(text)
        digest = str(entry.get("digest", ""))[:12]
        lines.append(f"transforms: {name}: {' -> '.join(calls)} [code {digest}]")
    return lines
