"""check: a read-only health report of a release; ``deep`` recomputes every SHA-256."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the Blosc/Zstd filters for reading)
import numpy as np
import yaml

from h5etl import digest, hdf5info
from h5etl.units import human_size

REQUIRED_ATTRS = ("name", "version", "created_at", "config", "config_sha256", "source_fingerprint")
# What reading a damaged file, or one h5etl did not write, raises from h5py and numpy
_DAMAGE = (OSError, KeyError, ValueError, TypeError, RuntimeError)


@dataclass(slots=True)
class DeepTally:
    """What ``deep`` recomputed: datasets, blocks and uncompressed bytes hashed."""

    datasets: int = 0
    blocks: int = 0
    nbytes: int = 0
    differ: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        hashed = human_size(self.nbytes)
        done = f"deep: {self.datasets} datasets, {self.blocks} blocks, {hashed} hashed"
        if not self.differ and not self.unreadable:
            return f"{done}, all SHA-256 digests equal"
        if self.differ:
            done += (
                f", SHA-256 digests differ in {len(self.differ)} of {self.datasets}: "
                + ", ".join(self.differ)
            )
        if self.unreadable:
            done += f"; {len(self.unreadable)} unreadable: " + ", ".join(self.unreadable)
        return done


@dataclass(slots=True)
class CheckReport:
    """``lines`` is the report, ``PROBLEM`` and ``WARNING`` lines where they were found."""

    path: Path
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    deep: DeepTally | None = None

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
    config = handle.attrs["config"]
    if hashlib.sha256(str(config).encode()).hexdigest() != handle.attrs["config_sha256"]:
        report.problem("attr config_sha256 does not match the stored config")
    report.lines.append(
        f"release {handle.attrs['name']} v{int(handle.attrs['version']):04d}, created "
        f"{handle.attrs['created_at']}, h5etl {handle.attrs.get('h5etl_version', '?')}"
    )


def _diagnostics(handle: h5py.File, report: CheckReport) -> dict[str, dict[str, Any]]:
    group = handle.get("diagnostics/datasets")
    if group is None:
        return {}
    if not isinstance(group, h5py.Group):
        report.problem("/diagnostics/datasets: not a group: not an h5etl release, or damaged")
        return {}
    out = {}
    for name in group:
        with _section(report, f"/diagnostics/datasets/{name}"):
            node = group[name]
            info = dict(node.attrs)
            digests = node["block_sha256"][...]
            if digests.dtype.kind != "S" or digests.ndim != 1:
                raise ValueError(f"block_sha256 is {digests.dtype} {digests.shape}, not S64 (n,)")
            info["block_sha256"] = [b.decode() for b in digests]
            out[str(info["dataset"])] = info
    return out


def _recompute(dataset: h5py.Dataset, info: dict[str, Any]) -> tuple[str, list[str], int]:
    """The dataset's digest, block digests and bytes hashed, recomputed from the stored data."""
    if dataset.dtype.kind == "O":
        texts = [r.decode("utf-8") if isinstance(r, bytes) else r for r in dataset[...]]
        data = digest.text_rows_bytes(texts)
        block = hashlib.sha256(data).digest()
        return digest.combine([block]), [block.hex()], len(data)
    if not info.get("block_rows"):
        # the sink hashes these (lineage) as one stream: one block, even when empty
        array = np.ascontiguousarray(dataset[...])
        block = digest.block_digest(array)
        return digest.combine([block]), [block.hex()], array.nbytes
    step = int(info["block_rows"])
    blocks, nbytes = [], 0
    for start in range(0, len(dataset), step):
        try:
            rows = np.ascontiguousarray(dataset[start : start + step])
        except OSError as exc:
            raise OSError(f"rows {start}..{start + step - 1} unreadable: {exc}") from exc
        blocks.append(digest.block_digest(rows))
        nbytes += rows.nbytes
    return digest.combine(blocks), [b.hex() for b in blocks], nbytes


def _deep_verify(dataset: h5py.Dataset, info: dict[str, Any], report: CheckReport) -> None:
    tally = report.deep
    assert tally is not None, "a deep check starts with a tally"
    tally.datasets += 1
    try:
        sha, blocks, nbytes = _recompute(dataset, info)
    except OSError as exc:
        tally.unreadable.append(dataset.name)
        report.problem(f"{dataset.name}: {exc}")
        return
    tally.blocks += len(blocks)
    tally.nbytes += nbytes
    if sha == info["sha256"]:
        return
    tally.differ.append(dataset.name)
    bad = [i for i, (a, b) in enumerate(zip(blocks, info["block_sha256"], strict=False)) if a != b]
    where = (
        f" (first bad block {bad[0]}, rows from {bad[0] * int(info['block_rows'])})" if bad else ""
    )
    report.problem(
        f"{dataset.name}: SHA-256 mismatch{where}: stored {info['sha256'][:16]}..., "
        f"computed {sha[:16]}..."
    )


def check_release(path: Path, *, deep: bool = False) -> CheckReport:
    """Inspect a release without modifying it.

    Returns:
        A report; ``report.ok`` is false when anything is damaged or missing.

    Raises:
        ConfigError: ``path`` is no file: missing, a folder, a link to nothing, a FIFO.
        CheckFailed: the file is not HDF5, or HDF5 cannot open it (truncated, overwritten).
    """
    report = CheckReport(path, deep=DeepTally() if deep else None)
    with hdf5info.open_file(path) as handle:
        with _section(report, "file attrs"):
            _attrs_section(handle, report)
        expected = _diagnostics(handle, report)
        if not expected:
            report.problem("no /diagnostics/datasets: not an h5etl release, or damaged")
        with _section(report, "/diagnostics/datasets"):
            for name in expected:
                if name not in handle:
                    report.problem(f"{name}: dataset listed in diagnostics is missing")
        counts = _splits_section(handle, expected, report, deep=deep)
        with _section(report, "/diagnostics/datasets"):
            _ratio_line(expected, report)
        with _section(report, "/"):
            report.lines.append(hdf5info.readers(_filter_ids(handle, counts)))
        with _section(report, "/diagnostics"):
            _rejects_line(handle, report)
        if report.deep is not None:
            report.lines.append(report.deep.line)
    _empty_section(counts, report)
    return report


def _splits_section(
    handle: h5py.File, expected: dict[str, dict[str, Any]], report: CheckReport, *, deep: bool
) -> dict[str, int]:
    """Report each split group; return its sample count."""
    counts = {}
    for split in (k for k in handle if k != "diagnostics"):
        group = handle.get(split)
        if not isinstance(group, h5py.Group):
            what = "a broken link" if group is None else f"a {type(group).__name__}"
            report.problem(f"/{split}: {what}, not a split group: not an h5etl release")
            continue
        with _section(report, f"/{split}"):
            counts[split] = _split_section(group, expected, report, deep=deep)
    return counts


def _empty_section(counts: dict[str, int], report: CheckReport) -> None:
    """A release of no sample is a problem (older versions published them); an empty split
    is a warning."""
    if not sum(counts.values()):
        report.problem(
            "0 samples in the release: every input was rejected, or none was found; "
            "build it again from inputs that pass (h5etl no longer publishes such builds)"
        )
        return
    for split, count in counts.items():
        if not count:
            report.warn(
                f"/{split}: 0 samples: the split is empty (too few inputs, or all of its "
                "inputs were rejected)"
            )


def _filter_ids(handle: h5py.File, splits: Iterable[str]) -> list[int]:
    """The filters of every dataset in the split groups ``check`` could read."""
    return [
        number
        for split in splits
        for dataset in handle[split].values()
        if isinstance(dataset, h5py.Dataset)
        for number in hdf5info.filter_ids(dataset)
    ]


def _rejects_line(handle: h5py.File, report: CheckReport) -> None:
    rejects = (
        {
            k.removeprefix("rejects_"): int(v)
            for k, v in handle["diagnostics"].attrs.items()
            if k.startswith("rejects_")
        }
        if "diagnostics" in handle
        else {}
    )
    total = rejects.pop("total", sum(rejects.values()))  # rejects_total is not a reason
    shown = ", ".join(f"{k} {v}" for k, v in rejects.items())
    report.lines.append(f"rejects: {total} ({shown})" if total else "rejects: none")


def _split_section(
    group: h5py.Group, expected: dict[str, dict[str, Any]], report: CheckReport, *, deep: bool
) -> int:
    datasets = [ds for ds in group.values() if isinstance(ds, h5py.Dataset)]
    count = max((_rows(ds) for ds in datasets), default=0)
    report.lines.append(f"{group.name}: {count} samples")
    for dataset in datasets:
        with _section(report, dataset.name):
            _dataset_section(dataset, count, expected, report, deep=deep)
    _values_section(group, report)
    return count


def _filters(dataset: h5py.Dataset) -> str:
    return "+".join(hdf5info.filter_name(n) for n in hdf5info.filter_ids(dataset)) or "none"


def _rows(dataset: h5py.Dataset) -> int:
    return int(dataset.shape[0]) if dataset.shape else 0  # a scalar or empty dataspace: none


def _dataset_section(
    dataset: h5py.Dataset,
    count: int,
    expected: dict[str, dict[str, Any]],
    report: CheckReport,
    *,
    deep: bool,
) -> None:
    info = expected.get(dataset.name)
    stored = info.get("stored_bytes") if info else None
    ratio = f", ratio {info.get('ratio')}" if info else ""
    report.lines.append(
        f"  {dataset.name.rsplit('/', 1)[-1]}: {dataset.shape} {dataset.dtype}, chunks "
        f"{dataset.chunks}, {_filters(dataset)}, stored {stored} bytes{ratio}"
    )
    if not dataset.shape:
        report.problem(f"{dataset.name}: a scalar, not rows of samples")
    elif _rows(dataset) != count:
        report.problem(f"{dataset.name}: {_rows(dataset)} rows, the split has {count}")
    if info is None:
        report.problem(f"{dataset.name}: no digest in /diagnostics")
    elif deep:
        _deep_verify(dataset, info, report)


# --- value histograms and the overall ratio (readers issue) ---------------------------------

BLOCK_BYTES = 1 << 26  # read masks in whole-chunk blocks of about 64 MiB: bounded memory


def _declared_values(handle: h5py.File) -> dict[str, list[int]]:
    """Fields whose stored config declares ``values`` (the masks), with those values."""
    try:
        config = yaml.safe_load(str(handle.attrs.get("config", ""))) or {}
    except yaml.YAMLError:
        return {}
    fields = config.get("fields") if isinstance(config, dict) else None
    if not isinstance(fields, dict):
        return {}
    return {
        name: [int(v) for v in spec["values"]]
        for name, spec in fields.items()
        if isinstance(spec, dict) and spec.get("values") is not None
    }


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


def _values_section(group: h5py.Group, report: CheckReport) -> None:
    for name, declared in _declared_values(group.file).items():
        dataset = group.get(name)
        if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "uib":
            continue
        try:
            counts, empty = value_histogram(dataset)
        except OSError as exc:  # a damaged chunk: report it, keep checking the rest
            report.problem(f"{dataset.name}: unreadable while counting values: {exc}")
            continue
        total = sum(counts.values()) or 1
        shown = ", ".join(
            f"{v} {100 * c / total:.2f}% ({c:,} px)" for v, c in sorted(counts.items())
        )
        report.lines.append(
            f"  {name} values: {shown or 'none'}; {empty} of {len(dataset)} samples all 0"
        )
        stray = sorted(set(counts) - set(declared))
        if stray:
            report.problem(f"{dataset.name}: values {stray} outside the declared {declared}")


def _ratio_line(expected: dict[str, dict[str, Any]], report: CheckReport) -> None:
    raw = sum(int(info.get("raw_bytes", 0)) for info in expected.values())
    stored = sum(int(info.get("stored_bytes", 0)) for info in expected.values())
    if stored:
        report.lines.append(
            f"compression: {raw:,} bytes raw, {stored:,} stored, ratio {raw / stored:.2f}"
        )
