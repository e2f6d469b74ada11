"""split_assign: the split of every sample: exact on a first release, sticky after, whole groups.

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
- **Groups** are placed whole. A group the previous release holds in one split stays there
  (sticky). The others are placed by ``partition.place``: the counts nearest ``fraction x N``
  whole groups allow with those fixed ones kept, groups in the seeded hash order of their
  names, largest first. A group that straddles splits (``group_by`` is new, or the groups
  changed) may go to any split; among the placements nearest the targets, the one moving
  the fewest of its kept samples (recorded as ``moved``, ``moved_groups``): a group never
  comes to straddle splits, and moving to groups never leaves a split short to save moves
  (the majority rule put 139/8 where 118/29 was reachable). Past its budget, or with
  strata, greedily in that order: each where it lowers the squared distance from the
  targets (``fraction x N``, and per class ``fraction x class size`` when stratified) the
  most, ties to the split moving the fewest samples, then to the earlier split; moves are
  then not searched, only broken ties.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from h5etl.dataflow import text_bytes, valid_text
from h5etl.plan import partition, stratify
from h5etl.plan.stratify import Stratum


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

    def best(
        self,
        classes: Counter[Stratum],
        size: int,
        allowed: Sequence[int],
        moves: Sequence[int] | None = None,
    ) -> int:
        """The split (of ``allowed``) where the unit lowers the squared distance from the
        targets most, then the one where it moves fewest samples (``moves`` per split)."""

        def cost(s: int) -> float:
            total = size * size + 2 * size * (self.counts[s] - self.targets[s])
            for k, g in classes.items():
                total += g * g + 2 * g * (self.class_counts[s][k] - self.class_targets[s][k])
            return total

        return min(allowed, key=lambda s: (cost(s), moves[s] if moves else 0, s))


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
    return _grouped(names, fractions, seed, strata, groups, previous)


def _grouped(
    names: Sequence[str],
    fractions: Mapping[str, float],
    seed: int,
    strata: Sequence[Stratum] | None,
    groups: Sequence[str],
    previous: Mapping[str, str] | None,
) -> Assignment:
    """Whole groups: those held in one split stay, the rest searched (fewest moves)."""
    shares = stratify._shares(fractions)
    order = [split for split, _ in shares]
    index = {split: i for i, split in enumerate(order)}
    known = previous or {}
    was = [index.get(known.get(valid_text(name), "")) for name in names]
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    ranked = sorted(members, key=lambda g: (-len(members[g]), _rank(g, seed)))
    options = {g: _options(was, members[g], len(order)) for g in ranked}
    choices = {g: c for g, (c, _) in options.items()}
    targets = _Targets([float(share) for _, share in shares], len(names), strata)
    free = [g for g in ranked if len(choices[g]) > 1]
    split_of = {g: choices[g][0] for g in ranked if len(choices[g]) == 1}
    for group, split in split_of.items():
        targets.add(split, _classes(strata, members[group]), len(members[group]))
    found = None
    if strata is None:
        found = partition.place(
            [len(members[g]) for g in free], [choices[g] for g in free],
            targets.counts, targets.targets, [options[g][1] for g in free],
        )  # fmt: skip
    for n, group in enumerate(free):
        classes = _classes(strata, members[group])
        split = (
            found[n]
            if found is not None
            else targets.best(classes, len(members[group]), choices[group], options[group][1])
        )
        targets.add(split, classes, len(members[group]))
        split_of[group] = split
    out = [order[split_of[g]] for g in groups]
    moved = [i for i, s in enumerate(was) if s is not None and order[s] != out[i]]
    kept = sum(1 for s in was if s is not None)
    rule = "sticky" if previous is not None else "grouped"
    policy = _policy(rule, names, known, kept)
    policy["moved"] = len(moved)
    if moved:
        policy["moved_groups"] = len({groups[i] for i in moved})
    policy["search"] = "exact" if found is not None or not free else "greedy"
    return Assignment(out, policy)


def _options(
    was: Sequence[int | None], members: Sequence[int], splits: int
) -> tuple[list[int], list[int]]:
    """The splits a group may go to, and the kept samples it moves in each: a group the
    previous release holds in one split stays there; any split for the others."""
    held = Counter(was[i] for i in members if was[i] is not None)
    if len(held) == 1:
        return [next(s for s in held if s is not None)], [0] * splits
    kept = sum(held.values())
    return list(range(splits)), [kept - held[s] for s in range(splits)]


def moving(policy: Mapping[str, Any]) -> str | None:
    """What a plan says of the samples its splits move to keep groups whole (None: none)."""
    moved, groups = int(policy.get("moved", 0)), int(policy.get("moved_groups", 0))
    if not moved:
        return None
    counts = ", ".join(f"{split} {n}" for split, n in policy.get("counts", {}).items())
    return (
        f"{moved} sample{'s' * (moved != 1)} of {groups} group{'s' * (groups != 1)} will move "
        f"between splits to keep groups whole (then {counts})"
    )


def _classes(strata: Sequence[Stratum] | None, members: Sequence[int]) -> Counter[Stratum]:
    return Counter(strata[i] for i in members) if strata is not None else Counter()


def _policy(rule: str, names: Sequence[str], known: Mapping[str, str], kept: int) -> dict[str, Any]:
    current = {valid_text(name) for name in names}
    return {
        "rule": rule,
        "kept": kept,
        "assigned": len(names) - kept,
        "dropped": sum(1 for name in known if name not in current),
        "moved": 0,  # a kept sample never changes split, but to keep its group whole
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
