"""admit: key sanitising, split assignment, the plan and the task cutter."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeRaw, WriteConfig
from hypothesis import given
from hypothesis import strategies as st

from h5etl.config.load import load_spec
from h5etl.dataflow import Sample, SourceFile
from h5etl.decode import probes
from h5etl.execute import mapping
from h5etl.plan import admit, discover
from h5etl.plan import split_assign as assign

keys = st.text(min_size=1, max_size=12)
fractions = st.sampled_from(
    [{"train": 1.0}, {"train": 0.8, "valid": 0.2}, {"a": 0.5, "b": 0.25, "c": 0.25}]
)


@given(st.lists(keys, max_size=30, unique=True), fractions, st.integers(0, 2**32))
def test_split_is_independent_of_the_order_of_the_names(
    names: list[str], splits: dict[str, float], seed: int
) -> None:
    forward = assign.assign(names, splits, seed).splits
    backward = assign.assign(names[::-1], splits, seed).splits
    assert dict(zip(names, forward, strict=True)) == dict(zip(names[::-1], backward, strict=True))
    assert set(forward) <= set(splits)


def test_seed_changes_the_assignment() -> None:
    splits = {"train": 0.5, "valid": 0.5}
    names = [str(i) for i in range(200)]
    assert assign.assign(names, splits, 0).splits != assign.assign(names, splits, 1).splits


def test_plan_keeps_splits_when_the_folder_grows(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=30)
    spec = load_spec(write_config(tmp_path))
    samples = discover.find_samples(spec).samples
    half = admit.plan(spec, samples[::2])
    where_half = {s.key: split for split, members in half.splits.items() for s in members}
    full = admit.plan(spec, samples, previous=where_half)  # the half is the previous release
    where_full = {s.key: split for split, members in full.splits.items() for s in members}
    assert len(where_full) == 30
    assert all(where_full[key] == split for key, split in where_half.items())


def test_plan_order_is_seeded(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> None:
    make_raw(tmp_path, n=20)
    spec = load_spec(write_config(tmp_path, splits={"train": 1.0}))
    samples = discover.find_samples(spec).samples
    first = [s.key for s in admit.plan(spec, samples).splits["train"]]
    again = [s.key for s in admit.plan(spec, list(reversed(samples))).splits["train"]]
    assert first == again
    assert sorted(first) == [s.key for s in samples]
    other = load_spec(write_config(tmp_path, splits={"train": 1.0}, seed=5))
    assert [s.key for s in admit.plan(other, samples).splits["train"]] != first


def test_plan_probes_and_rejects_every_file_once(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=4, broken=["oversize", "size_mismatch", "empty", "text"])
    spec = load_spec(write_config(tmp_path))
    plan = admit.plan(spec, discover.find_samples(spec).samples)
    assert plan.total == 4
    assert {r.path: r.reason for r in plan.rejects} == raw.reasons
    assert {s.key for members in plan.splits.values() for s in members} == set(raw.keys)


def test_probe_progress_is_reported(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3, broken=["empty"])
    spec = load_spec(write_config(tmp_path))
    ticks: list[int] = []
    admit.plan(spec, discover.find_samples(spec).samples, ticks.append)
    assert sum(ticks) == 4


def test_probes_on_the_workers_make_the_same_plan(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=40, broken=["oversize", "size_mismatch", "empty", "text", "truncated"])
    spec = load_spec(write_config(tmp_path))
    samples = discover.find_samples(spec).samples
    monkeypatch.setattr(admit, "PROBE_BATCH", 7)  # several batches, the last one short
    here = admit.plan(spec, samples)
    batches: list[int] = []

    def on_workers(fn: probes.ProbeBatch, items: Iterable[Sequence[Sample]]) -> Iterator[Any]:
        for outcome in mapping.map_in_workers(fn, items, jobs=2):
            batches.append(len(outcome))
            yield outcome

    there = admit.plan(spec, samples, mapper=on_workers)
    assert sum(batches) == len(samples)
    assert len(batches) == -(-len(samples) // 7)
    assert there.fingerprint() == here.fingerprint()
    assert there.splits == here.splits
    assert there.rejects == here.rejects


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        pytest.param("plain/key", "plain/key", id="unchanged"),
        pytest.param("a\x00b", "a_b", id="nul"),
        pytest.param("a\tb\nc", "a_b_c", id="control"),
        pytest.param("a\\b:c", "a_b_c", id="backslash-colon"),
        pytest.param("   ", "_", id="blank"),
    ],
)
def test_sanitize_key(key: str, expected: str) -> None:
    assert admit.sanitize_key(key) == expected


def test_sanitize_key_bounds_length_and_stays_distinct() -> None:
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    clean_a, clean_b = admit.sanitize_key(long_a), admit.sanitize_key(long_b)
    assert len(clean_a) <= admit.MAX_KEY_LENGTH
    assert clean_a != clean_b
    assert clean_a.endswith(hashlib.sha256(long_a.encode()).hexdigest()[:12])


def _sample(key: str) -> Sample:
    return Sample.of(key, (SourceFile("image", "/i", key), SourceFile("mask", "/m", key)))


def test_sanitize_keys_numbers_collisions() -> None:
    samples = [_sample("a:b"), _sample("a\\b"), _sample("c")]
    out, renamed = admit.sanitize_keys(samples)
    assert [s.key for s in out] == ["a_b", "a_b~2", "c"]
    assert renamed == [("a:b", "a_b"), ("a\\b", "a_b~2")]


def test_sanitize_keys_numbers_around_existing_keys() -> None:
    # "a:b" cleans to "a_b", which a file already has; the real key "a_b~2" exists too
    samples = [_sample("a:b"), _sample("a_b"), _sample("a_b~2")]
    out, _ = admit.sanitize_keys(samples)
    assert [s.key for s in out] == ["a_b~3", "a_b", "a_b~2"]  # a clean key keeps its name


@given(st.lists(st.text(alphabet="ab:_~2\\", min_size=1, max_size=5), unique=True, max_size=12))
def test_sanitized_keys_are_unique(names: list[str]) -> None:
    out, _ = admit.sanitize_keys([_sample(k) for k in sorted(names)])
    assert len({s.key for s in out}) == len(names)
