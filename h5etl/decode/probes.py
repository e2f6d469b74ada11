"""probes: what a plan reads of each sample's files before decoding: their stamps (sizes and
mtimes, a kind's companion files too) or, in a dry run, their headers.

Plain data and functions, picklable: header probes run in the decode workers (``plan`` maps
``probe_samples`` over batches there), so nothing here imports pydantic or the spec.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from h5etl.dataflow import Reject, Sample, sample_rejects
from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs
from h5etl.inputs import raster as images
from h5etl.inputs.urls import is_remote
from h5etl.kinds import placement as geometry
from h5etl.kinds.base import Kind, ProbeTarget

STAGE = "clean"  # the rejects found here are the plan's


@dataclass(frozen=True, slots=True)
class Probed:
    """A sample that passed its header probes: its size, and what identifies its files' bytes."""

    height: int
    width: int
    stamp: str  # size and mtime (ns) of each file: a resume must find the same bytes


ProbeOutcome = Probed | list[Reject]
PROBE_BATCH = 128  # samples per probe task: big enough that IPC is noise beside the probes


@dataclass(frozen=True, slots=True)
class ProbeRules:
    """What a header probe checks beyond readability: plain data, picklable for workers."""

    reject_oversize: bool
    targets: tuple[ProbeTarget, ...]
    folders: frozenset[int] = frozenset()  # sources whose entries are folders
    # (source index, kind) of kinds that read files beside their source's (Kind.companion_paths)
    companions: tuple[tuple[int, Kind], ...] = ()
    headers: tuple[Kind, ...] = ()  # kinds with a header probe of their own, in decode order


ProbeBatch = Callable[[Sequence[Sample]], list[ProbeOutcome]]
Mapper = Callable[[ProbeBatch, Iterable[Sequence[Sample]]], Iterable[list[ProbeOutcome]]]
"""``mapper(fn, batches)`` runs ``fn`` on each batch (in parallel or not), results in order."""


def reject_sample(sample: Sample, reason: str, detail: str, cause: str = "") -> list[Reject]:
    return sample_rejects(sample, STAGE, reason, detail, cause)


def _stat_problem(path: str, exc: OSError) -> tuple[str, str]:
    """The reject reason and detail for a file that cannot be stat'ed."""
    linked = inputs.link_problem(path, exc)
    if linked is not None:
        return linked.reason, linked.message
    return "unreadable", f"cannot read: {exc.strerror or exc}"


_NO_RULES = ProbeRules(False, ())


def _stamp_sample(sample: Sample, rules: ProbeRules = _NO_RULES) -> ProbeOutcome:
    """The files' stamps alone (size and mtime): what a build needs before decoding; a folder
    entry's stamp is that of each file in it, a file's companions' follow its own."""
    stamps = []
    for index, path in enumerate(sample.paths):  # paths, not files: no object per file
        if path[:1] != "/" and is_remote(path):
            from h5etl.inputs import remote_files  # only a build from object storage loads it

            try:  # an object: its listed size, ETag and version (no request)
                stamps.append(remote_files.stamp_of(path))
            except RejectError as exc:
                return reject_sample(sample, exc.reason, exc.message, path)
            continue
        try:
            if index in rules.folders:
                stamps.append(inputs.folder_stamp(path))
                continue
            info = os.stat(path)
        except OSError as exc:
            return reject_sample(sample, *_stat_problem(path, exc), path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the worker that opens it
            return reject_sample(sample, "not_a_file", "not a regular file", path)
        stamps.append(f"{info.st_size}:{info.st_mtime_ns}")
        for source_index, kind in rules.companions:
            if source_index == index:
                stamps.append(_companion_stamps(kind.companion_paths(path)))
    return Probed(0, 0, ",".join(stamps))


def _companion_stamps(paths: Sequence[str]) -> str:
    """Each companion's stamp; one that cannot be stat'ed is marked so (decoding rejects the
    sample and says why: a stat here would word it worse)."""
    parts = []
    for path in paths:
        try:
            info = os.stat(path)
            parts.append(f"{info.st_size}:{info.st_mtime_ns}")
        except OSError:
            parts.append("-")
    return "+".join(parts)


def stamp_samples(samples: Sequence[Sample], rules: ProbeRules = _NO_RULES) -> list[ProbeOutcome]:
    """Stamp a batch of samples without reading them (``plan(..., headers=False)``)."""
    return [_stamp_sample(sample, rules) for sample in samples]


def _probe_sample(sample: Sample, rules: ProbeRules) -> ProbeOutcome:
    """The sample's size from its headers (and its files' stamps), or the rejects of its files."""
    files = sample.files
    sizes: dict[str, tuple[int, int]] = {}
    for target in rules.targets:
        path = files[target.source_index].path
        try:
            header = images.probe(path)
        except RejectError as exc:
            return reject_sample(sample, exc.reason, exc.message, path)
        sizes[target.name] = (header.height, header.width)
    notes: dict[str, Any] = {}
    for kind in rules.headers:
        assert kind.source_index is not None
        path = files[kind.source_index].path
        try:
            kind.probe_header(path, notes)
        except RejectError as exc:
            return reject_sample(sample, exc.reason, exc.message, str(exc.path or path))
    stamped = _stamp_sample(sample, rules)
    if isinstance(stamped, list):
        return stamped
    for target in rules.targets:
        problem = _size_problem(target, sizes, rules.reject_oversize)
        if problem is not None:
            return reject_sample(sample, *problem)
    height, width = next(iter(sizes.values()), (0, 0))
    return Probed(height, width, stamped.stamp)


def _size_problem(
    target: ProbeTarget, sizes: dict[str, tuple[int, int]], reject_oversize: bool
) -> tuple[str, str] | None:
    size = sizes[target.name]
    if target.same_as is not None and sizes.get(target.same_as, size) != size:
        other = sizes[target.same_as]
        return "size_mismatch", (
            f"sizes differ (HxW): {target.same_as} {other[0]}x{other[1]}, "
            f"{target.name} {size[0]}x{size[1]}"
        )
    if target.times is not None and target.times[0] in sizes:
        of, factor = target.times
        other = sizes[of]
        if size != (other[0] * factor, other[1] * factor):
            return "scale_mismatch", (
                f"{target.name} is {size[0]}x{size[1]}, expected {factor} x {of} "
                f"{other[0]}x{other[1]}"
            )
    if reject_oversize and geometry.is_oversize(size, (target.height, target.width)):
        return "oversize", (
            f"{size[0]}x{size[1]} is larger than fields.{target.name}.shape "
            f"{target.height}x{target.width} (pad.oversize: reject; crop or resize to keep it)"
        )
    return None


def probe_samples(samples: Sequence[Sample], rules: ProbeRules) -> list[ProbeOutcome]:
    """Probe a batch of samples; a decode worker runs this (see ``plan``'s ``mapper``)."""
    return [_probe_sample(sample, rules) for sample in samples]
