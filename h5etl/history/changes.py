"""What a diff found: its changes, the semantic label they earn, and their JSON form.

``h5etl.history.diff`` compares two releases and fills a ``ReleaseDiff``; this module owns
the rule that turns the changes into a label (``major``, ``minor``, ``patch``) with its
reasons, and the JSON that ``h5etl diff --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from h5etl.format.contract import TRANSFORMS_KEY
from h5etl.history.diff_rejects import RejectsDiff
from h5etl.history.snapshot import Identity, Snapshot

__all__ = [
    "Change",
    "Label",
    "Moved",
    "ReleaseDiff",
    "SampleChange",
    "transform_change",
    "transform_digest",
]

Label = Literal["major", "minor", "patch"]


@dataclass(frozen=True, slots=True)
class Change:
    """One difference: ``before`` is None for something added, ``after`` for something removed."""

    category: str
    where: str
    before: Any
    after: Any

    def as_json(self) -> dict[str, Any]:
        return {"category": self.category, "where": self.where, "a": self.before, "b": self.after}


def transform_digest(extra: Mapping[str, Any] | None) -> str | None:
    """A field's transform digest from its layout record's ``extra`` (None: no transform)."""
    entry = (extra or {}).get(TRANSFORMS_KEY)
    return str(entry.get("digest")) if isinstance(entry, Mapping) else None


def transform_change(
    name: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> Change | None:
    """``transform changed (image, 3f1c9a0b2e4d -> 77d04c1e9f2a)`` when the code that makes
    field ``name``'s values differs between two layout records' ``extra``s (issue 28); a
    field without a transform on one side shows ``none``."""
    was, now = transform_digest(before), transform_digest(after)
    if was == now:
        return None
    shown = [d[:12] if d is not None else "none" for d in (was, now)]
    return Change("transform", f"changed ({name}, {shown[0]} -> {shown[1]})", was, now)


@dataclass(frozen=True, slots=True)
class SampleChange:
    key: str
    split: str
    what: tuple[str, ...] = ()  # the sources whose files changed, or ("content",)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "split": self.split}
        if self.what:
            out["what"] = list(self.what)
        return out


@dataclass(frozen=True, slots=True)
class Moved:
    key: str
    before: str
    after: str
    group: str | None = None  # its group in ``b`` (splits.group_by): why it moved

    def as_json(self) -> dict[str, str]:
        out = {"key": self.key, "a": self.before, "b": self.after}
        if self.group is not None:
            out["group"] = self.group
        return out


@dataclass(slots=True)
class ReleaseDiff:
    """Everything that differs between release ``a`` and release ``b``."""

    a: Snapshot
    b: Snapshot
    identity: Identity
    notes: list[str] = field(default_factory=list)  # how samples were compared, and caveats
    layout: list[Change] = field(default_factory=list)
    attrs: list[Change] = field(default_factory=list)
    config: list[Change] = field(default_factory=list)  # of the stored configs, by key
    counts: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    added: list[SampleChange] = field(default_factory=list)
    removed: list[SampleChange] = field(default_factory=list)
    changed: list[SampleChange] = field(default_factory=list)
    moved: list[Moved] = field(default_factory=list)
    regrouped: list[Moved] = field(default_factory=list)  # its group (splits.group_by) changed
    reordered: list[str] = field(default_factory=list)  # splits whose kept samples moved place
    classes: list[Change] = field(default_factory=list)
    rejects: RejectsDiff | None = None  # None: a release stores no rejects table

    @property
    def empty(self) -> bool:
        return not (
            (self.rejects is not None and not self.rejects.empty)
            or self.layout
            or self.attrs
            or self.config
            or self.added
            or self.removed
            or self.changed
            or self.moved
            or self.regrouped
            or self.reordered
            or self.classes
            or any(a != b for a, b in self.counts.values())
        )

    @property
    def label(self) -> Label:
        return self.labelled()[0]

    def labelled(self) -> tuple[Label, list[str]]:
        """The semantic label, with the reasons for it (the strongest first)."""
        major = [f"{c.category} {c.where}" for c in self.layout if c.category != "storage"]
        if self.removed:
            major.append(f"{_samples(len(self.removed))} removed")
        if self.moved:
            major.append(_moved(self.moved))
        if self.regrouped:  # what keeps splits leak-free changed
            major.append(f"{_samples(len(self.regrouped))} in another group")
        if major:
            return "major", major
        minor = [f"{_samples(len(self.added))} added"] * bool(self.added)
        minor += [f"{_samples(len(self.changed))} changed"] * bool(self.changed)
        if minor:
            return "minor", minor
        patch = [f"storage {c.where}" for c in self.layout]
        patch += ["attributes"] * bool(self.attrs) + ["config"] * bool(self.config)
        patch += ["write order"] * bool(self.reordered)
        patch += ["rejects"] * (self.rejects is not None and not self.rejects.empty)
        return "patch", patch or ["no change"]

    def summary(self) -> str:
        """One line: the label and why (``minor: 3 samples added``)."""
        label, reasons = self.labelled()
        return f"{label}: {', '.join(reasons)}"

    def as_json(self) -> dict[str, Any]:
        label, reasons = self.labelled()
        return {
            "a": _side(self.a),
            "b": _side(self.b),
            "empty": self.empty,
            "label": label,
            "reasons": reasons,
            "identity": self.identity,
            "notes": self.notes,
            "layout": [c.as_json() for c in self.layout],
            "attrs": [c.as_json() for c in self.attrs],
            "config": [c.as_json() for c in self.config],
            "counts": {s: {"a": a, "b": b} for s, (a, b) in self.counts.items()},
            "samples": {
                "added": [s.as_json() for s in self.added],
                "removed": [s.as_json() for s in self.removed],
                "changed": [s.as_json() for s in self.changed],
                "moved": [m.as_json() for m in self.moved],
                "regrouped": [m.as_json() for m in self.regrouped],
            },
            "reordered": self.reordered,
            "classes": [c.as_json() for c in self.classes],
            "rejects": None if self.rejects is None else self.rejects.as_json(),
        }


def _moved(moved: Sequence[Moved]) -> str:
    """Why samples changed split: a grouped release moves them only to keep groups whole."""
    groups = {m.group for m in moved}
    if None in groups:
        return f"{_samples(len(moved))} moved between splits"
    count = len(groups)
    return f"moved {_samples(len(moved))} of {count} group{'s' * (count != 1)} to keep groups whole"


def _samples(count: int) -> str:
    return f"{count} sample{'s' * (count != 1)}"


def _side(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "path": str(snapshot.path),
        "name": snapshot.name,
        "version": snapshot.version,
        "created_at": snapshot.created_at,
        "identities": list(snapshot.identities),
    }
