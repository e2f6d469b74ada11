"""How close whole groups land to the fractions, and what finding it costs (h5etl.plan.partition).

For random group sizes it prints, per case: the exact search's deviation from fraction x N
(|train - 0.8 N|, the optimum), the greedy placement's (largest first, each where it brings
the counts closest: what ``assign`` falls back to past ``partition.EXACT_BUDGET``, and what
it does with ``stratify``), the greedy's excess over the optimum in samples and in units of
the smallest group, and the seconds each took (medians over the repeats). No assertion.

    python tests/benchmarks/group_splits.py [--repeats 20] [--seed 0] [--cases 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np

from h5etl.plan import partition
from h5etl.plan import split_assign as assign

# (groups, smallest, largest group size): a medical set's tens and hundreds of patients,
# then sets past the exact budget (the greedy only).
CASES = [
    (15, 4, 20),
    (60, 1, 40),
    (300, 1, 100),
    (2_000, 1, 200),
    (20_000, 1, 50),
    (200_000, 1, 20),
]
FRACTIONS = [0.8, 0.2]


def _greedy(sizes: list[int]) -> tuple[int, float]:
    total = sum(sizes)
    targets = assign._Targets(FRACTIONS, total, None)
    started = time.perf_counter()
    for size in sorted(sizes, reverse=True):
        targets.add(targets.best(Counter(), size, [0, 1]), Counter(), size)
    return targets.counts[0], time.perf_counter() - started


def _exact(sizes: list[int]) -> tuple[int | None, float]:
    total = sum(sizes)
    started = time.perf_counter()
    ordered = sorted(sizes, reverse=True)
    found = partition.place(ordered, [[0, 1]] * len(sizes), [0, 0], [0.8 * total, 0.2 * total])
    seconds = time.perf_counter() - started
    if found is None:
        return None, seconds
    return sum(s for s, split in zip(ordered, found, strict=True) if split == 0), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=len(CASES), help="the first N cases")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"{'groups':>8} {'sizes':>7} {'N':>9} {'exact dev':>9} {'greedy dev':>10} "
        f"{'worst excess':>12} {'exact s':>8} {'greedy s':>8}"
    )
    for groups, low, high in CASES[: args.cases]:
        exact_dev, greedy_dev, excess, exact_s, greedy_s = [], [], [], [], []
        total = 0
        for _ in range(args.repeats):
            sizes = [int(s) for s in rng.integers(low, high + 1, groups)]
            total = sum(sizes)
            train, seconds = _greedy(sizes)
            greedy_dev.append(abs(train - 0.8 * total))
            greedy_s.append(seconds)
            best, seconds = _exact(sizes)
            exact_s.append(seconds)
            if best is not None:
                exact_dev.append(abs(best - 0.8 * total))
                excess.append(greedy_dev[-1] - exact_dev[-1])
        shown = f"{max(exact_dev):.1f}" if exact_dev else "budget"
        worst = f"{max(excess):.1f}" if excess else "-"
        print(
            f"{groups:>8} {f'{low}-{high}':>7} {total:>9} {shown:>9} {max(greedy_dev):>10.1f} "
            f"{worst:>12} {statistics.median(exact_s):>8.3f} {statistics.median(greedy_s):>8.3f}"
        )


if __name__ == "__main__":
    main()
