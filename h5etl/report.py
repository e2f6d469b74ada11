"""report: what a build did, and the rules that fail it on its rejects.

A build fails when rejects pass ``on_error``/``max_rejects`` or when it would store nothing;
a split left empty is a warning. Dry runs apply the same rules, so they fail as the build would.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5etl.errors import BuildFailed
from h5etl.records import Reject
from h5etl.spec import Spec

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
    rejects_path: Path | None = None
    created_at: str = ""  # the release's created_at attribute
    raw_bytes: int = 0
    stored_bytes: int = 0
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    chunk_paths: dict[str, int] = field(default_factory=dict)
    resumed: int = 0  # samples copied from a killed build instead of decoded again
    reused: int = 0  # samples carried from the parent release (incremental build)
    reused_bytes: int = 0  # their stored chunk bytes, copied as they were
    shards: int = 0  # shard writers of a sharded build (0: one writer)
    shards_reused: int = 0  # shards a killed sharded build had committed, reused
    virtual: bool = False  # the release maps its arrays onto its part files (--vds)
    checks: list[str] = field(default_factory=list)  # what a dry run verified
    warnings: list[str] = field(default_factory=list)
    conversions: dict[str, dict[str, int]] = field(default_factory=dict)  # field -> code -> n
    class_counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    change: str = ""  # the semantic label from the parent release and why (h5etl.story)
    up_to_date: bool = False  # nothing changed: no new release, ``version`` is the linked one

    @property
    def reject_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.reason for r in self.rejects).items()))


def _reject_limit(spec: Spec, inputs: int) -> int | None:
    if spec.on_error == "fail":
        return 0
    if spec.max_rejects is None:
        return None
    if isinstance(spec.max_rejects, float):
        return int(spec.max_rejects * inputs)
    return spec.max_rejects


def _tally(rejects: list[Reject]) -> str:
    counts = Counter(r.reason for r in rejects)
    return ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))


def enforce_limit(spec: Spec, rejects: list[Reject], inputs: int) -> None:
    limit = _reject_limit(spec, inputs)
    if limit is None or len(rejects) <= limit:
        return
    if spec.on_error == "fail":
        first = rejects[0]
        raise BuildFailed(
            f"{first.reason}: {first.detail} (on_error: fail; no release was made)",
            path=first.path,
            rejects=rejects,
        )
    raise BuildFailed(
        f"{len(rejects)} of {inputs} input files rejected, over max_rejects {spec.max_rejects} "
        f"({_tally(rejects)}); no release was made",
        path=spec.config_file,
        rejects=rejects,
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
        f"no sample to store: {len(report.rejects)} of {report.inputs} input files were "
        f"rejected{why}; no release was made",
        path=spec.config_file,
        rejects=report.rejects,
    )


def empty_split_warnings(spec: Spec, samples: dict[str, int], planned: dict[str, int]) -> list[str]:
    """A warning per split that stores nothing: none planned for it, or all of them rejected."""
    total = sum(samples.values())
    warnings = []
    for split, count in samples.items():
        if count or not total:
            continue
        if planned.get(split):
            warnings.append(
                f"split {split!r} is empty: all {planned[split]} of its samples were rejected"
            )
        else:
            warnings.append(
                f"split {split!r} is empty: none of the {total} samples fell in it "
                f"(splits.{split}: {spec.splits[split]:g}); add samples or change the fractions"
            )
    return warnings
