"""partition: whole groups into splits, as close to the target counts as whole groups allow.

Input: each unit's size (a group's samples) and the splits it may go to, the counts already
fixed per split, and each split's target (``fraction x N``). Output: each unit's split. Pure.

- **Exact**: the assignment minimises the squared distance of the counts from the targets
  (for two splits: the train count nearest ``fraction x N``). Every split open to every
  unit: a subset sum over the units' sizes on a numpy grid of the counts of the first
  k - 1 splits (the last takes the rest), the first unit that reached each cell remembered,
  so the units are read back without a table per unit. Units restricted to some splits
  (``assign`` no longer restricts any): the same over count vectors in dictionaries.
  Ties: the smaller cost, then more samples in the earlier splits, then the first placement
  found in the units' order (seeded by the caller).
- **Moves** (``moves[i][s]``: samples unit ``i`` moves when placed in split ``s``, a group
  that straddled splits in the previous release): among the placements of least cost, one
  with the fewest moves. A grid of the fewest moves reaching each count, with each unit's
  choice per count kept for the read-back (``EXACT_CHOICES`` bytes); restricted units the
  same in dictionaries. Ties as above.
- **Beyond** ``EXACT_BUDGET`` steps (units x reachable counts; ``EXACT_CELLS`` counts at
  once, ``EXACT_STATES`` for restricted units): ``None``; the caller places
  the units greedily, largest first (``tests/benchmarks/group_splits.py`` measures how far
  that lands from the optimum).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Units x reachable counts an exact search may take: 2e8 byte operations for two splits
# (about 0.1 s), 2e5 dictionary entries for more (about 0.1 s: 15 groups of 1-20 samples
# into three splits; 30 such groups took 1 s and are placed greedily).
EXACT_BUDGET = 200_000_000
EXACT_CELLS = 4_000_000  # counts held at once: 6 bytes each (the grid, its copy, first units)
EXACT_STATES = 200_000
# Units x counts for the search with moves: one byte each (each unit's choice per count), so
# 20 MB; 50 straddling groups of 12 samples into three splits fit (0.4 s).
EXACT_CHOICES = 20_000_000
ROUND = 6  # decimals of a cost compared when moves break its ties


def cost(counts: Sequence[int], targets: Sequence[float]) -> float:
    """The squared distance of the counts from the targets."""
    return float(sum((c - t) ** 2 for c, t in zip(counts, targets, strict=True)))


def place(
    sizes: Sequence[int],
    choices: Sequence[Sequence[int]],
    base: Sequence[int],
    targets: Sequence[float],
    moves: Sequence[Sequence[int]] | None = None,
) -> list[int] | None:
    """Each unit's split (an index into ``targets``) minimising ``cost``, then the moves, or
    None when the exact search is past its budget. ``choices[i]`` are the splits unit ``i``
    may go to (sorted, at least one); ``base`` the counts already fixed; ``moves[i][s]`` the
    samples unit ``i`` moves when placed in split ``s`` (None: no unit moves)."""
    if not sizes:
        return []
    if moves is not None and not any(any(m) for m in moves):
        moves = None  # nothing to tell apart: the faster search, with its ties
    if all(len(c) == len(targets) for c in choices):
        cells = (sum(sizes) + 1) ** (len(targets) - 1)
        if cells > EXACT_CELLS or len(sizes) * cells > EXACT_BUDGET:
            return None
        if moves is None:
            return _grid(sizes, base, targets)
        if len(sizes) * cells > EXACT_CHOICES:
            return None
        return _grid_moves(sizes, moves, base, targets)
    return _many(sizes, choices, base, targets, moves)


def _grid(sizes: Sequence[int], base: Sequence[int], targets: Sequence[float]) -> list[int]:
    """Every split open to every unit: which counts of the first k - 1 splits the units can
    reach (a numpy grid, the last split taking the rest), and the units behind the best."""
    axes, total = len(targets) - 1, sum(sizes)
    reach = np.zeros((total + 1,) * axes, dtype=bool)
    reach[(0,) * axes] = True
    first = np.full(reach.shape, -1, dtype=np.int32)  # unit x axes + axis first reaching it
    for i, size in enumerate(sizes):
        old = reach.copy()  # each unit once: shifts read the counts reached before it
        for axis in range(axes):
            source = tuple(
                slice(0, total + 1 - size) if a == axis else slice(None) for a in range(axes)
            )
            target = tuple(slice(size, None) if a == axis else slice(None) for a in range(axes))
            new = old[source] & ~reach[target]
            reach[target] |= new
            first[target][new] = i * axes + axis
    found = np.nonzero(reach)
    rest = total - np.sum(found, axis=0)
    costs = np.square(base[-1] + rest - targets[-1], dtype=np.float64)
    for axis in range(axes):
        costs += np.square(base[axis] + found[axis] - targets[axis])
    # the least cost, then the most samples in the earlier splits
    keys = [-f for f in reversed(found)]
    best = np.lexsort(np.stack([*keys, costs]))[0]
    cell = [int(f[best]) for f in found]
    out = [axes] * len(sizes)  # units off the path take the last split
    while any(cell):
        entry = int(first[tuple(cell)])
        unit, axis = divmod(entry, axes)
        out[unit] = axis
        cell[axis] -= sizes[unit]
    return out


def _grid_moves(
    sizes: Sequence[int],
    moves: Sequence[Sequence[int]],
    base: Sequence[int],
    targets: Sequence[float],
) -> list[int]:
    """Every split open to every unit, with moves: the fewest moves reaching each count of
    the first k - 1 splits (the last taking the rest), and each unit's split per count."""
    axes, total = len(targets) - 1, sum(sizes)
    never = np.iinfo(np.int64).max // 4  # unreachable; sums of two stay below the maximum
    fewest = np.full((total + 1,) * axes, never, dtype=np.int64)
    fewest[(0,) * axes] = 0
    chose = np.empty((len(sizes), *fewest.shape), dtype=np.int8)
    for i, size in enumerate(sizes):
        best = fewest + moves[i][axes]  # the last split: the counts of the others unchanged
        chose[i] = axes
        for axis in reversed(range(axes)):  # an earlier split last: ties go to it
            source = tuple(
                slice(0, total + 1 - size) if a == axis else slice(None) for a in range(axes)
            )
            target = tuple(slice(size, None) if a == axis else slice(None) for a in range(axes))
            shifted = fewest[source] + moves[i][axis]
            better = shifted <= best[target]
            best[target][better] = shifted[better]
            chose[i][target][better] = axis
        fewest = np.minimum(best, never)
    found = np.nonzero(fewest < never)
    rest = total - np.sum(found, axis=0)
    costs = np.square(base[-1] + rest - targets[-1], dtype=np.float64)
    for axis in range(axes):
        costs += np.square(base[axis] + found[axis] - targets[axis])
    # the least cost (rounded: the same counts summed in another order are equal here, so
    # float noise never outweighs a move), then the fewest moves, then the most samples in
    # the earlier splits
    keys = [-f for f in reversed(found)]
    pick = np.lexsort(np.stack([*keys, fewest[found], np.round(costs, ROUND)]))[0]
    cell = [int(f[pick]) for f in found]
    out = [axes] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        out[i] = int(chose[i][tuple(cell)])
        if out[i] < axes:
            cell[out[i]] -= sizes[i]
    return out


_Layer = dict[tuple[int, ...], tuple[int, tuple[int, ...], int]]  # counts -> moves, from, split


def _many(
    sizes: Sequence[int],
    choices: Sequence[Sequence[int]],
    base: Sequence[int],
    targets: Sequence[float],
    moves: Sequence[Sequence[int]] | None = None,
) -> list[int] | None:
    """Any number of splits and choices: count vectors reachable unit by unit, each with
    the fewest moves reaching it (the first way found among equals)."""
    layers: list[_Layer] = []
    states: _Layer = {tuple(base): (0, tuple(base), -1)}
    stored = 0
    for i, (size, allowed) in enumerate(zip(sizes, choices, strict=True)):
        grown: _Layer = {}
        for state, (spent, _, _) in states.items():
            for split in allowed:
                after = list(state)
                after[split] += size
                total = spent + (moves[i][split] if moves is not None else 0)
                held = grown.get(tuple(after))
                if held is None or total < held[0]:
                    grown[tuple(after)] = (total, state, split)
            if stored + len(grown) > EXACT_STATES:
                return None
        stored += len(grown)
        layers.append(grown)
        states = grown
    best = min(
        states, key=lambda s: (round(cost(s, targets), ROUND), states[s][0], tuple(-c for c in s))
    )
    out = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        _, best, out[i] = layers[i][best]
    return out
