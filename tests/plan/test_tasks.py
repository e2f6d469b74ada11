"""tasks: the task cutter, its rounds and reserves, its journal state."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.dataflow import BatchResult, DecodeTask, Reject, Sample
from h5etl.decode import task as decode
from h5etl.execute import mapping, schedule
from h5etl.plan import tasks
from h5etl.plan.result import Plan
from h5etl.plan.tasks import TaskCutter


def _plan(sizes: list[int]) -> Plan:
    splits = {
        f"s{i}": [Sample(f"s{i}-{j}", (), ()) for j in range(size)] for i, size in enumerate(sizes)
    }
    return Plan(splits, [])


def _simulated_worker(rejected: frozenset[str], decoded: list[str] | None = None) -> Any:
    """A worker that rejects the samples named in ``rejected`` and keeps to the task rules;
    it appends the key of every sample it decodes to ``decoded``."""

    def run(task: DecodeTask) -> BatchResult:
        result = BatchResult(task, 0)
        kept: list[int] = []
        for position, sample in enumerate(task.samples):
            if decode.done_decoding(task, len(kept), position):
                result.deferred.extend(range(position, len(task.samples)))
                break
            if decoded is not None:
                decoded.append(sample.key)
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
    cutter: TaskCutter,
    worker: Any,
    window: int,
    stop_after: int | None = None,
    finished: list[bool] | None = None,
    stored: int | None = None,
) -> tuple[list[BatchResult], list[DecodeTask]]:
    """Cut and 'decode' through the real ordered window, feeding the cutter as a build does
    (``finished``: what the cutter said after each result; ``stored``: how many results the
    writer stored, when it lags behind the decoding)."""
    tasks: list[DecodeTask] = []

    def submit(task: DecodeTask) -> Future[BatchResult]:
        tasks.append(task)
        future: Future[BatchResult] = Future()
        future.set_result(worker(task))
        return future

    results = []
    for result in schedule.in_order(cutter, submit, lambda _, f: f.result(), window):
        cutter.note(result)
        results.append(result)
        if stored is None or len(results) <= stored:
            cutter.stored()
        if finished is not None:
            finished.append(cutter.finished)
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
    sizes=st.lists(st.integers(0, 120), min_size=1, max_size=3),
    block=st.sampled_from([1, 3, 32]),
    window=st.integers(1, 6),
    data=st.data(),
)
def test_the_cutter_is_finished_after_the_last_result_only(
    sizes: list[int], block: int, window: int, data: st.DataObject
) -> None:
    """What lets the build skip its checkpoint after the last result: rejects and the rounds
    of deferred samples they cause never make the cutter finished early."""
    plan = _plan(sizes)
    everyone = [s.key for members in plan.splits.values() for s in members]
    rejected = frozenset(
        data.draw(st.lists(st.sampled_from(everyone), unique=True)) if everyone else []
    )
    finished: list[bool] = []
    cutter = TaskCutter(plan, block)
    results, _ = _run_cutter(cutter, _simulated_worker(rejected), window, finished=finished)
    assert finished == [False] * (len(results) - 1) + [True] * bool(results)
    assert cutter.finished


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 150), min_size=1, max_size=2),
    block=st.sampled_from([1, 4, 32]),
    data=st.data(),
)
def test_a_cutter_restored_from_its_journal_state_cuts_the_same_tasks(
    sizes: list[int], block: int, data: st.DataObject
) -> None:
    # The decoding may run results ahead of the writer (a resumed build's workers decode
    # while it copies): the journal must say where the queues stood after the last result
    # stored, not after the last one decoded, or a second resume skips the ones between.
    plan = _plan(sizes)
    everyone = [s.key for members in plan.splits.values() for s in members]
    rejected = frozenset(data.draw(st.lists(st.sampled_from(everyone), unique=True)))
    worker = _simulated_worker(rejected)
    whole, _ = _run_cutter(TaskCutter(plan, block), worker, 3)
    stop = data.draw(st.integers(1, len(whole)))
    ahead = data.draw(st.integers(0, len(whole) - stop))

    first = TaskCutter(plan, block)
    # killed after a checkpoint of ``stop`` results stored, ``ahead`` more decoded
    decoded, _ = _run_cutter(first, worker, 1, stop_after=stop + ahead, stored=stop)
    head = decoded[:stop]
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
        pytest.param(1, 128, id="chunks of 1 sample"),
        pytest.param(8, 128, id="chunks of 8"),
        pytest.param(32, 128, id="chunks of 32"),
        pytest.param(64, 128, id="chunks of 64"),
        pytest.param(100, 100, id="chunks of 100"),
    ],
)
def test_a_task_carries_several_chunks_whatever_the_chunk_size(block: int, rows: int) -> None:
    # chunk_samples: 8 built at half the speed of 32, because a task held one chunk's rows
    assert tasks.task_rows(block) == rows
    assert tasks.task_rows(block, samples=tasks.SMALL_PLAN) == rows
    assert tasks.task_reserve(rows) >= 2


@pytest.mark.parametrize(
    ("block", "samples", "rows"),
    [
        pytest.param(32, 174, 64, id="an increment of 174"),
        pytest.param(32, tasks.SMALL_PLAN - 1, 64, id="just under"),
        pytest.param(32, tasks.SMALL_PLAN, 128, id="at the bound"),
        pytest.param(1, 10, 64, id="chunks of 1"),
        pytest.param(100, 10, 100, id="a chunk bigger than a small task"),
    ],
)
def test_a_small_plan_is_cut_in_smaller_tasks(block: int, samples: int, rows: int) -> None:
    # 174 new pairs of an incremental build made tasks of 120 and 54 for two threads
    assert tasks.task_rows(block, samples=samples) == rows
    assert TaskCutter(_plan([samples // 2, samples - samples // 2]), block).rows == rows


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=3),
    block=st.sampled_from([1, 3, 8, 32, 64, 100]),
)
def test_without_rejects_every_sample_is_decoded_once(sizes: list[int], block: int) -> None:
    # the last task of a round decoded samples that could not fill a block, then deferred them
    # to be decoded again (up to ~70 per round with chunks of 64)
    plan = _plan(sizes)
    decoded: list[str] = []
    results, _ = _run_cutter(TaskCutter(plan, block), _simulated_worker(frozenset(), decoded), 3)
    assert sorted(decoded) == sorted(s.key for members in plan.splits.values() for s in members)
    assert sum(r.accepted for r in results) == plan.total


def _thread_names(delay: float) -> Any:
    import threading
    import time

    def named(batch: Any) -> list[str]:
        time.sleep(delay)
        return [f"{item}:{threading.current_thread().name}" for item in batch]

    return named


def test_stats_answered_from_cache_stay_in_this_thread() -> None:
    # 60,000 cached stats cost twice as long in 8 threads as here (GIL handoffs)
    batches = [list(range(i, i + 4)) for i in range(0, 40, 4)]
    mapped = mapping.map_in_threads(_thread_names(0.0), batches, slow=0.5)
    out = [x for got in mapped for x in got]
    assert [x.split(":")[0] for x in out] == [str(i) for i in range(40)]
    assert not any("h5etl-stat" in x for x in out)


def test_stats_that_wait_on_the_file_system_overlap_in_threads_in_order() -> None:
    batches = [list(range(i, i + 4)) for i in range(0, 40, 4)]
    mapped = mapping.map_in_threads(_thread_names(0.005), batches, slow=1e-4)
    out = [x for got in mapped for x in got]
    assert [x.split(":")[0] for x in out] == [str(i) for i in range(40)]
    assert not any("h5etl-stat" in x for x in out[:8])  # two batches measure the file system
    assert all("h5etl-stat" in x for x in out[8:])


def test_one_slow_batch_among_cached_stats_sends_nothing_to_threads() -> None:
    # a garbage collection of the parent's heap once made one batch of cached stats slow, and
    # the rest of 60,000 went to threads (GIL handoffs: plan 0.49 s instead of 0.28 s)
    import threading
    import time

    def one_pause(batch: Sequence[int]) -> list[str]:
        if batch[0] == 4:
            time.sleep(0.05)
        return [f"{item}:{threading.current_thread().name}" for item in batch]

    batches = [list(range(i, i + 4)) for i in range(0, 40, 4)]
    out = [x for got in mapping.map_in_threads(one_pause, batches, slow=1e-3) for x in got]
    assert [x.split(":")[0] for x in out] == [str(i) for i in range(40)]
    assert not any("h5etl-stat" in x for x in out)
    assert mapping._waits([1e-6, 1.0, 1e-6], 1e-3) is False
    assert mapping._waits([1e-6, 1.0, 1.0], 1e-3) is True  # the last two: a slow file system
    assert mapping._waits([2e-3, 2e-3, 1e-6], 1e-3) is True  # the median: slow on the whole


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(0, 150), min_size=1, max_size=3), data=st.data())
def test_chunks_of_one_sample_need_no_reserves_and_one_round(
    sizes: list[int], data: st.DataObject
) -> None:
    # ragged columns only (a series build): reserves were only deferred, decoded in a later
    # round behind a barrier that idled the workers; now each sample is decoded once, in order
    plan = _plan(sizes)
    everyone = [s.key for members in plan.splits.values() for s in members]
    rejected = frozenset(
        data.draw(st.lists(st.sampled_from(everyone), unique=True)) if everyone else []
    )
    decoded: list[str] = []
    cutter = TaskCutter(plan, 1, sample_bytes=8 << 20)
    assert cutter.reserve == 0
    results, cut = _run_cutter(cutter, _simulated_worker(rejected, decoded), 5)
    assert all(not result.deferred for result in results)
    assert sorted(decoded) == sorted(everyone)  # each once
    for split, members in plan.splits.items():
        stored = [key for r in results if r.task.split == split for key in r.keys]
        assert stored == [s.key for s in members if s.key not in rejected]  # write order
    assert all(set(queue.rounds) == {queue.size} for queue in cutter.queues.values())  # one
    assert len(cut) == sum(-(-size // cutter.rows) for size in sizes)


_texts = st.text(max_size=8)


@settings(max_examples=100, deadline=None)
@given(
    samples=st.lists(
        st.tuples(_texts, st.lists(_texts, max_size=3), _texts, _texts, st.booleans()),
        max_size=6,
    ),
    final=st.booleans(),
    raw=st.booleans(),
)
def test_a_task_goes_to_a_worker_and_back_unchanged(
    samples: list[tuple[str, list[str], str, str, bool]], final: bool, raw: bool
) -> None:
    # a task is pickled as tuples of its samples' fields (records.DecodeTask.__reduce__):
    # every field of every sample must arrive, the shared roots tuple once
    from joblib.externals.loky.backend.reduction import dumps

    roots = (("image", "/data/images"), ("mask", "/data/masks"))
    made = tuple(
        Sample(key, tuple(relpaths), roots, (key, 3) if extra else (), name, group)
        for key, relpaths, name, group, extra in samples
    )
    task = DecodeTask("train", 7, made, 4, 2, final, tuple(range(len(made))), raw)
    back = pickle.loads(dumps(task))
    assert back == task
    assert [s.fields() for s in back.samples] == [s.fields() for s in made]
    assert all(s.roots is back.samples[0].roots for s in back.samples)
