"""admit: sanitise keys, stat or probe files, apply the oversize policy, assign splits.

Input: discovered samples. Output: a ``Plan`` (per split, samples in a seeded write order) and
rejects. Headers are read without decoding pixels. Splits are exact on a first release and
sticky after it (``h5etl.plan.split_assign``): a sample keeps the split the previous release
recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl.dataflow import (
    Reject,
    Sample,
    text_bytes,
    valid_text,
)
from h5etl.decode.probes import (
    PROBE_BATCH,
    Mapper,
    ProbeBatch,
    Probed,
    probe_samples,
    stamp_samples,
)
from h5etl.decode.probes import reject_sample as _reject_sample
from h5etl.errors import RejectError
from h5etl.kinds.base import Kind
from h5etl.kinds.tabular import Prepared
from h5etl.plan import expansion
from h5etl.plan.probe_rules import probe_rules
from h5etl.plan.result import Plan
from h5etl.transforms.apply import Transforms

if TYPE_CHECKING:  # header probes run in the decode workers; pydantic stays out of them
    from h5etl.config.sections import GroupBy
    from h5etl.config.spec import Spec

STAGE = "clean"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\:]+")
MAX_KEY_LENGTH = 255

Progress = Callable[[int], None]


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
    splits sticky (``h5etl.plan.split_assign``).

    Returns:
        The plan; every input is either in it once or among its rejects.
    """
    if kinds is None:
        from h5etl.plan.kind_registry import kinds_of  # the parent's: it reads the config

        kinds = kinds_of(spec)
    renamed_samples, renamed = sanitize_keys(samples)
    rules = probe_rules(spec, kinds)
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
    # bound on every input, the ones a header probe rejected included: the classes and the
    # table rows they name are the build's (which probes nothing), so a dry run sees a class
    # all of whose files were rejected, and rejected files' rows still match a file
    annotated, bound, warnings = _annotated(passed, kinds, rejects, renamed_samples)
    by_split, policy = _assigned(spec, annotated, bound, renamed, previous, rejects)
    by_split = expansion.expanded(by_split, bound)
    digest = hashlib.sha256()
    for split, pairs in by_split.items():
        for sample, outcome in pairs:
            names = "\x01".join(sample.relpaths)
            size = f"{outcome.height}x{outcome.width}\x01{outcome.stamp}"
            extras = f"\x03{sample.extras!r}" if sample.extras else ""
            digest.update(text_bytes(f"\x00{split}\x02{sample.key}\x01{names}\x01{size}{extras}"))
    ordered = write_order(spec.seed, {s: [p[0] for p in pairs] for s, pairs in by_split.items()})
    stamps = {sample.key: outcome.stamp for pairs in by_split.values() for sample, outcome in pairs}
    return Plan(
        ordered,
        rejects,
        renamed,
        digest.hexdigest(),
        tuple(bound),
        warnings,
        policy,
        stamps,
        rules,
        previous,
        _transforms(spec, bound),
    )


def _transforms(spec: Spec, kinds: Sequence[Kind]) -> Transforms | None:
    """The config's user code, resolved (imported lazily: the parent's, it reads the config)."""
    from h5etl.plan.user_code import user_code

    return user_code(spec, kinds).transforms


def write_order(seed: int, by_split: Mapping[str, Sequence[Sample]]) -> dict[str, list[Sample]]:
    """Each split's samples in the seeded write order: sorted by key, then permuted."""
    rng = np.random.default_rng(seed)
    ordered = {}
    for name, placed in by_split.items():
        members = sorted(placed, key=lambda s: s.key)
        ordered[name] = [members[i] for i in rng.permutation(len(members))]
    return ordered


def _annotated(
    passed: list[tuple[Sample, Probed]],
    kinds: Sequence[Kind],
    rejects: list[Reject],
    inputs: Sequence[Sample],
) -> tuple[list[tuple[Sample, Probed]], list[Kind], list[str]]:
    """Each sample with its plan-side values (``extras``); the kinds bound to all ``inputs``."""
    planned = [kind for kind in kinds if kind.plan_side]
    if not planned:
        return passed, list(kinds), []
    prepared: list[Prepared] = [kind.prepare(inputs) for kind in planned]
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
    """Samples per split, and the policy that placed them (``h5etl.plan.split_assign``). A sample's
    split follows from its own name (NFC), never from the key it was given, which can change when
    another file's key collides with it."""
    from h5etl.plan import split_assign as assign

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
        if name != sample.key:  # the sample keys store the name, not the new key
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
