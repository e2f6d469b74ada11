"""decode: a worker process that dies (segfault, OOM kill) costs only the samples that kill it;
a kind that raises (its bug) says which field, sample and files it was decoding.

The crashing functions below run in loky workers, pickled by value (so ``_PARENT`` travels with
them); each refuses to run in the test's own process, which is the build's parent.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, read_release

import h5etl
from h5etl.config.load import load_spec
from h5etl.dataflow import BatchResult, DecodeTask, Sample, SourceFile
from h5etl.decode import probes
from h5etl.decode import task as decode
from h5etl.decode.recipe import DecodeRecipe
from h5etl.execute import mapping, schedule
from h5etl.execute import pool as workers
from h5etl.resume import journal_use as resume

_PARENT = os.getpid()
DOOMED = "s003"  # the sample whose decoder (or header probe) kills its process every time


@pytest.fixture(autouse=True)
def _pickled_by_value() -> Iterator[None]:
    from joblib.externals.loky.backend.reduction import cloudpickle  # what loky pickles with

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _die_in_worker() -> None:
    if os.getpid() == _PARENT:
        raise AssertionError("work that kills its process ran in the build's own process")
    os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does; a segfault is alike


def _keys_or_die(samples: Sequence[Sample]) -> list[str]:
    if any(s.key == DOOMED for s in samples):
        _die_in_worker()
    return [s.key for s in samples]


def _probe_or_die(probe: probes.ProbeBatch, samples: Sequence[Sample]) -> list[probes.ProbeOutcome]:
    """A header probe that kills its worker on ``DOOMED`` every time (a segfaulting codec)."""
    if any(s.key == DOOMED for s in samples):
        _die_in_worker()
    return probe(samples)


def _decode_or_die(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """Kills its worker on ``DOOMED`` every time, and on any valid task of several samples.

    The second crash needs the whole batch (an OOM kill, a flaky native crash): each sample
    decodes alone, so a rerun of the survivors of a task would crash again.
    """
    if any(s.key == DOOMED for s in task.samples):
        _die_in_worker()
    if task.split == "valid" and len(task.samples) > 1:
        _die_in_worker()
    return decode.decode_batch(task, recipe)


def _sample(key: str) -> Sample:
    files = tuple(SourceFile(source, f"/raw/{source}", f"{key}.png") for source in ("a", "b"))
    return Sample.of(key, files)


def test_a_batch_that_kills_its_worker_loses_only_the_sample_that_does() -> None:
    keys = [f"s{i:03d}" for i in range(10)]
    batches = [tuple(_sample(k) for k in keys[i : i + 3]) for i in range(0, len(keys), 3)]

    outcomes = list(mapping.map_in_workers(_keys_or_die, batches, jobs=2, window=2))

    flat = [outcome for batch in outcomes for outcome in batch]
    assert flat[:3] + flat[4:] == keys[:3] + keys[4:]
    crashed = flat[3]
    assert isinstance(crashed, list)
    assert [(r.path, r.stage, r.reason, r.key) for r in crashed] == [
        (f.path, "clean", "worker_crashed", DOOMED) for f in _sample(DOOMED).files
    ]
    assert all("died" in r.detail for r in crashed)


def _build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(load_spec(config), **kwargs)


def _without(data: dict[str, np.ndarray], filename: str) -> dict[str, np.ndarray]:
    """Every dataset of a release with the row of ``filename`` removed (rows kept in order)."""
    out = {}
    for split in {name.split("/")[0] for name in data}:
        keep = data[f"{split}/filename"] != filename
        out.update({n: a[keep] for n, a in data.items() if n.startswith(f"{split}/")})
    return out


def _assert_only_doomed_lost(
    report: h5etl.BuildReport, expected: dict[str, np.ndarray], stage: str
) -> None:
    """``DOOMED``'s image and mask are ``worker_crashed`` rejects; the file holds ``expected``."""
    assert report.path is not None
    assert report.rejects_path is not None
    assert report.reject_counts == {"worker_crashed": 2}
    rejects = [json.loads(line) for line in report.rejects_path.read_text("utf-8").splitlines()]
    assert [(Path(r["path"]).name, r["stage"], r["reason"], r["key"]) for r in rejects] == [
        (f"{DOOMED}.png", stage, "worker_crashed", DOOMED)
    ] * 2
    assert {Path(r["path"]).parent.name for r in rejects} == {"images", "masks"}
    got = read_release(report.path)
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.fixture
def project(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> Path:
    """12 good pairs (8 train, 4 valid with seed 0); tasks of 4 samples."""
    make_raw(tmp_path, n=12)
    return write_config(tmp_path, storage={"chunk_samples": 4})


def test_a_header_probe_that_kills_its_worker_rejects_its_sample(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a probe batch whose worker died twice ran a third time in the parent: a probe that
    # segfaults every time took the build (and its lock) down with it
    doomed = [project.parent / "raw" / kind / f"{DOOMED}.png" for kind in ("images", "masks")]
    for path in doomed:  # the reference: the same folder without the sample (same plan)
        path.rename(path.with_suffix(".aside"))
    reference = _build(project, jobs=1)
    for path in doomed:
        path.with_suffix(".aside").rename(path)
    assert reference.path is not None
    mapper: Callable[..., Any] = mapping.map_in_workers

    def probing_or_dying(fn: probes.ProbeBatch, *args: Any, **kwargs: Any) -> Any:
        return mapper(functools.partial(_probe_or_die, fn), *args, **kwargs)

    monkeypatch.setattr(mapping, "map_in_workers", probing_or_dying)

    # header probes run in dry runs only (a build's decoding makes the same checks)
    report = _build(project, jobs=2, dry_run=True)

    assert report.samples == reference.samples
    assert [(Path(r.path).name, r.stage, r.reason, r.key) for r in report.rejects] == [
        (f"{DOOMED}.png", "clean", "worker_crashed", DOOMED)
    ] * 2


def test_a_crash_on_the_rerun_of_the_survivors_is_no_traceback(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # after isolating the sample that crashed, the survivors ran again as one task; a crash
    # there (OOM, a flaky codec) escaped run_tasks as BrokenProcessPool and ended the build
    # the reference: the same folder without the sample. A decode-time reject re-splits the
    # samples stored by the rule (exact splits hold for what the file holds), so the crashed
    # build stores what a build that never saw DOOMED stores, in the same order
    doomed = [project.parent / "raw" / kind / f"{DOOMED}.png" for kind in ("images", "masks")]
    for path in doomed:
        path.rename(path.with_suffix(".aside"))
    reference = _build(project, jobs=1)
    for path in doomed:
        path.with_suffix(".aside").rename(path)
    assert reference.path is not None
    assert reference.samples["valid"] > 1  # so a valid task of several samples crashes
    monkeypatch.setattr(
        schedule, "run_tasks", functools.partial(schedule.run_tasks, worker=_decode_or_die)
    )

    report = _build(project, jobs=2, full=True)  # decoded again, not carried from the reference

    expected = read_release(reference.path)
    _assert_only_doomed_lost(report, expected, "decode")


def test_a_crash_in_a_final_task_does_not_stop_the_checkpoints(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an isolated task's rows come back raw; a final task's partial last chunk stayed in the
    # writer's carry until the end, and no checkpoint was written for the rest of the build
    make_raw(tmp_path, n=12)
    config = write_config(
        tmp_path, storage={"chunk_samples": 4}, splits={"valid": 0.3, "train": 0.7}
    )
    reference = _build(config, jobs=1)
    assert reference.samples["valid"] > 1  # valid is one final task, cut first
    monkeypatch.setattr(
        schedule, "run_tasks", functools.partial(schedule.run_tasks, worker=_decode_or_die)
    )
    consistent_at_checkpoints: list[bool] = []
    original = resume.Checkpoints.maybe_write

    def spying(self: resume.Checkpoints, sink: Any) -> None:
        consistent_at_checkpoints.append(sink.consistent)
        original(self, sink)

    monkeypatch.setattr(resume.Checkpoints, "maybe_write", spying)

    report = _build(config, jobs=2, checkpoint_seconds=0, full=True)

    assert sum(report.samples.values()) + len(report.rejects) // 2 == 12
    assert consistent_at_checkpoints
    assert all(consistent_at_checkpoints)
    assert report.path is not None
    from h5etl.check.health import check_release

    assert check_release(report.path, deep=True).ok


def test_a_pool_broken_at_submit_time_costs_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # loky raises at submit when a worker died since the pool was checked: that escaped the
    # ordered window as TerminatedWorkerError and ended the build
    from joblib.externals.loky.process_executor import BrokenProcessPool

    real_pool = workers.pool
    broken_once = [True]

    class Flaky:
        def __init__(self, executor: Any) -> None:
            self.executor = executor

        def submit(self, *args: Any) -> Any:
            if broken_once[0]:
                broken_once[0] = False
                raise BrokenProcessPool("a worker died since the last check")
            return self.executor.submit(*args)

    monkeypatch.setattr(workers, "pool", lambda jobs: Flaky(real_pool(jobs)))
    keys = [f"k{i}" for i in range(9)]
    batches = [tuple(_sample(k) for k in keys[i : i + 3]) for i in range(0, 9, 3)]

    outcomes = list(mapping.map_in_workers(_keys_or_die, batches, jobs=2, window=2))

    assert [key for batch in outcomes for key in batch] == keys  # no k is DOOMED


def test_a_kinds_bug_names_the_field_and_the_files_it_was_decoding(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a plugin kind's bug in decode raised a bare ValueError: the traceback named the plugin's
    # line but neither the field nor the input file that set it off
    from h5etl.kinds.mask import MaskKind

    raw = make_raw(tmp_path, n=4)
    doomed = raw.keys[2]
    decode_mask = MaskKind.decode

    def buggy(self: MaskKind, context: Any) -> Any:
        if context.sample.key == doomed:
            raise ValueError("a bug in the kind")
        return decode_mask(self, context)

    monkeypatch.setattr(MaskKind, "decode", buggy)
    with pytest.raises(ValueError, match="a bug in the kind") as caught:
        h5etl.build(load_spec(write_config(tmp_path)), jobs=1)
    image = tmp_path / "raw" / "images" / f"{doomed}.png"
    mask = tmp_path / "raw" / "masks" / f"{doomed}.png"
    assert caught.value.__notes__ == [
        f"h5etl: in mask field 'mask' of sample {doomed!r}",
        f"h5etl: its files: {image}, {mask}",
    ]
    assert not list(tmp_path.glob("releases/*.h5"))  # nothing published
