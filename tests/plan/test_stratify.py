"""stratify: exact split counts, overall and per stratum, placed by a seeded hash of the name."""

from __future__ import annotations

import hashlib
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from h5etl.errors import ConfigError
from h5etl.plan.stratify import assign_splits

Stratum = str | int | None

FRACTIONS = [
    {"all": 1.0},
    {"train": 0.8, "valid": 0.2},
    {"train": 0.7, "valid": 0.2, "test": 0.1},
    {"a": 0.5, "b": 0.25, "c": 0.25},
    {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3},
    {"a": 0.6, "b": 0.1, "c": 0.1, "d": 0.1, "e": 0.1},
]


@st.composite
def fractions(draw: st.DrawFn) -> dict[str, float]:
    """The usual split tables, or arbitrary ones (1 to 6 splits, weights normalised)."""
    if draw(st.booleans()):
        return dict(draw(st.sampled_from(FRACTIONS)))
    weights = draw(st.lists(st.integers(1, 20), min_size=1, max_size=6))
    total = sum(weights)
    return {f"s{i}": w / total for i, w in enumerate(weights)}


@st.composite
def classes(draw: st.DrawFn) -> tuple[list[str], list[Stratum]]:
    """Names and their strata: up to 12 classes of 0 to 300 samples (N up to 3600)."""
    sizes = draw(st.lists(st.integers(0, 300), max_size=12))
    labels: list[Stratum] = ["cat", 7, None, "dog", 0, "7", *range(100, 106)]
    names: list[str] = []
    strata: list[Stratum] = []
    for label, size in zip(labels, sizes, strict=False):
        names.extend(f"{label!r}/{i}" for i in range(size))  # 7 and "7" differ
        strata.extend([label] * size)
    return names, strata


def rank(name: str, seed: int) -> bytes:
    """Our own reading of the hash the issue names: SHA-256 of seed NUL name."""
    return hashlib.sha256(f"{seed}\x00{name}".encode()).digest()


def assert_close(counts: Counter[str], fractions: Mapping[str, float], n: int) -> None:
    """Each split's count is within 1 of its share (the tiny slack is float error only)."""
    assert sum(counts.values()) == n
    assert set(counts) <= set(fractions)
    total = sum(fractions.values())
    for split, fraction in fractions.items():
        assert abs(counts[split] - fraction / total * n) < 1 + 1e-9, (split, counts)


def assert_blocks_in_hash_order(
    names: Sequence[str], splits: Sequence[str], order: Sequence[str], seed: int
) -> None:
    """Sorted by hash, the names form one block per split, in the order the splits are given."""
    by_rank = sorted(zip(names, splits, strict=True), key=lambda pair: rank(pair[0], seed))
    seen = [split for _, split in by_rank]
    positions = [order.index(split) for split in seen]
    assert positions == sorted(positions)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 3000), fractions(), st.integers(0, 2**32))
@example(2999, {"train": 0.7, "valid": 0.2, "test": 0.1}, 1)
@example(3000, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 2)
def test_counts_are_exact(n: int, splits: dict[str, float], seed: int) -> None:
    names = [f"img_{i:05d}.png" for i in range(n)]
    assigned = assign_splits(names, splits, seed)
    assert len(assigned) == n
    assert_close(Counter(assigned), splits, n)
    assert_blocks_in_hash_order(names, assigned, list(splits), seed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=8), unique=True, max_size=200), fractions(), st.randoms())
def test_deterministic_and_independent_of_input_order(
    names: list[str], splits: dict[str, float], shuffle: random.Random
) -> None:
    first = dict(zip(names, assign_splits(names, splits, 3), strict=True))
    shuffled = list(names)
    shuffle.shuffle(shuffled)
    second = dict(zip(shuffled, assign_splits(shuffled, splits, 3), strict=True))
    assert first == second
    assert assign_splits(names, splits, 3) == assign_splits(names, splits, 3)


@settings(max_examples=100, deadline=None)
@given(classes(), fractions(), st.integers(0, 2**32))
@example(
    (
        [f"{c}/{i}" for c in range(12) for i in range(297 + c)],
        [c for c in range(12) for _ in range(297 + c)],
    ),
    {"a": 0.6, "b": 0.1, "c": 0.1, "d": 0.1, "e": 0.1},
    3,
)
@example(
    ([f"{c}/{i}" for c in range(12) for i in range(c)], [c for c in range(12) for _ in range(c)]),
    {"train": 0.7, "valid": 0.2, "test": 0.1},
    0,
)
def test_stratified_counts_are_exact_per_stratum_and_overall(
    data: tuple[list[str], list[Stratum]], splits: dict[str, float], seed: int
) -> None:
    names, strata = data
    assigned = assign_splits(names, splits, seed, strata=strata)
    assert_close(Counter(assigned), splits, len(names))  # the totals do not drift
    members: dict[Stratum, list[int]] = defaultdict(list)
    for i, stratum in enumerate(strata):
        members[stratum].append(i)
    for indices in members.values():
        group = [names[i] for i in indices]
        group_splits = [assigned[i] for i in indices]
        assert_close(Counter(group_splits), splits, len(indices))
        assert_blocks_in_hash_order(group, group_splits, list(splits), seed)


@settings(max_examples=60, deadline=None)
@given(classes(), fractions(), st.randoms())
def test_stratified_is_independent_of_input_order(
    data: tuple[list[str], list[Stratum]], splits: dict[str, float], shuffle: random.Random
) -> None:
    names, strata = data
    pairs = list(zip(names, strata, strict=True))
    first = dict(zip(names, assign_splits(names, splits, 1, strata=strata), strict=True))
    shuffle.shuffle(pairs)
    shuffled = [name for name, _ in pairs]
    again = assign_splits(shuffled, splits, 1, strata=[stratum for _, stratum in pairs])
    assert dict(zip(shuffled, again, strict=True)) == first


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2000), fractions(), st.integers(0, 2**32))
def test_a_new_sample_moves_at_most_one_old_sample_per_boundary(
    n: int, splits: dict[str, float], seed: int
) -> None:
    # exact counts cannot keep every old sample where it was, but growing the folder by one
    # moves each of the len(splits) - 1 boundaries by at most one place in hash order
    names = [f"s{i}" for i in range(n + 1)]
    before = dict(zip(names[:-1], assign_splits(names[:-1], splits, seed), strict=True))
    after = dict(zip(names, assign_splits(names, splits, seed), strict=True))
    moved = [name for name, split in before.items() if after[name] != split]
    assert len(moved) <= len(splits) - 1


@pytest.mark.parametrize(
    ("n", "splits", "expected"),
    [
        pytest.param(290, {"train": 0.8, "valid": 0.2}, {"train": 232, "valid": 58}, id="290"),
        pytest.param(10, {"train": 0.7, "valid": 0.2, "test": 0.1}, {"train": 7, "valid": 2,
                     "test": 1}, id="10-three-way"),
        pytest.param(7, {"train": 0.5, "valid": 0.5}, {"train": 4, "valid": 3},
                     id="half-rounds-up-first"),
        pytest.param(5, {"train": 0.7, "valid": 0.2, "test": 0.1}, {"train": 4, "valid": 1,
                     "test": 0}, id="5-three-way"),
        pytest.param(3, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 1, "b": 1, "c": 1},
                     id="thirds"),
        pytest.param(1, {"train": 0.8, "valid": 0.2}, {"train": 1}, id="one"),
        pytest.param(0, {"train": 0.8, "valid": 0.2}, {}, id="none"),
        pytest.param(4, {"all": 1.0}, {"all": 4}, id="single-split"),
        pytest.param(1000, {"train": 0.7, "valid": 0.2, "test": 0.1}, {"train": 700,
                     "valid": 200, "test": 100}, id="1000"),
    ],
)  # fmt: skip
def test_example_counts(n: int, splits: dict[str, float], expected: dict[str, int]) -> None:
    assert Counter(assign_splits([f"x{i}" for i in range(n)], splits, 0)) == Counter(expected)


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # 3 classes of 5 at 0.8/0.2: each class 4/1, overall 12/3 (= 0.8 * 15 exactly)
        pytest.param({"a": 5, "b": 5, "c": 5}, {"train": 12, "valid": 3}, id="even"),
        # classes of 3 want 2.4/0.6 each: per class 2/1 or 3/0; 9 samples -> 7.2 -> 7/2
        pytest.param({"a": 3, "b": 3, "c": 3}, {"train": 7, "valid": 2}, id="remainders"),
        # a class of 1 cannot be split: it goes to train or valid whole
        pytest.param({"a": 1, "b": 9}, {"train": 8, "valid": 2}, id="singleton"),
    ],
)
def test_example_stratified_totals(sizes: dict[str, int], expected: dict[str, int]) -> None:
    names = [f"{label}/{i}" for label, size in sizes.items() for i in range(size)]
    strata: list[Stratum] = [label for label, size in sizes.items() for _ in range(size)]
    splits = {"train": 0.8, "valid": 0.2}
    assigned = assign_splits(names, splits, 0, strata=strata)
    assert Counter(assigned) == expected


def test_stratifying_balances_a_rare_class() -> None:
    # 1000 common and 20 rare samples at 0.8/0.2: unstratified, the rare class's valid share
    # is left to chance; stratified it is exactly 4
    names = [f"common/{i}" for i in range(1000)] + [f"rare/{i}" for i in range(20)]
    strata: Sequence[Stratum] = ["common"] * 1000 + ["rare"] * 20
    assigned = assign_splits(names, {"train": 0.8, "valid": 0.2}, 5, strata=strata)
    rare = Counter(split for split, s in zip(assigned, strata, strict=True) if s == "rare")
    assert rare == {"train": 16, "valid": 4}


def test_the_seed_changes_the_assignment() -> None:
    names = [str(i) for i in range(200)]
    splits = {"train": 0.5, "valid": 0.5}
    assert assign_splits(names, splits, 0) != assign_splits(names, splits, 1)


@pytest.mark.parametrize(
    "splits",
    [
        pytest.param({}, id="none"),
        pytest.param({"train": -0.5, "valid": 1.5}, id="negative"),
        pytest.param({"train": 0.0}, id="zero-sum"),
        pytest.param({"train": float("nan")}, id="nan"),
    ],
)
def test_bad_fractions(splits: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="splits"):
        assign_splits(["a"], splits, 0)


def test_strata_must_match_names() -> None:
    with pytest.raises(ValueError, match="strata"):
        assign_splits(["a", "b"], {"train": 1.0}, 0, strata=["x"])
