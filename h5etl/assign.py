"""assign: the split of every sample: exact on a first release, sticky after, whole groups.

Input: sample names, split fractions, a seed, optionally each sample's stratum (its class) and
group, and the previous release's split of each name. Output: each sample's split and the
policy that placed it (recorded in the file). Pure and deterministic, independent of order.

- **First release, no groups**: ``stratify.assign_splits``: exact counts, every split within
  one sample of ``fraction x N`` (strictly), per class too when stratified.
- **Sticky**: a sample of the previous release keeps its split (read from that release's own
  record, never recomputed); samples it no longer has are dropped. A sample whose split no
  longer exists counts as new.
- **New samples, no groups**: the exact rule over all of this release's samples gives every
  split (per class, when stratified) its target count and every new sample a preferred split.
  Each split gets room for ``target - kept`` new samples (none when the kept ones exceed it;
  the room is then shaved where the counts stand furthest above ``fraction x N``), and new
  samples take their preferred split while it has room, the rest fill the others in hash
  order. So the totals come as close to the fractions as the kept samples allow, and when
  the kept samples sit where the exact rule puts them (unchanged inputs, or rejects tried
  again) the release is split exactly as a first release would be.
- **Groups** are placed whole, largest first, then in the seeded hash order of their names:
  each goes to the split where it lowers the squared distance from the targets
  (``fraction x N``, and per class ``fraction x class size`` when stratified) the most, ties
  to the earlier split: totals end as close to the fractions as whole groups allow. A new
  sample of a group the previous release holds joins that group's split (the one holding
  most of it): a group never comes to straddle splits through a new release.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from h5etl import stratify
from h5etl.records import text_bytes, valid_text

Stratum = stratify.Stratum


@dataclass(slots=True)
class Assignment:
    """Each sample's split, in the order given, and the policy (JSON-ready)."""

    splits: list[str]
    policy: dict[str, Any] = field(default_factory=dict)


def _rank(name: str, seed: int) -> bytes:
    return hashlib.sha256(text_bytes(f"{seed}\x00{name}")).digest()


class _Targets:
    """Counts per split (and per class) against their targets; the cost of adding a unit."""

    def __init__(
        self, fractions: Sequence[float], total: int, strata: Sequence[Stratum] | None
    ) -> None:
        self.fractions = fractions
        self.counts = [0] * len(fractions)
        self.targets = [f * total for f in fractions]
        sizes = Counter(strata) if strata is not None else Counter()
        self.class_counts: list[Counter[Stratum]] = [Counter() for _ in fractions]
        self.class_targets = [{k: f * n for k, n in sizes.items()} for f in fractions]

    def add(self, split: int, classes: Counter[Stratum], size: int) -> None:
        self.counts[split] += size
        self.class_counts[split].update(classes)

    def best(self, classes: Counter[Stratum], size: int) -> int:
        """The split where the unit lowers the squared distance from the targets most."""

        def cost(s: int) -> float:
            total = size * size + 2 * size * (self.counts[s] - self.targets[s])
            for k, g in classes.items():
                total += g * g + 2 * g * (self.class_counts[s][k] - self.class_targets[s][k])
            return total

        return min(range(len(self.counts)), key=lambda s: (cost(s), s))


def assign(
    names: Sequence[str],
    fractions: Mapping[str, float],
    seed: int,
    *,
    strata: Sequence[Stratum] | None = None,
    groups: Sequence[str] | None = None,
    previous: Mapping[str, str] | None = None,
) -> Assignment:
    """The split of each name (see the module docstring).

    Args:
        names: unique sample names (NFC), the names the splits are seeded by.
        fractions: split -> fraction, in split order.
        seed: the config's seed.
        strata: one class per name (``stratify:``), or None.
        groups: one group per name (``splits.group_by``), or None.
        previous: the previous release's split of each name it held, or None.

    Raises:
        ConfigError: bad fractions (see ``stratify.assign_splits``).
    """
    if groups is None:
        fresh = stratify.assign_splits(names, fractions, seed, strata=strata)
        if previous is None:
            return Assignment(fresh, {"rule": "exact", "assigned": len(names)})
        return _sticky(names, fresh, fractions, seed, strata, previous)
    shares = stratify._shares(fractions)
    order = [split for split, _ in shares]
    index = {split: i for i, split in enumerate(order)}
    targets = _Targets([float(share) for _, share in shares], len(names), strata)
    out: list[int | None] = [None] * len(names)
    held: dict[str, Counter[int]] = {}  # group -> splits its kept samples are in
    known = previous or {}
    for i, name in enumerate(names):
        split = index.get(known.get(valid_text(name), ""))
        if split is not None:
            out[i] = split
            targets.add(split, Counter([strata[i]]) if strata is not None else Counter(), 1)
            if groups is not None:
                held.setdefault(groups[i], Counter())[split] += 1
    kept = sum(1 for s in out if s is not None)
    units: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if out[i] is None:
            units.setdefault(groups[i] if groups is not None else name, []).append(i)
    ranked = sorted(units, key=lambda u: (-len(units[u]), _rank(u, seed)))
    for unit in ranked:
        members = units[unit]
        classes = Counter(strata[i] for i in members) if strata is not None else Counter()
        holders = held.get(unit)
        split = (
            min(holders, key=lambda s: (-holders[s], s))
            if holders
            else targets.best(classes, len(members))
        )
        targets.add(split, classes, len(members))
        for i in members:
            out[i] = split
    rule = "sticky" if previous is not None else "grouped"
    return Assignment([order[s] for s in out if s is not None], _policy(rule, names, known, kept))


def _policy(rule: str, names: Sequence[str], known: Mapping[str, str], kept: int) -> dict[str, Any]:
    current = {valid_text(name) for name in names}
    return {
        "rule": rule,
        "kept": kept,
        "assigned": len(names) - kept,
        "dropped": sum(1 for name in known if name not in current),
        "moved": 0,  # a kept sample never changes split
    }


def _sticky(
    names: Sequence[str],
    fresh: Sequence[str],
    fractions: Mapping[str, float],
    seed: int,
    strata: Sequence[Stratum] | None,
    previous: Mapping[str, str],
) -> Assignment:
    """Kept samples where they were; new ones where the exact rule wants them, within room."""
    order = [split for split, _ in stratify._shares(fractions)]
    shares = [float(share) for _, share in stratify._shares(fractions)]
    out = [previous.get(valid_text(name)) for name in names]
    out = [split if split in order else None for split in out]
    by_stratum: dict[Stratum, list[int]] = {}
    for i in range(len(names)):
        by_stratum.setdefault(None if strata is None else strata[i], []).append(i)
    for members in by_stratum.values():
        target = Counter(fresh[i] for i in members)
        kept = Counter(out[i] for i in members if out[i] is not None)
        new = sorted((i for i in members if out[i] is None), key=lambda i: _rank(names[i], seed))
        room = _room(
            [target[s] for s in order],
            [kept[s] for s in order],
            len(new),
            [f * len(members) for f in shares],
        )
        free = dict(zip(order, room, strict=True))
        waiting = []
        for i in new:
            if free[fresh[i]] > 0:
                out[i] = fresh[i]
                free[fresh[i]] -= 1
            else:
                waiting.append(i)
        spare = [split for split in order for _ in range(free[split])]
        for i, split in zip(waiting, spare, strict=True):
            out[i] = split
    kept_total = sum(1 for name in names if previous.get(valid_text(name)) in order)
    placed = [split for split in out if split is not None]
    return Assignment(placed, _policy("sticky", names, previous, kept_total))


def _room(target: list[int], kept: list[int], new: int, real: list[float]) -> list[int]:
    """New samples per split: up to ``target - kept``, shaved to ``new`` in total where the
    counts stand furthest above their real targets (``real``), ties to the later split."""
    room = [max(0, t - k) for t, k in zip(target, kept, strict=True)]
    while sum(room) > new:
        over = [s for s in range(len(room)) if room[s] > 0]
        s = max(over, key=lambda s: (kept[s] + room[s] - real[s], s))
        room[s] -= 1
    return room
