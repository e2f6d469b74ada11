"""health: a read-only health report of a release; ``deep`` recomputes every SHA-256.

Which datasets a release holds comes from its layout record (``fileformat.read_layout``;
inferred for releases older than the record), never from a path written here: a field of a
split is at ``record.path(split, field)``, whatever the template. What each field's values
hold is ``check_fields``'s part.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc/Zstd filters for reading)

from h5etl.check import deep as check_deep
from h5etl.check import ragged as check_ragged
from h5etl.check.fields import (
    empty_classes,
    field_lines,
    grid_problems,
    group_lines,
    transform_lines,
)
from h5etl.format import contract as fileformat
from h5etl.format import fileinfo, partfiles
from h5etl.format.contract import (
    BLOCK_DIGESTS,
    DIAGNOSTICS,
    DIAGNOSTICS_DATASETS,
    LINEAGE,
    NODE_DATASET,
    NODE_RATIO,
    NODE_RAW_BYTES,
    NODE_STORED_BYTES,
    REQUIRED_ATTRS,
    LayoutRecord,
)

# What reading a damaged file, or one h5etl did not write, raises from h5py and numpy
_DAMAGE = (OSError, KeyError, ValueError, TypeError, RuntimeError)


@dataclass(slots=True)
class CheckReport:
    """``lines`` is the report, ``PROBLEM`` and ``WARNING`` lines where they were found."""

    path: Path
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    deep: check_deep.DeepTally | None = None
    missing: set[str] = field(default_factory=set)  # dataset paths reported missing

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.lines.append(f"PROBLEM {text}")

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.lines.append(f"WARNING {text}")

    @property
    def summary(self) -> str:
        """The verdict on one line; it counts the problems and repeats none of them."""
        if self.problems:
            n = len(self.problems)
            return f"{n} problem{'s' if n > 1 else ''} (the PROBLEM lines of the report)"
        n = len(self.warnings)
        return f"OK ({n} warning{'s' if n > 1 else ''})" if n else "OK"


@contextmanager
def _section(report: CheckReport, where: str) -> Iterator[None]:
    """Report what a damaged or foreign file raises while reading ``where``; go on after it."""
    try:
        yield
    except _DAMAGE as exc:
        report.problem(
            f"{where}: unreadable, or not as h5etl writes it: {type(exc).__name__}: {exc}"
        )


def _attrs_section(handle: h5py.File, report: CheckReport) -> None:
    missing = [a for a in REQUIRED_ATTRS if a not in handle.attrs]
    if missing:
        report.problem(f"file attrs missing: {', '.join(missing)}")
        return
    attrs = handle.attrs
    config = attrs[fileformat.CONFIG_ATTR]
    if hashlib.sha256(str(config).encode()).hexdigest() != attrs[fileformat.CONFIG_SHA256_ATTR]:
        report.problem(f"attr {fileformat.CONFIG_SHA256_ATTR} does not match the stored config")
    report.lines.append(
        f"release {attrs[fileformat.NAME_ATTR]} v{int(attrs[fileformat.VERSION_ATTR]):04d}, "
        f"created {attrs[fileformat.CREATED_AT_ATTR]}, "
        f"h5etl {attrs.get(fileformat.TOOL_VERSION_ATTR, '?')}"
    )


def _layout(handle: h5py.File, report: CheckReport) -> LayoutRecord:
    """The release's layout record; a damaged or newer one is one problem, and the file is
    then checked as a release before the record would be laid out."""
    try:
        return fileformat.read_layout(handle)
    except ValueError as exc:
        report.problem(
            f"root attr {fileformat.LAYOUT_ATTR!r}: {exc}; checked as an older release instead"
        )
        return fileformat.inferred_layout(handle)


def _diagnostics(handle: h5py.File, report: CheckReport) -> dict[str, dict[str, Any]]:
    where = f"/{DIAGNOSTICS_DATASETS}"
    group = handle.get(DIAGNOSTICS_DATASETS)
    if group is None:
        return {}
    if not isinstance(group, h5py.Group):
        report.problem(f"{where}: not a group: not an h5etl release, or damaged")
        return {}
    out = {}
    for name in group:
        with _section(report, f"{where}/{name}"):
            node = group[name]
            info = dict(node.attrs)
            digests = node[BLOCK_DIGESTS][...]
            if digests.dtype.kind != "S" or digests.ndim != 1:
                raise ValueError(
                    f"{BLOCK_DIGESTS} is {digests.dtype} {digests.shape}, not S64 (n,)"
                )
            info[BLOCK_DIGESTS] = [b.decode() for b in digests]
            out[str(info[NODE_DATASET])] = info
    return out


def check_release(path: Path, *, deep: bool = False) -> CheckReport:
    """Inspect a release without modifying it.

    Returns:
        A report; ``report.ok`` is false when anything is damaged or missing.

    Raises:
        ConfigError: ``path`` is no file: missing, a folder, a link to nothing, a FIFO.
        CheckFailed: the file is not HDF5, or HDF5 cannot open it (truncated, overwritten).
    """
    report = CheckReport(path, deep=check_deep.DeepTally() if deep else None)
    with fileinfo.open_file(path) as handle:
        with _section(report, "file attrs"):
            _attrs_section(handle, report)
        record = LayoutRecord(fileformat.DEFAULT_TEMPLATE, (), {}, inferred=True)
        with _section(report, f"root attr {fileformat.LAYOUT_ATTR!r}"):
            record = _layout(handle, report)
        with _section(report, f"root attr {fileformat.PARTS_ATTR!r}"):
            _parts_section(handle, report)
        report.lines.extend(transform_lines(record))
        expected = _diagnostics(handle, report)
        if not expected:
            report.problem(f"no /{DIAGNOSTICS_DATASETS}: not an h5etl release, or damaged")
        counts = _splits_section(handle, record, expected, report, deep=deep)
        with _section(report, "groups"):
            report.lines.extend(group_lines(handle, record, report.problem))
        with _section(report, f"/{DIAGNOSTICS_DATASETS}"):
            for name in expected:
                if name not in handle and name not in report.missing:
                    report.problem(f"{name}: dataset listed in diagnostics is missing")
            _ratio_line(expected, report)
        with _section(report, "/"):
            report.lines.append(fileinfo.readers(_filter_ids(handle, record, counts)))
        with _section(report, f"/{DIAGNOSTICS}"):
            _rejects_line(handle, report)
        with _section(report, "classes"):
            for problem in empty_classes(handle, record, counts):
                report.problem(problem)
        if report.deep is not None:
            report.lines.append(report.deep.line)
    _empty_section(counts, report)
    return report


def _parts_section(handle: h5py.File, report: CheckReport) -> None:
    """A virtual release's part files: each there, of its recorded size and identity, holding
    what is mapped onto it (HDF5 would read a missing part's rows as zeros, silently)."""
    names = partfiles.mapped_files(handle)
    if not names:
        return
    problems = partfiles.part_problems(handle, thorough=True)
    for problem in problems:
        report.problem(problem)
    state = f"{len(problems)} with a problem" if problems else "all there and as built"
    files = f"{len(names)} part file{'s' * (len(names) != 1)}"
    report.lines.append(f"parts: the release maps {files} beside it, {state}")


def _splits_section(
    handle: h5py.File,
    record: LayoutRecord,
    expected: dict[str, dict[str, Any]],
    report: CheckReport,
    *,
    deep: bool,
) -> dict[str, int]:
    """Report each split the record lists; return its sample count."""
    if record.inferred or fileformat.split_group(record.template, "split") is not None:
        for name in handle:  # where splits are groups, the root holds nothing else
            node = handle.get(name)
            if name != DIAGNOSTICS and not isinstance(node, h5py.Group):
                what = "a broken link" if node is None else f"a {type(node).__name__}"
                report.problem(f"/{name}: {what}, not a split group: not an h5etl release")
    counts = {}
    for split in record.splits:
        paths = {
            **record.paths(split),
            **check_ragged.offsets_paths(record, split),
            LINEAGE: record.lineage_path(split),
            **record.sample_paths(split),
        }
        if not record.inferred and not any(p in handle for p in paths.values()):
            report.problem(f"split {split!r} is in the layout record, missing from the file")
            report.missing.update(paths.values())
            continue
        where = fileformat.split_group(record.template, split) or split
        with _section(report, where):
            counts[split] = _split_section(handle, record, split, paths, expected, report, deep)
    return counts


def _empty_section(counts: dict[str, int], report: CheckReport) -> None:
    """A release of no sample is a problem (older versions published them), and so is an
    empty split (a build publishes one only when told to: ``allow_empty``, ``--allow-loss``)."""
    if not sum(counts.values()):
        report.problem(
            "0 samples in the release: every input was rejected, or none was found; "
            "build it again from inputs that pass (h5etl no longer publishes such builds)"
        )
        return
    for split, count in counts.items():
        if not count:
            report.problem(
                f"split {split}: 0 samples: the split is empty (too few inputs, or all of its "
                "inputs were rejected)"
            )


def _filter_ids(handle: h5py.File, record: LayoutRecord, splits: Iterable[str]) -> list[int]:
    """The filters of every dataset of the splits ``check`` could read."""
    nodes = [handle.get(p) for s in splits for p in [*record.paths(s).values()]]
    return [
        number
        for node in nodes
        if isinstance(node, h5py.Dataset)
        for number in fileinfo.filter_ids(node)
    ]


def _rejects_line(handle: h5py.File, report: CheckReport) -> None:
    prefix = fileformat.REJECTS_PREFIX
    rejects = (
        {
            k.removeprefix(prefix): int(v)
            for k, v in handle[DIAGNOSTICS].attrs.items()
            if k.startswith(prefix)
        }
        if DIAGNOSTICS in handle
        else {}
    )
    total_key = fileformat.REJECTS_TOTAL.removeprefix(prefix)
    total = rejects.pop(total_key, sum(rejects.values()))  # rejects_total is not a reason
    shown = ", ".join(f"{k} {v}" for k, v in rejects.items())
    report.lines.append(f"rejects: {total} ({shown})" if total else "rejects: none")
    table = f"{DIAGNOSTICS}/{fileformat.REJECTS_DATASET}"
    if table in handle:  # since 0.2: the rows must say what the tallies count
        reasons = handle[table].fields("reason")[...]
        rows = Counter(r.decode() if isinstance(r, bytes) else str(r) for r in reasons)
        if sum(rows.values()) != total or any(rows[k] != v for k, v in rejects.items() if v):
            listed = ", ".join(f"{k} {v}" for k, v in sorted(rows.items())) or "none"
            report.problem(
                f"/{table} lists {sum(rows.values())} rejects ({listed}), not the {total} "
                f"the tallies count ({shown or 'none'})"
            )


def _split_section(
    handle: h5py.File,
    record: LayoutRecord,
    split: str,
    paths: dict[str, str],
    expected: dict[str, dict[str, Any]],
    report: CheckReport,
    deep: bool,
) -> int:
    datasets: dict[str, h5py.Dataset] = {}
    for name, path in paths.items():
        node = handle.get(path)
        if isinstance(node, h5py.Dataset):
            datasets[name] = node
        elif not (record.inferred and name == LINEAGE and node is None):  # no record: optional
            what = "missing from the file" if node is None else f"a {type(node).__name__}"
            listed = "(other splits have it)" if record.inferred else "is in the layout record"
            report.problem(f"{path}: field {name!r} of split {split!r} {listed}, {what}")
            report.missing.add(path)
    count, rows = check_ragged.expected_rows(record, datasets)
    report.lines.append(
        f"{fileformat.split_group(record.template, split) or split}: {count} samples"
    )
    for name, dataset in datasets.items():
        with _section(report, dataset.name):
            _dataset_section(name, dataset, rows[name], expected, report, deep=deep)
    columns = record.storage
    for name, dataset in datasets.items():
        if name not in columns:
            continue
        with _section(report, dataset.name):
            offsets = datasets.get(name + fileformat.OFFSETS_SUFFIX)
            if columns[name].column == "ragged" and offsets is not None:
                check_ragged.check_offsets(dataset, offsets, report.problem)
            report.lines.extend(field_lines(name, columns[name], dataset, report.problem))
    grid_problems(record, datasets, report.problem)
    return count


def _filters(dataset: h5py.Dataset) -> str:
    names = "+".join(fileinfo.filter_name(n) for n in fileinfo.filter_ids(dataset)) or "none"
    if dataset.is_virtual:  # a sharded release's map onto its part files
        return f"{names}, virtual over {len(dataset.virtual_sources())} part files"
    return names


def _rows(dataset: h5py.Dataset) -> int:
    return int(dataset.shape[0]) if dataset.shape else 0  # a scalar or empty dataspace: none


def _dataset_section(
    name: str,
    dataset: h5py.Dataset,
    count: int,
    expected: dict[str, dict[str, Any]],
    report: CheckReport,
    *,
    deep: bool,
) -> None:
    info = expected.get(dataset.name)
    stored = info.get(NODE_STORED_BYTES) if info else None
    ratio = f", ratio {info.get(NODE_RATIO)}" if info else ""
    label = name if dataset.name.endswith(f"/{name}") else f"{name} ({dataset.name})"
    report.lines.append(
        f"  {label}: {dataset.shape} {dataset.dtype}, chunks "
        f"{dataset.chunks}, {_filters(dataset)}, stored {stored} bytes{ratio}"
    )
    if not dataset.shape:
        report.problem(f"{dataset.name}: a scalar, not rows of samples")
    elif _rows(dataset) != count:
        report.problem(f"{dataset.name}: {_rows(dataset)} rows, {count} expected")
    if info is None:
        report.problem(f"{dataset.name}: no digest in /{DIAGNOSTICS}")
    elif deep:
        assert report.deep is not None, "a deep check starts with a tally"
        problem = check_deep.verify(dataset, info, report.deep)
        if problem is not None:
            report.problem(problem)


# --- the overall ratio ------------------------------------------------------------------


def _ratio_line(expected: dict[str, dict[str, Any]], report: CheckReport) -> None:
    raw = sum(int(info.get(NODE_RAW_BYTES, 0)) for info in expected.values())
    stored = sum(int(info.get(NODE_STORED_BYTES, 0)) for info in expected.values())
    if stored:
        report.lines.append(
            f"compression: {raw:,} bytes raw, {stored:,} stored, ratio {raw / stored:.2f}"
        )
