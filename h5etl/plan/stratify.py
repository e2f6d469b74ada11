"""stratify: exact split counts, overall or per stratum (class), placed by a seeded hash.

Input: sample names, split fractions, a seed and optionally each sample's stratum. Output: the
split of each sample. Deterministic, independent of the input order, pure (no pydantic).

The rule:

- **Which samples**: the samples (of a stratum) sorted by SHA-256 of ``f"{seed}\\x00{name}"``,
  the hash ``split_assign`` uses, are cut into one block per split, in the order the
  splits are given. ``split_of`` cuts the same order at the fixed positions 0.8, 0.9...;
  here the cuts fall at exact counts, so the two rules differ only near the cuts.
- **How many, without strata**: cumulative rounding. With ``F_k`` the sum of the first ``k``
  fractions (exact decimals: ``0.7`` is 7/10; normalised to sum to 1), the first ``k`` splits
  hold ``floor(F_k * N + 1/2)`` samples. Each split's count is then within 1 of
  ``fraction * N`` (strictly), and the counts are house-monotone: one more sample never
  lowers a count and moves at most one old sample across each cut (largest remainder can
  lower a count when N grows; sticky splits need the monotone rule).
- **How many, with strata**: every stratum's count per split is the floor or the ceiling of
  ``fraction * stratum size``; which strata get the ceiling is chosen so that every split's
  total is the floor or the ceiling of ``fraction * N`` (within 1), aiming at the unstratified
  counts above. Such a choice always exists: the fractional quotas are a flow from strata to
  splits, and a network with integer capacities has an integer flow as large as any
  fractional one. It is found as a max flow over stratum *types* (strata with the same
  fractional pattern are interchangeable), so a thousand classes cost no more than ten.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Mapping, Sequence
from fractions import Fraction

from h5etl.dataflow import text_bytes
from h5etl.errors import ConfigError

Stratum = str | int | None
_ALL = object()  # the one stratum of an unstratified assignment


def assign_splits(
    names: Sequence[str],
    fractions: Mapping[str, float],
    seed: int,
    *,
    strata: Sequence[Stratum] | None = None,
) -> list[str]:
    """The split of each name, in the order of ``names`` (see the module docstring).

    Args:
        names: one per sample, unique (e.g. the NFC name ``split_assign`` hashes).
        fractions: split name -> fraction, in split order; normalised to sum to 1.
        seed: the config's seed.
        strata: one per name (e.g. its class), or None for plain exact counts.

    Raises:
        ConfigError: no splits, or a fraction that is negative or not finite, or all zero.
        ValueError: ``strata`` is not as long as ``names`` (a bug of the caller).
    """
    shares = _shares(fractions)
    if strata is not None and len(strata) != len(names):
        raise ValueError(f"{len(strata)} strata for {len(names)} names")
    groups: dict[object, list[int]] = {}
    for i in range(len(names)):
        groups.setdefault(_ALL if strata is None else strata[i], []).append(i)
    ordered = sorted(groups, key=_stratum_order)
    if strata is None:
        counts = {_ALL: _cumulative(shares, len(names))}
    else:
        counts = _stratified(shares, [(g, len(groups[g])) for g in ordered], len(names))
    ranks = [_rank(name, seed) for name in names]  # equal ranks: equal names (SHA-256)
    out = [""] * len(names)
    for group in ordered:
        ranked = sorted(groups[group], key=ranks.__getitem__)
        start = 0
        for (split, _), count in zip(shares, counts[group], strict=True):
            for i in ranked[start : start + count]:
                out[i] = split
            start += count
    return out


def _rank(name: str, seed: int) -> bytes:
    """The hash ``split_assign`` reads: the order in which samples fill the splits."""
    return hashlib.sha256(text_bytes(f"{seed}\x00{name}")).digest()


def _stratum_order(stratum: object) -> tuple[int, int, str]:
    """A total order over strata of mixed types: None, then integers, then text."""
    if stratum is None or stratum is _ALL:
        return (0, 0, "")
    if isinstance(stratum, int):
        return (1, stratum, "")
    if isinstance(stratum, str):
        return (2, 0, stratum)
    return (3, 0, repr(stratum))


def _shares(fractions: Mapping[str, float]) -> list[tuple[str, Fraction]]:
    """The fractions as exact decimals (``0.7`` is 7/10), normalised to sum to 1."""
    if not fractions:
        raise ConfigError("splits: none given; name at least one split and its fraction")
    exact = []
    for split, value in fractions.items():
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"splits.{split}: {value} is not a fraction >= 0")
        exact.append((split, Fraction(repr(float(value)))))
    total = sum(share for _, share in exact)
    if total == 0:
        raise ConfigError("splits: every fraction is 0; give at least one a share")
    return [(split, share / total) for split, share in exact]


def _cumulative(shares: Sequence[tuple[str, Fraction]], n: int) -> list[int]:
    """Counts per split by cumulative rounding: the first k splits get round(F_k * n)."""
    counts, before, cumulative = [], 0, Fraction(0)
    for _, share in shares:
        cumulative += share
        upto = math.floor(cumulative * n + Fraction(1, 2))
        counts.append(upto - before)
        before = upto
    return counts


def _stratified(
    shares: Sequence[tuple[str, Fraction]], sizes: Sequence[tuple[object, int]], n: int
) -> dict[object, list[int]]:
    """Counts per stratum and split: each the floor or ceiling of its quota, and the totals
    the floor or ceiling of theirs, aiming at the unstratified counts."""
    columns = len(shares)
    floors: dict[object, list[int]] = {}
    types: dict[tuple[tuple[int, ...], int], list[object]] = {}  # (support, ups) -> strata
    remainders = [Fraction(0)] * columns  # R_s: the sum of the strata's fractional quotas
    for stratum, size in sizes:
        quotas = [share * size for _, share in shares]
        floors[stratum] = [math.floor(q) for q in quotas]
        support = tuple(s for s, q in enumerate(quotas) if q.denominator != 1)
        for s in support:
            remainders[s] += quotas[s] - floors[stratum][s]
        ups = size - sum(floors[stratum])  # how many of its splits get the ceiling
        if ups:
            types.setdefault((support, ups), []).append(stratum)
    target = _cumulative(shares, n)
    base = [sum(f[s] for f in floors.values()) for s in range(columns)]
    flow = _Flow(list(types), [len(members) for members in types.values()], columns)
    wanted = [t - b for t, b in zip(target, base, strict=True)]  # in [floor R_s, ceil R_s]
    for caps in (
        [math.floor(r) for r in remainders],  # always reachable: a fractional flow meets it
        wanted,  # the unstratified totals, when the strata allow them
        [math.ceil(r) for r in remainders],  # reaches every up: the fractional flow does
    ):
        flow.augment(caps)
    assert flow.value == sum(ups * len(m) for (_, ups), m in types.items())  # see the docstring
    counts = {stratum: list(f) for stratum, f in floors.items()}
    for t, (key, members) in enumerate(types.items()):
        # spread the type's ups over its strata: a split's ups go to consecutive strata
        # (round robin), so no stratum gets two ups in one split and each gets ``ups``
        sequence = [s for s in key[0] for _ in range(flow.assigned(t, s))]
        for position, s in enumerate(sequence):
            counts[members[position % len(members)]][s] += 1
    return counts


class _Flow:
    """Max flow: source -> type t (its strata's ups) -> split s (one per stratum) -> sink.

    Sink capacities only grow between ``augment`` calls, so the flow into each split never
    shrinks: a simple augmenting path enters the sink once, at its end.
    """

    def __init__(self, types: Sequence[tuple[tuple[int, ...], int]], sizes: Sequence[int], n: int):
        self.types = len(types)
        self.source, self.sink = self.types + n, self.types + n + 1
        self.cap: dict[int, dict[int, int]] = {v: {} for v in range(self.sink + 1)}
        for t, ((support, ups), size) in enumerate(zip(types, sizes, strict=True)):
            self._edge(self.source, t, size * ups)
            for s in support:
                self._edge(t, self.types + s, size)
        for s in range(n):
            self._edge(self.types + s, self.sink, 0)
        self.flow: dict[tuple[int, int], int] = {}  # antisymmetric: flow[a, b] == -flow[b, a]

    def _edge(self, a: int, b: int, cap: int) -> None:
        self.cap[a][b] = cap
        self.cap[b].setdefault(a, 0)

    def _residual(self, a: int, b: int) -> int:
        return self.cap[a][b] - self.flow.get((a, b), 0)

    def augment(self, sink_caps: Sequence[int]) -> None:
        """Raise the split -> sink capacities to ``sink_caps`` and push all the flow it allows."""
        for s, cap in enumerate(sink_caps):
            self.cap[self.types + s][self.sink] = max(cap, self.cap[self.types + s][self.sink])
        while (path := self._path()) is not None:
            amount = min(self._residual(a, b) for a, b in path)
            for a, b in path:
                self.flow[a, b] = self.flow.get((a, b), 0) + amount
                self.flow[b, a] = self.flow.get((b, a), 0) - amount

    def _path(self) -> list[tuple[int, int]] | None:
        """A shortest augmenting path (BFS, nodes in index order: deterministic)."""
        parent = {self.source: self.source}
        queue = deque([self.source])
        while queue:
            a = queue.popleft()
            for b in sorted(self.cap[a]):
                if b not in parent and self._residual(a, b) > 0:
                    parent[b] = a
                    if b == self.sink:
                        path, node = [], b
                        while node != self.source:
                            path.append((parent[node], node))
                            node = parent[node]
                        return path[::-1]
                    queue.append(b)
        return None

    def assigned(self, t: int, s: int) -> int:
        """The ups type ``t`` gives split ``s``."""
        return self.flow.get((t, self.types + s), 0)

    @property
    def value(self) -> int:
        return sum(self.flow.get((self.source, t), 0) for t in range(self.types))
