"""clean: sanitise keys, stat or probe files, apply the oversize policy, assign splits.

Input: discovered samples. Output: a ``Plan`` (per split, samples in a seeded write order) and
rejects. Headers are read without decoding pixels. Splits are exact on a first release and
sticky after it (``h5etl.assign``): a sample keeps the split the previous release recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import stat
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl import expansion, geometry, images, inputs
from h5etl.errors import RejectError
from h5etl.kinds.base import Kind, ProbeTarget
from h5etl.kinds.tabular import Prepared
from h5etl.records import (
    Reject,
    Sample,
    sample_rejects,
    text_bytes,
    valid_text,
)

if TYPE_CHECKING:  # header probes run in the decode workers; pydantic stays out of them
    from h5etl.spec import Spec
    from h5etl.specparts import GroupBy

STAGE = "clean"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\:]+")
MAX_KEY_LENGTH = 255

Progress = Callable[[int], None]


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

    @classmethod
    def of(cls, spec: Spec, kinds: Sequence[Kind]) -> ProbeRules:
        targets = (kind.probe_target() for kind in kinds)
        folders = frozenset(
            i for i, source in enumerate(spec.sources.values()) if source.entries == "folders"
        )
        # only kinds that override it: this runs for every sample, and the rules travel to
        # the header probes' workers
        companions = tuple(
            (k.source_index, k)
            for k in kinds
            if k.source_index is not None and type(k).companion_paths is not Kind.companion_paths
        )
        return cls(
            spec.pad.oversize == "reject",
            tuple(t for t in targets if t is not None),
            folders,
            companions,
        )


ProbeBatch = Callable[[Sequence[Sample]], list[ProbeOutcome]]
Mapper = Callable[[ProbeBatch, Iterable[Sequence[Sample]]], Iterable[list[ProbeOutcome]]]
"""``mapper(fn, batches)`` runs ``fn`` on each batch (in parallel or not), results in order."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Samples per split in write order; decode tasks are cut from it lazily.

    It holds discover's own ``Sample`` objects (no per-sample copies: a plan of millions of
    files lives in the single parent process for the whole build).
    """

    splits: dict[str, list[Sample]]
    rejects: list[Reject]
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (original key, new key)
    digest: str = ""  # SHA-256 of splits, keys, file names, probed sizes, file sizes and mtimes
    kinds: tuple[Kind, ...] = ()  # the fields' kinds, bound to the inputs (class names found)
    warnings: list[str] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # how splits were assigned (JSON)
    stamps: dict[str, str] = field(default_factory=dict)  # key -> its files' sizes and mtimes

    @property
    def total(self) -> int:
        return sum(len(samples) for samples in self.splits.values())

    def fingerprint(self) -> str:
        """What a resume must find unchanged: splits, keys, files, their sizes and mtimes."""
        return self.digest


def sanitize_key(key: str) -> str:
    """NFC, control characters and backslashes/colons as ``_``, undecodable bytes of a name
    as ``\\xNN``, at most 255 characters."""
    cleaned = _UNSAFE.sub("_", unicodedata.normalize("NFC", valid_text(key))).strip() or "_"
    if len(cleaned) > MAX_KEY_LENGTH:
        digest = hashlib.sha256(cleaned.encode()).hexdigest()[:12]
        cleaned = f"{cleaned[: MAX_KEY_LENGTH - 13]}~{digest}"
    return cleaned


def sanitize_keys(samples: Sequence[Sample]) -> tuple[list[Sample], list[tuple[str, str]]]:
    """Sanitise every key; keys that collide afterwards are all kept, numbered ``key~2``, ...

    A key that needs no cleaning keeps its name, so a new file that cleans to it (``img:1``
    beside ``img_1``) cannot rename a file of earlier releases; the others are numbered in
    the (sorted) order given.
    """
    cleaned = [sanitize_key(s.key) for s in samples]
    counts = Counter(cleaned)
    taken = set(cleaned)  # a number must not land on a key that exists already (``a~2``)
    claimed = {c for sample, c in zip(samples, cleaned, strict=True) if sample.key == c}
    used: Counter[str] = Counter()
    out, renamed = [], []
    for sample, clean in zip(samples, cleaned, strict=True):
        key = clean
        if counts[clean] > 1 and sample.key != clean:
            if clean in claimed:
                used[clean] = max(used[clean], 1) + 1
                while f"{clean}~{used[clean]}" in taken:
                    used[clean] += 1
                key = f"{clean}~{used[clean]}"
                taken.add(key)
            else:
                claimed.add(clean)
        if key != sample.key:
            renamed.append((sample.key, key))
            sample = Sample(key, sample.relpaths, sample.roots)
        out.append(sample)  # unchanged samples are kept, not copied: plans can be large
    return out, renamed


def _reject_sample(sample: Sample, reason: str, detail: str, cause: str = "") -> list[Reject]:
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
        try:
            if index in rules.folders:
                stamps.append(inputs.folder_stamp(path))
                continue
            info = os.stat(path)
        except OSError as exc:
            return _reject_sample(sample, *_stat_problem(path, exc), path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the worker that opens it
            return _reject_sample(sample, "not_a_file", "not a regular file", path)
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
            return _reject_sample(sample, exc.reason, exc.message, path)
        sizes[target.name] = (header.height, header.width)
    stamped = _stamp_sample(sample, rules)
    if isinstance(stamped, list):
        return stamped
    for target in rules.targets:
        problem = _size_problem(target, sizes, rules.reject_oversize)
        if problem is not None:
            return _reject_sample(sample, *problem)
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


def plan(
    spec: Spec,
    samples: Sequence[Sample],
    progress: Progress | None = None,
    *,
    mapper: Mapper | None = None,
    headers: bool = True,
    kinds: Sequence[Kind] | None = None,
    previous: Mapping[str, str] | None = None,
) -> Plan:
    """Probe and place every sample.

    ``mapper`` runs the header probes (``probe_samples`` over batches of samples), e.g. on the
    decode workers; by default they run here. Placement does not depend on it. With
    ``headers=False`` only the files' sizes and mtimes are read: a build decodes every
    sample anyway, and decoding makes every check a header probe makes, so the probes would
    only read each file twice (a fifth of a build's wall time, before any decoding).
    Values known without decoding (labels, table columns) are found here, in the parent: a
    sample without one is rejected now, and they travel with it (``Sample.extras``).
    ``previous`` (sample name -> split, from the previous release's record) makes the
    splits sticky (``h5etl.assign``).

    Returns:
        The plan; every input is either in it once or among its rejects.
    """
    if kinds is None:
        from h5etl.kinds.registry import kinds_of  # the parent's: it reads the config

        kinds = kinds_of(spec)
    renamed_samples, renamed = sanitize_keys(samples)
    rules = ProbeRules.of(spec, kinds)
    batches = [
        renamed_samples[i : i + PROBE_BATCH] for i in range(0, len(renamed_samples), PROBE_BATCH)
    ]
    probe_batch: ProbeBatch = (
        functools.partial(probe_samples, rules=rules)
        if headers
        else functools.partial(stamp_samples, rules=rules)
    )
    outcomes = map(probe_batch, batches) if mapper is None else mapper(probe_batch, batches)
    rejects: list[Reject] = []
    passed: list[tuple[Sample, Probed]] = []
    for batch, results in zip(batches, outcomes, strict=True):
        for sample, outcome in zip(batch, results, strict=True):
            if isinstance(outcome, list):
                rejects.extend(outcome)
            else:
                passed.append((sample, outcome))
        if progress is not None:
            progress(len(batch))
    annotated, bound, warnings = _annotated(passed, kinds, rejects)
    by_split, policy = _assigned(spec, annotated, bound, renamed, previous, rejects)
    by_split = expansion.expanded(by_split, bound)
    digest = hashlib.sha256()
    for split, pairs in by_split.items():
        for sample, outcome in pairs:
            names = "\x01".join(sample.relpaths)
            size = f"{outcome.height}x{outcome.width}\x01{outcome.stamp}"
            extras = f"\x03{sample.extras!r}" if sample.extras else ""
            digest.update(text_bytes(f"\x00{split}\x02{sample.key}\x01{names}\x01{size}{extras}"))
    rng = np.random.default_rng(spec.seed)
    ordered = {}
    for name, placed in by_split.items():
        members = sorted((sample for sample, _ in placed), key=lambda s: s.key)
        ordered[name] = [members[i] for i in rng.permutation(len(members))]
    stamps = {sample.key: outcome.stamp for pairs in by_split.values() for sample, outcome in pairs}
    return Plan(
        ordered, rejects, renamed, digest.hexdigest(), tuple(bound), warnings, policy, stamps
    )


def _annotated(
    passed: list[tuple[Sample, Probed]], kinds: Sequence[Kind], rejects: list[Reject]
) -> tuple[list[tuple[Sample, Probed]], list[Kind], list[str]]:
    """Each sample with its plan-side values (``extras``); the kinds bound to the inputs."""
    planned = [kind for kind in kinds if kind.plan_side]
    if not planned:
        return passed, list(kinds), []
    samples = [sample for sample, _ in passed]
    prepared: list[Prepared] = [kind.prepare(samples) for kind in planned]
    bound = {p.kind.name: p.kind for p in prepared}
    out = []
    for sample, outcome in passed:
        try:
            extras = tuple(p.value(sample) for p in prepared)
        except RejectError as exc:
            rejects.extend(_reject_sample(sample, exc.reason, exc.message, str(exc.path or "")))
            continue
        out.append((dataclasses.replace(sample, extras=extras), outcome))
    warnings = [w for p in prepared for w in p.warnings]
    return out, [bound.get(kind.name, kind) for kind in kinds], warnings


def _assigned(
    spec: Spec,
    annotated: list[tuple[Sample, Probed]],
    kinds: Sequence[Kind],
    renamed: list[tuple[str, str]],
    previous: Mapping[str, str] | None,
    rejects: list[Reject],
) -> tuple[dict[str, list[tuple[Sample, Probed]]], dict[str, Any]]:
    """Samples per split, and the policy that placed them (``h5etl.assign``). A sample's split
    follows from its own name (NFC), never from the key it was given, which can change when
    another file's key collides with it."""
    from h5etl import assign

    originals = {new: old for old, new in renamed}
    planned = [kind.name for kind in kinds if kind.plan_side]
    if spec.group_by is not None:
        annotated = _grouped(spec.group_by, annotated, planned, rejects)
    names = [
        unicodedata.normalize("NFC", originals.get(sample.key, sample.key))
        for sample, _ in annotated
    ]
    strata = None
    if spec.stratify is not None:
        column = planned.index(spec.stratify)
        strata = [sample.extras[column] for sample, _ in annotated]
    groups = [sample.group for sample, _ in annotated] if spec.group_by is not None else None
    placed = assign.assign(
        names, spec.splits, spec.seed, strata=strata, groups=groups, previous=previous
    )
    by_split: dict[str, list[tuple[Sample, Probed]]] = {name: [] for name in spec.splits}
    for (sample, outcome), name, split in zip(annotated, names, placed.splits, strict=True):
        if name != sample.key:  # the per-sample record stores the name, not the new key
            sample = dataclasses.replace(sample, name=name)
        by_split[split].append((sample, outcome))
    policy = {
        **placed.policy,
        "fractions": dict(spec.splits),
        "seed": spec.seed,
        "stratify": spec.stratify,
        "group_by": None if spec.group_by is None else spec.group_by.describe(),
        "counts": {split: len(members) for split, members in by_split.items()},
    }
    return by_split, policy


def _grouped(
    group_by: GroupBy,
    annotated: list[tuple[Sample, Probed]],
    planned: list[str],
    rejects: list[Reject],
) -> list[tuple[Sample, Probed]]:
    """Each sample with its group; a sample without one is a ``no_group`` reject."""
    pattern = re.compile(group_by.pattern) if group_by.pattern is not None else None
    column = planned.index(group_by.field) if group_by.field is not None else -1
    out = []
    for sample, outcome in annotated:
        if pattern is not None:
            found = pattern.search(sample.relpaths[0].replace(os.sep, "/"))
            group = (found.group(1) if pattern.groups else found.group(0)) if found else None
            why = f"{sample.relpaths[0]!r} does not match splits.group_by {group_by.pattern!r}"
        else:
            value = sample.extras[column]
            group = None if value is None else str(value)
            why = f"no value of {group_by.field!r} to group by"
        if not group:
            rejects.extend(_reject_sample(sample, "no_group", why))
            continue
        out.append((dataclasses.replace(sample, group=group), outcome))
    return out
