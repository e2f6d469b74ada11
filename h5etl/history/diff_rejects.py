"""diff_rejects: what changed in the rejects from one release to another (``diff``'s section).

A release stores its rejects (``/diagnostics/rejects``: a row per file left out, with its
stage, reason, detail and the sample's key). A sample's rows are matched across the two
releases by that key (by path for a row without one), and against the samples each stores:

- *fixed*: rejected in A, stored in B (with the reason A gave), not only "added";
- *newly rejected*: rejected in B, not in A (with its reason; and the split A stored it in);
- *another reason*: rejected in both, for different reasons (both shown);
- *cleared*: rejected in A, neither rejected nor stored in B (its input is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from h5etl.history.snapshot import RejectFacts, Snapshot

__all__ = ["RejectChange", "RejectsDiff", "compare_rejects", "reject_notes"]


@dataclass(frozen=True, slots=True)
class RejectChange:
    """One sample whose rejection changed: ``before`` (A's reason) or ``after`` (B's) is
    None where that release does not reject it."""

    key: str
    path: str  # the file that was (or is) the reason, as the release stores it
    before: str | None
    after: str | None
    detail: str = ""  # the rejecting side's detail (B's where both reject)
    split: str = ""  # where the other release stores the sample ("" where it does not)

    def as_json(self) -> dict[str, Any]:
        out = {"key": self.key, "path": self.path, "a": self.before, "b": self.after}
        return {**out, "detail": self.detail, "split": self.split or None}


@dataclass(slots=True)
class RejectsDiff:
    """How the rejects of release A became those of release B (files counted as rows)."""

    counts: tuple[int, int]
    fixed: list[RejectChange] = field(default_factory=list)
    rejected: list[RejectChange] = field(default_factory=list)
    reasons: list[RejectChange] = field(default_factory=list)
    cleared: list[RejectChange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.fixed or self.rejected or self.reasons or self.cleared)

    def kinds(self) -> list[tuple[str, list[RejectChange]]]:
        """The sections, as ``diff`` names them, in the order it shows them."""
        return [
            ("fixed", self.fixed),
            ("newly rejected", self.rejected),
            ("another reason", self.reasons),
            ("cleared", self.cleared),
        ]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": self.counts[0], "b": self.counts[1]}
        for kind, changes in self.kinds():
            out[kind.replace(" ", "_")] = [c.as_json() for c in changes]
        return out


@dataclass(frozen=True, slots=True)
class _Rejected:
    """One rejected sample of one release: the reason, and the file that was it."""

    reason: str
    path: str
    detail: str


def _by_sample(rows: Iterable[RejectFacts]) -> dict[str, _Rejected]:
    """A release's rejects per sample: its key (``path:<path>`` for a row without one). A
    pair's files are rejected together, the others' details ending ``(in <culprit>)``."""
    grouped: dict[str, list[RejectFacts]] = {}
    for row in rows:
        grouped.setdefault(row.key or f"path:{row.path}", []).append(row)
    out = {}
    for key, found in grouped.items():
        paths = {row.path for row in found}
        culprit = next(
            (r for r in found if not any(r.detail.endswith(f"(in {p})") for p in paths)),
            found[0],
        )
        out[key] = _Rejected(culprit.reason, culprit.path, culprit.detail)
    return out


def _stored(snapshot: Snapshot) -> dict[str, str]:
    """Sample key -> its split (none for a release without the per-sample key record)."""
    return {s.key: s.split for s in snapshot.samples if s.key is not None}


def compare_rejects(a: Snapshot, b: Snapshot) -> RejectsDiff | None:
    """The rejects of ``a`` against those of ``b``; None when one stores no rejects table."""
    if a.rejects is None or b.rejects is None:
        return None
    before, after = _by_sample(a.rejects), _by_sample(b.rejects)
    in_a, in_b = _stored(a), _stored(b)
    out = RejectsDiff((len(a.rejects), len(b.rejects)))
    for key, was in before.items():
        now = after.get(key)
        if now is None:
            change = RejectChange(key, was.path, was.reason, None, was.detail, in_b.get(key, ""))
            (out.fixed if change.split else out.cleared).append(change)
        elif now.reason != was.reason:
            out.reasons.append(RejectChange(key, now.path, was.reason, now.reason, now.detail))
    for key, now in after.items():
        if key not in before:
            split = in_a.get(key, "")
            out.rejected.append(RejectChange(key, now.path, None, now.reason, now.detail, split))
    for _, changes in out.kinds():
        changes.sort(key=lambda c: c.key)
    return out


def reject_notes(a: Snapshot, b: Snapshot) -> list[str]:
    """What the rejects section cannot show, for ``diff``'s notes."""
    lacking = [s.path.name for s in (a, b) if s.rejects is None]
    if len(lacking) == 2:
        return []  # two releases from before the table: nothing to compare, as before it
    if lacking:
        return [
            f"rejects not compared: {lacking[0]} stores no rejects table (a release built "
            "before h5etl 0.2)"
        ]
    keyless = [s.path.name for s in (a, b) if not _keyed(s.samples)]
    if keyless:
        return [f"{' and '.join(keyless)} has no per-sample keys: a fixed input shows as cleared"]
    return []


def _keyed(samples: Sequence[Any]) -> bool:
    return all(getattr(s, "key", None) is not None for s in samples)
