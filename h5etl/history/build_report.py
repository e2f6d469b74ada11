"""build_report: what a build did, and the rules that fail it on its rejects and its losses.

A build fails when rejects pass ``on_error``/``max_rejects`` or when it would store nothing.
The loss guard (``guard``) fails one that would publish an empty split or class that was not
empty in the parent release, or store more than ``max_shrink`` fewer samples than the parent;
``allow_empty`` and ``--allow-loss`` (``Spec.loss_allowed``) turn those into warnings. Dry
runs apply the same rules where they know the counts, so they fail as the build would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5etl import docrefs
from h5etl.dataflow import Reject
from h5etl.errors import BuildFailed

if TYPE_CHECKING:  # pydantic loads with the build, not with ``h5etl releases``
    from h5etl.config.spec import Spec

PLAN_CHECKS = (
    "discovery and pairing (orphans, duplicates, unreadable folders, links)",
    "file headers and ends (format, truncation, size, size mismatch, oversize)",
)
DECODE_CHECKS = (
    "decoding (format, truncation, pixel data, modes, sizes, size mismatch, oversize, fit)",
    "mask values",
)


# What each conversion code a kind counts means, for the summary.
CONVERSIONS = {"16_to_8_bits": "16-bit inputs scaled to 8 bits (v >> 8)"}


@dataclass(slots=True)
class BuildReport:
    """What a build did; the CLI renders it, tests assert on it."""

    name: str
    inputs: int
    samples: dict[str, int]
    rejects: list[Reject]
    seconds: dict[str, float]
    version: int | None = None
    path: Path | None = None
    link: Path | None = None
    url: str = ""  # the published release's URL when the output is object storage
    rejects_path: Path | None = None
    created_at: str = ""  # the release's created_at attribute
    raw_bytes: int = 0
    stored_bytes: int = 0
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    chunk_paths: dict[str, int] = field(default_factory=dict)
    resumed: int = 0  # samples copied from a killed build instead of decoded again
    reused: int = 0  # samples carried from the parent release (incremental build)
    reused_bytes: int = 0  # their stored chunk bytes, copied as they were
    redone: tuple[str, ...] = ()  # fields made again for the carried samples (changed code)
    shards: int = 0  # shard writers of a sharded build (0: one writer)
    shards_reused: int = 0  # shards a killed sharded build had committed, reused
    virtual: bool = False  # the release maps its arrays onto its part files (--vds)
    checks: list[str] = field(default_factory=list)  # what a dry run verified
    warnings: list[str] = field(default_factory=list)
    conversions: dict[str, dict[str, int]] = field(default_factory=dict)  # field -> code -> n
    class_counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    change: str = (
        ""  # the semantic label from the parent release and why (h5etl.history.release_notes)
    )
    up_to_date: bool = False  # nothing changed: no new release, ``version`` is the linked one

    @property
    def reject_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.reason for r in self.rejects).items()))


# How an error of the loss guards ends: the one way to publish anyway, for this build only.
LOSS_HINT = (
    "if the loss is intended, `h5etl build --allow-loss` publishes it (this build only; "
    "max_rejects, max_shrink and allow_empty set the guards)"
)


@dataclass(frozen=True, slots=True)
class Before:
    """The parent release (the link's) as the loss guard compares a build with it."""

    version: int
    counts: Mapping[str, int]  # samples per split
    classes: Mapping[str, Mapping[str, int]]  # label field -> class -> samples in all splits

    @property
    def name(self) -> str:
        return f"v{self.version:04d}"


def _reject_limit(spec: Spec, inputs: int, *, lifted: bool = True) -> int | None:
    if spec.on_error == "fail":
        return 0
    if spec.max_rejects is None or (lifted and spec.loss_allowed):
        return None
    if isinstance(spec.max_rejects, float):
        return int(spec.max_rejects * inputs)
    return spec.max_rejects


def rejected_files(rejects: list[Reject]) -> int:
    """The input files ``rejects`` name, each once: a recording cut into windows is one
    input file however many of its windows were rejected, so the count and ``max_rejects``
    stay in the unit of ``inputs`` (a share never above 100 %)."""
    return len({r.path for r in rejects})


def rejects_said(rejects: list[Reject]) -> str:
    """How many files were rejected, and how many samples when that differs (windows)."""
    files = rejected_files(rejects)
    said = f"{files} file{'' if files == 1 else 's'}"
    if len(rejects) > files:  # several samples of one file (windows): both, each in its unit
        said += f", {len(rejects)} samples"
    return said


def _tally(rejects: list[Reject]) -> str:
    counts = Counter(r.reason for r in rejects)
    return ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))


def enforce_limit(spec: Spec, rejects: list[Reject], inputs: int) -> None:
    limit = _reject_limit(spec, inputs)
    # called after every decoded batch: count the files (a set) only past the cheap bound
    if limit is None or len(rejects) <= limit or rejected_files(rejects) <= limit:
        return
    if spec.on_error == "fail":
        first = rejects[0]
        raise BuildFailed(
            f"{first.reason}: {first.detail} (on_error: fail; no release was made)",
            path=first.path,
            rejects=rejects,
            docs=docrefs.reject(first.reason),
        )
    raise BuildFailed(
        f"{_over_limit(spec, rejects, inputs, final=False)}; no release was made; {LOSS_HINT}",
        path=spec.config_file,
        rejects=rejects,
        docs=docrefs.guard("max_rejects"),
    )


def _over_limit(spec: Spec, rejects: list[Reject], inputs: int, *, final: bool = True) -> str:
    """The rejects past ``max_rejects``; not ``final``: the build stopped there, and the
    files it did not decode may hold more."""
    files = rejected_files(rejects)
    share = f" ({files / inputs:.0%})" if inputs else ""
    samples = f", {len(rejects)} samples" if len(rejects) > files else ""
    return (
        f"{'' if final else 'at least '}{files} of {inputs} input files rejected{share}{samples}, "
        f"over max_rejects "
        f"{spec.max_rejects} ({_tally(rejects)})"
    )


def require_samples(spec: Spec, samples: dict[str, int], report: BuildReport) -> None:
    """A build that would store nothing fails: an empty release helps no one."""
    if any(samples.values()):
        return
    why = f" ({_tally(report.rejects)})" if report.rejects else ""
    if not report.inputs:  # "0 of 0 files were rejected" says nothing: say where it looked
        looked = "; ".join(
            f"sources.{name}: {source.glob!r} in {source.dir}"
            for name, source in spec.sources.items()
        )
        raise BuildFailed(
            f"no sample to store: the sources matched no file ({looked}); no release was made",
            path=spec.config_file,
            rejects=report.rejects,
        )
    raise BuildFailed(
        f"no sample to store: {rejected_files(report.rejects)} of {report.inputs} input files were "
        f"rejected{why}; no release was made",
        path=spec.config_file,
        rejects=report.rejects,
    )


def guard(
    spec: Spec, report: BuildReport, planned: Mapping[str, int], before: Before | None
) -> None:
    """Fail a build that would lose data past the loss guards; a lifted guard warns.

    Lost: a split left empty that held samples in ``before`` (the parent release) or whose
    planned samples were all rejected; a class (of a label field) left empty that was not
    empty in ``before`` (any, in a first build); more than ``max_shrink`` of the parent's
    samples. ``report.class_counts`` empty: no label field. Rejects past ``max_rejects``
    fail earlier (``enforce_limit``); under ``--allow-loss`` they are warned of here.

    Raises:
        BuildFailed: one line naming every loss and the counts, and how to publish anyway.
    """
    empty = _empty_splits(spec, report.samples, planned, before)
    empty += _empty_classes(report.class_counts, before)
    shrink = _shrink(spec, sum(report.samples.values()), before)
    guarded = not spec.loss_allowed
    failing = [text for text, new in empty if new and not spec.allow_empty and guarded]
    failing += shrink if guarded else []
    if failing:
        raise BuildFailed(
            f"{'; '.join(failing)}; no release was made; {LOSS_HINT}",
            path=spec.config_file,
            rejects=report.rejects,
            docs=docrefs.GUARD,
        )
    # published: every loss is said, and which only --allow-loss let through
    limit = _reject_limit(spec, report.inputs, lifted=False)
    if spec.loss_allowed and limit is not None and rejected_files(report.rejects) > limit:
        report.warnings.append(f"--allow-loss: {_over_limit(spec, report.rejects, report.inputs)}")
    for text, new in empty:
        report.warnings.append(f"--allow-loss: {text}" if new and not spec.allow_empty else text)
    report.warnings.extend(f"--allow-loss: {text}" for text in shrink)


def _empty_splits(
    spec: Spec, samples: Mapping[str, int], planned: Mapping[str, int], before: Before | None
) -> list[tuple[str, bool]]:
    """Each split that stores nothing, and whether that is a loss (the parent held samples
    in it, or it had planned samples, all rejected); nothing when the build stores nothing."""
    total = sum(samples.values())
    out = []
    for split, count in samples.items():
        if count or not total:
            continue
        held = None if before is None else before.counts.get(split)
        if planned.get(split):
            text = f"split {split!r} is empty: all {planned[split]} of its samples were rejected"
        else:
            text = (
                f"split {split!r} is empty: none of the {total} samples fell in it "
                f"(splits.{split}: {spec.splits[split]:g}); add samples or change the fractions"
            )
        if held and before is not None:
            text += f" ({before.name} held {held})"
        # lost: what the parent held, or what was planned; too few samples for the
        # fractions lose nothing (a warning, as ever)
        out.append((text, bool(held) or (held is None and bool(planned.get(split)))))
    return out


def _empty_classes(
    counts: Mapping[str, Mapping[str, Mapping[str, int]]], before: Before | None
) -> list[tuple[str, bool]]:
    """Each class of a label field that no split stores (one the parent held included,
    when the build no longer knows it), and whether that is new (the parent held some)."""
    totals: dict[str, Counter[str]] = {}
    for fields in counts.values():
        for name, classes in fields.items():
            totals.setdefault(name, Counter()).update(classes)
    out = []
    for name, found in totals.items():
        held = {} if before is None else before.classes.get(name, {})
        for label in [*found, *(c for c in held if c not in found)]:
            if found.get(label, 0):
                continue
            was = held.get(label)
            where = f" ({before.name} held {was})" if was and before is not None else ""
            out.append((f"class {label!r} of field {name!r} is empty{where}", was != 0))
    return out


def _shrink(spec: Spec, stored: int, before: Before | None) -> list[str]:
    """More than ``max_shrink`` of the parent's samples lost, said with the counts."""
    held = 0 if before is None else sum(before.counts.values())
    if before is None or spec.max_shrink is None or held - stored <= spec.max_shrink * held:
        return []
    lost = held - stored
    return [
        f"{stored:,} samples stored, {lost:,} ({lost / held:.0%}) fewer than "
        f"{before.name}'s {held:,}: over max_shrink {spec.max_shrink:g}"
    ]
