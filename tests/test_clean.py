"""clean: key sanitising, split assignment, the plan and the task cutter."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeRaw, WriteConfig
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl import clean, decode, discover, schedule
from h5etl.clean import Plan, TaskCutter
from h5etl.config import load_spec
from h5etl.records import BatchResult, DecodeTask, Reject, Sample, SourceFile

keys = st.text(min_size=1, max_size=12)
fractions = st.sampled_from(
    [{"train": 1.0}, {"train": 0.8, "valid": 0.2}, {"a": 0.5, "b": 0.25, "c": 0.25}]
)


@given(st.lists(keys, max_size=30, unique=True), fractions, st.integers(0, 2**32))
def test_split_is_stable_and_independent_of_other_keys(
    names: list[str], splits: dict[str, float], seed: int
) -> None:
    alone = {key: clean.split_of(key, splits, seed) for key in names}
    together = {key: clean.split_of(key, splits, seed) for key in reversed(names)}
    assert alone == together
    assert set(alone.values()) <= set(splits)


def test_split_fractions_are_approximately_kept() -> None:
    splits = {"train": 0.7, "valid": 0.2, "test": 0.1}
    counts = Counter(clean.split_of(f"sample-{i}", splits, 0) for i in range(20000))
    for name, fraction in splits.items():
        assert abs(counts[name] / 20000 - fraction) < 0.015


def test_seed_changes_the_assignment() -> None:
    splits = {"train": 0.5, "valid": 0.5}
    first = [clean.split_of(str(i), splits, 0) for i in range(200)]
    second = [clean.split_of(str(i), splits, 1) for i in range(200)]
    assert first != second


def test_plan_keeps_splits_when_the_folder_grows(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=30)
    spec = load_spec(write_config(tmp_path))
    samples = discover.find_samples(spec).samples
    full = clean.plan(spec, samples)
    half = clean.plan(spec, samples[::2])
    where_full = {s.key: split for split, members in full.splits.items() for s in members}
    where_half = {s.key: split for split, members in half.splits.items() for s in members}
    assert len(where_full) == 30
    assert all(where_full[key] == split for key, split in where_half.items())


def test_plan_order_is_seeded(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> None:
    make_raw(tmp_path, n=20)
    spec = load_spec(write_config(tmp_path, splits={"train": 1.0}))
    samples = discover.find_samples(spec).samples
    first = [s.key for s in clean.plan(spec, samples).splits["train"]]
    again = [s.key for s in clean.plan(spec, list(reversed(samples))).splits["train"]]
    assert first == again
    assert sorted(first) == [s.key for s in samples]
    other = load_spec(write_config(tmp_path, splits={"train": 1.0}, seed=5))
    assert [s.key for s in clean.plan(other, samples).splits["train"]] != first


def test_plan_probes_and_rejects_every_file_once(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=4, broken=["oversize", "size_mismatch", "empty", "text"])
    spec = load_spec(write_config(tmp_path))
    plan = clean.plan(spec, discover.find_samples(spec).samples)
    assert plan.total == 4
    assert {r.path: r.reason for r in plan.rejects} == raw.reasons
    assert {s.key for members in plan.splits.values() for s in members} == set(raw.keys)


def test_probe_progress_is_reported(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3, broken=["empty"])
    spec = load_spec(write_config(tmp_path))
    ticks: list[int] = []
    clean.plan(spec, discover.find_samples(spec).samples, ticks.append)
    assert sum(ticks) == 4


def test_probes_on_the_workers_make_the_same_plan(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=40, broken=["oversize", "size_mismatch", "empty", "text", "truncated"])
    spec = load_spec(write_config(tmp_path))
    samples = discover.find_samples(spec).samples
    monkeypatch.setattr(clean, "PROBE_BATCH", 7)  # several batches, the last one short
    here = clean.plan(spec, samples)
    batches: list[int] = []

    def on_workers(fn: clean.ProbeBatch, items: Iterable[Sequence[Sample]]) -> Iterator[Any]:
        for outcome in schedule.map_in_workers(fn, items, jobs=2):
            batches.append(len(outcome))
            yield outcome

    there = clean.plan(spec, samples, mapper=on_workers)
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
    assert clean.sanitize_key(key) == expected


def test_sanitize_key_bounds_length_and_stays_distinct() -> None:
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    clean_a, clean_b = clean.sanitize_key(long_a), clean.sanitize_key(long_b)
    assert len(clean_a) <= clean.MAX_KEY_LENGTH
    assert clean_a != clean_b
    assert clean_a.endswith(hashlib.sha256(long_a.encode()).hexdigest()[:12])


def _sample(key: str) -> Sample:
    return Sample.of(key, (SourceFile("image", "/i", key), SourceFile("mask", "/m", key)))


def test_sanitize_keys_numbers_collisions() -> None:
    samples = [_sample("a:b"), _sample("a\\b"), _sample("c")]
    out, renamed = clean.sanitize_keys(samples)
    assert [s.key for s in out] == ["a_b", "a_b~2", "c"]
    assert renamed == [("a:b", "a_b"), ("a\\b", "a_b~2")]


def test_sanitize_keys_numbers_around_existing_keys() -> None:
    # "a:b" cleans to "a_b", which a file already has; the real key "a_b~2" exists too
    samples = [_sample("a:b"), _sample("a_b"), _sample("a_b~2")]
    out, _ = clean.sanitize_keys(samples)
    assert [s.key for s in out] == ["a_b~3", "a_b", "a_b~2"]  # a clean key keeps its name


@given(st.lists(st.text(alphabet="ab:_~2\\", min_size=1, max_size=5), unique=True, max_size=12))
def test_sanitized_keys_are_unique(names: list[str]) -> None:
    out, _ = clean.sanitize_keys([_sample(k) for k in sorted(names)])
    assert len({s.key for s in out}) == len(names)


def _plan(sizes: list[int]) -> Plan:
    splits = {
        f"s{i}": [Sample(f"s{i}-{j}", (), ()) for j in range(size)] for i, size in enumerate(sizes)
    }
    return Plan(splits, [])


def _simulated_worker(rejected: frozenset[str]) -> Any:
    """A worker that rejects the samples named in ``rejected`` and keeps to the task rules."""

    def run(task: DecodeTask) -> BatchResult:
        result = BatchResult(task, 0)
        kept: list[int] = []
        for position, sample in enumerate(task.samples):
            if len(kept) == decode.capacity_of(task):
                result.deferred.extend(range(position, len(task.samples)))
                break
            if sample.key in rejected:
                result.rejects.append(Reject(sample.key, "decode", "truncated", "", sample.key))
            else:
                kept.append(position)
        keep = decode.keep_whole_blocks(task, len(kept))
        result.deferred = sorted([*result.deferred, *kept[keep:]])
        result.accepted = keep
        result.keys = [task.samples[p].key for p in kept[:keep]]
        return result

    return run


def _run_cutter(
    cutter: TaskCutter, worker: Any, window: int, stop_after: int | None = None
) -> tuple[list[BatchResult], list[DecodeTask]]:
    """Cut and 'decode' through the real ordered window, feeding the cutter as a build does."""
    tasks: list[DecodeTask] = []

    def submit(task: DecodeTask) -> Future[BatchResult]:
        tasks.append(task)
        future: Future[BatchResult] = Future()
        future.set_result(worker(task))
        return future

    results = []
    for result in schedule._in_order(cutter, submit, lambda _, f: f.result(), window):
        cutter.note(result)
        results.append(result)
        if stop_after is not None and len(results) == stop_after:
            break
    return results, tasks


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 150), min_size=1, max_size=3),
    block=st.sampled_from([1, 2, 3, 8, 32]),
    window=st.integers(1, 9),
    data=st.data(),
)
def test_tasks_store_every_sample_once_in_whole_chunks_whatever_the_window(
    sizes: list[int], block: int, window: int, data: st.DataObject
) -> None:
    plan = _plan(sizes)
    everyone = [s.key for members in plan.splits.values() for s in members]
    rejected = frozenset(
        data.draw(st.lists(st.sampled_from(everyone), unique=True)) if everyone else []
    )
    worker = _simulated_worker(rejected)

    results, tasks = _run_cutter(TaskCutter(plan, block), worker, window)
    reference, _ = _run_cutter(TaskCutter(plan, block), worker, 1)  # nothing in flight

    def stored(outcome: list[BatchResult]) -> dict[str, list[str]]:
        rows: dict[str, list[str]] = {split: [] for split in plan.splits}
        for result in outcome:
            rows[result.task.split].extend(result.keys)
        return rows

    rows = stored(results)
    assert rows == stored(reference), "the window (--jobs) changed what went where"
    for split, members in plan.splits.items():
        keys = [s.key for s in members]
        assert sorted(rows[split]) == sorted(k for k in keys if k not in rejected)
        split_results = [r for r in results if r.task.split == split]
        assert sorted(r.key for res in split_results for r in res.rejects) == sorted(
            k for k in keys if k in rejected
        )
        # every chunk is whole except the split's last one
        sizes_stored = [r.accepted for r in split_results if r.accepted]
        assert all(size % block == 0 for size in sizes_stored[:-1])
        finals = [r for r in split_results if r.task.final]
        assert len(finals) <= 1
        if finals:
            assert split_results[-1].task.final
    cutter = TaskCutter(plan, block)
    assert all(len(t.samples) <= cutter.rows + cutter.reserve for t in tasks)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 150), min_size=1, max_size=2),
    block=st.sampled_from([1, 4, 32]),
    data=st.data(),
)
def test_a_cutter_restored_from_its_journal_state_cuts_the_same_tasks(
    sizes: list[int], block: int, data: st.DataObject
) -> None:
    plan = _plan(sizes)
    everyone = [s.key for members in plan.splits.values() for s in members]
    rejected = frozenset(data.draw(st.lists(st.sampled_from(everyone), unique=True)))
    worker = _simulated_worker(rejected)
    whole, _ = _run_cutter(TaskCutter(plan, block), worker, 3)
    stop = data.draw(st.integers(1, len(whole)))

    first = TaskCutter(plan, block)
    head, _ = _run_cutter(first, worker, 1, stop_after=stop)  # killed after a checkpoint
    journaled: dict[str, dict[str, Any]] = {}
    for split, queue in first.journal_delta().items():  # as journal.ResumeState adds it up
        journaled[split] = {k: queue[k] for k in ("consumed", "rounds", "cut")}
        journaled[split]["deferred"] = list(queue["deferred"])
    tail, _ = _run_cutter(TaskCutter(plan, block, state=journaled), worker, 3)

    assert [r.keys for r in head + tail] == [r.keys for r in whole]


def test_a_journal_of_tasks_cut_otherwise_is_refused() -> None:
    plan = _plan([10])
    state = TaskCutter(plan, 2, rows=4).journal_delta()
    with pytest.raises(ValueError, match="cut otherwise"):
        TaskCutter(plan, 2, rows=6, state=state)


@pytest.mark.parametrize(
    ("block", "rows"),
    [
        pytest.param(1, 64, id="chunks of 1 sample"),
        pytest.param(8, 64, id="chunks of 8"),
        pytest.param(32, 64, id="chunks of 32"),
        pytest.param(64, 64, id="chunks of 64"),
        pytest.param(100, 100, id="chunks of 100"),
    ],
)
def test_a_task_carries_several_chunks_whatever_the_chunk_size(block: int, rows: int) -> None:
    # chunk_samples: 8 built at half the speed of 32, because a task held one chunk's rows
    assert clean.task_rows(block) == rows
    assert clean.task_reserve(rows) >= 2
