"""local_threads: a small increment decodes in the build's own threads, not in new workers.

Real builds in tmp_path: where the decoding ran (the build facts' ``decoded_in``), that the
file is the one the workers make (byte for byte, with SOURCE_DATE_EPOCH), that the new rows
are their PNGs as Pillow reads them, and the crash rule: a sample that kills the build's
own process costs that build; the next one decodes in workers and rejects the sample.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, expected_image, expected_mask
from conftest import add_pairs as add_random_pairs

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.execute import local_threads
from h5etl.execute import pool as workers
from h5etl.history.build_report import BuildReport
from h5etl.release.folder import OutputFolder

HERE = "this process (2 threads)"


def add_pairs(root: Path, keys: list[str], seed: int = 1) -> None:
    add_random_pairs(root, keys, seed, largest=19)


def facts(report: BuildReport) -> dict[str, Any]:
    assert report.path is not None
    built: dict[str, Any] = json.loads(report.path.with_suffix(".build.json").read_text())
    return built


def carry_record(report: BuildReport) -> dict[str, Any]:
    assert report.path is not None
    record: dict[str, Any] = json.loads(
        report.path.with_name(f".{report.path.name}.carry.json").read_text()
    )
    return record


@pytest.fixture
def pool_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each start of a local worker pool (``workers.warm_up`` of jobs > 1), which still runs."""
    started: list[int] = []
    real: Callable[[int], None] = workers.warm_up

    def counted(jobs: int) -> None:
        if jobs > 1:
            started.append(jobs)
        real(jobs)

    monkeypatch.setattr(workers, "warm_up", counted)
    return started


def _rows(path: Path, keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            names = [str(k) for k in handle[f"{split}/sample_key"].asstr()[...]]
            for key in keys:
                if key in names:
                    row = names.index(key)
                    out[key] = (handle[f"{split}/image"][row], handle[f"{split}/mask"][row])
    return out


def test_a_small_increment_decodes_here_and_writes_the_workers_bytes(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    pool_starts: list[int],
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the same inputs: the same bytes
    make_raw(tmp_path, n=30)
    config = write_config(tmp_path, storage={"chunk_samples": 4})
    first = build(load_spec(config), jobs=2)
    assert facts(first)["decoded_in"] == "workers"  # no parent: everything, in workers
    assert carry_record(first)[local_threads.RATE_KEY] > 0  # what a sample cost to decode
    assert pool_starts == [2]
    parent = tmp_path / "parent-releases"
    shutil.copytree(tmp_path / "releases", parent, symlinks=True)
    new = [f"new{i}" for i in range(5)]
    add_pairs(tmp_path, new)

    here = build(load_spec(config), jobs=2)

    assert pool_starts == [2]  # no worker started for 5 samples (and the split ends)
    assert facts(here)["decoded_in"] == HERE
    assert here.path is not None
    assert 0 < here.reused < 35
    assert check_release(here.path, deep=True).ok
    raw = tmp_path / "raw"
    for key, (image, mask) in _rows(here.path, new).items():  # Pillow's reading, not ours
        np.testing.assert_array_equal(image, expected_image(raw / "images" / f"{key}.png"))
        np.testing.assert_array_equal(mask, expected_mask(raw / "masks" / f"{key}.png"))
    assert len(_rows(here.path, new)) == 5
    # the same build from the same parent, decoded by workers: the very same file
    here_bytes = here.path.read_bytes()
    shutil.rmtree(tmp_path / "releases")
    shutil.copytree(parent, tmp_path / "releases", symlinks=True)
    monkeypatch.setattr(local_threads, "START_SECONDS", 0.0)  # nothing is cheap enough here
    pooled = build(load_spec(config), jobs=2)
    assert facts(pooled)["decoded_in"] == "workers"
    assert pool_starts == [2, 2]
    assert pooled.path == here.path
    assert pooled.path.read_bytes() == here_bytes


def _parent_without_rate(report: BuildReport) -> None:
    record = carry_record(report)
    del record[local_threads.RATE_KEY]  # a release an older h5etl built
    assert report.path is not None
    report.path.with_name(f".{report.path.name}.carry.json").write_text(json.dumps(record))


@pytest.mark.parametrize("why", ["no-rate", "too-many", "jobs-1"])
def test_the_workers_decode_what_the_rule_does_not_give_this_process(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    pool_starts: list[int],
    why: str,
) -> None:
    make_raw(tmp_path, n=12)
    config = write_config(tmp_path, storage={"chunk_samples": 4})
    first = build(load_spec(config), jobs=1)
    assert facts(first)["decoded_in"] == "this process"
    if why == "no-rate":
        _parent_without_rate(first)
    elif why == "too-many":
        rate = carry_record(first)[local_threads.RATE_KEY]
        monkeypatch.setattr(local_threads, "START_SECONDS", rate * 2.5)  # 2 samples' worth
    add_pairs(tmp_path, ["new0", "new1", "new2"])
    again = build(load_spec(config), jobs=1 if why == "jobs-1" else 2)
    assert again.path is not None
    assert again.reused > 0
    expected = "this process" if why == "jobs-1" else "workers"
    assert facts(again)["decoded_in"] == expected
    assert pool_starts == ([] if why == "jobs-1" else [2])
    assert check_release(again.path, deep=True).ok


def test_a_copy_decodes_nothing_starts_nothing_and_keeps_the_parents_rate(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, pool_starts: list[int]
) -> None:
    make_raw(tmp_path, n=12)
    config = load_spec(write_config(tmp_path, storage={"chunk_samples": 4}))
    first = build(config, jobs=1)
    copy = build(config.model_copy(update={"notes": "the same samples"}), jobs=2)
    assert copy.reused == 12
    assert pool_starts == []
    assert facts(copy)["decoded_in"] == ""  # nothing was decoded anywhere
    rate = carry_record(first)[local_threads.RATE_KEY]
    assert carry_record(copy)[local_threads.RATE_KEY] == rate


# A build in a child process whose decoder kills its own process on the sample DOOMED: in a
# worker (pickled by value from __main__) or in the build's own process, as a segfaulting
# codec would. It prints where it decoded and its rejects.
CHILD = """
    import json, os, signal, sys
    import h5etl
    from h5etl.execute import schedule
    from h5etl.decode import task as decode
    real = decode.decode_batch
    def doomed(task, recipe):
        if any(s.key == "doomed" for s in task.samples):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(task, recipe)
    decode.decode_batch = doomed  # what the threads of this process call
    pooled = schedule.run_tasks
    def run_tasks(tasks, recipe, **kwargs):
        return pooled(tasks, recipe, **{**kwargs, "worker": doomed})
    schedule.run_tasks = run_tasks  # what the workers call
    report = h5etl.build(h5etl.load_spec(sys.argv[1]), jobs=2)
    built = json.loads(report.path.with_suffix(".build.json").read_text())
    print(json.dumps({"version": report.version, "decoded_in": built["decoded_in"],
                      "rejects": sorted({(r.key, r.reason) for r in report.rejects})}))
"""


def _child_build(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_sample_that_kills_this_process_is_a_workers_reject_in_the_next_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=12)
    config = write_config(tmp_path, storage={"chunk_samples": 4})
    first = build(load_spec(config), jobs=1)
    assert first.path is not None
    releases = tmp_path / "releases"
    link = releases / "cells.h5"
    before = first.path.read_bytes()
    add_pairs(tmp_path, ["doomed", "fine"])

    killed = _child_build(config)  # cheap: decoded here, so the sample kills the build

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert link.resolve() == first.path  # the previous release and link untouched
    assert first.path.read_bytes() == before
    assert sorted(p.name for p in releases.glob("cells-v*.h5")) == ["cells-v0001.h5"]
    left = OutputFolder(releases, "cells").stale_partials()
    assert any(p.suffix == ".h5" for p in left)  # its temp file: what the next build sees

    after = _child_build(config)  # a killed build's temp file: the workers isolate it

    assert after.returncode == 0, after.stderr
    told = json.loads(after.stdout.strip().splitlines()[-1])
    assert told["version"] == 2
    assert told["decoded_in"] == "workers"
    assert told["rejects"] == [["doomed", "worker_crashed"]]
    assert link.resolve() == releases / "cells-v0002.h5"
    assert check_release(link, deep=True).ok
    assert OutputFolder(releases, "cells").stale_partials() == []  # the killed one's went
    # a parent that rejected a crash: the sample comes again with the next build, in workers
    add_pairs(tmp_path, ["later"], seed=2)
    third = _child_build(config)
    assert third.returncode == 0, third.stderr
    told = json.loads(third.stdout.strip().splitlines()[-1])
    assert (told["version"], told["decoded_in"]) == (3, "workers")
    assert told["rejects"] == [["doomed", "worker_crashed"]]
    with h5py.File(link, "r") as handle:
        keys = {str(k) for s in ("train", "valid") for k in handle[f"{s}/sample_key"].asstr()[...]}
    assert {"fine", "later"} <= keys
    assert "doomed" not in keys


def test_this_processs_decoders_start_once_the_temp_file_exists(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample that kills this process must leave the build's temp file behind, or the next
    build would decode it here again: the decoders wait for the file, however slowly the
    sink makes it (here: 0.3 s late)."""
    from h5etl.decode import task as decode
    from h5etl.sink import writer as sink

    make_raw(tmp_path, n=30)
    config = write_config(tmp_path, storage={"chunk_samples": 4})
    build(load_spec(config), jobs=1)
    releases = tmp_path / "releases"
    add_pairs(tmp_path, [f"new{i}" for i in range(5)])
    seen: list[bool] = []
    real_decode, real_enter = decode.decode_batch, sink.Sink.__enter__

    def watched(task: Any, recipe: Any) -> Any:
        left = OutputFolder(releases, "cells").stale_partials()
        seen.append(any(p.suffix == ".h5" for p in left))  # the temp file, not its journal
        return real_decode(task, recipe)

    def slow_enter(self: sink.Sink) -> sink.Sink:
        time.sleep(0.3)
        return real_enter(self)

    monkeypatch.setattr(decode, "decode_batch", watched)
    monkeypatch.setattr(sink.Sink, "__enter__", slow_enter)
    here = build(load_spec(config), jobs=2)
    assert facts(here)["decoded_in"] == HERE
    assert seen
    assert all(seen)  # every decode ran with the temp file on disk


def test_the_rule_in_figures() -> None:
    assert local_threads.choose(100, 0.001, None).here  # 0.1 s of decoding
    assert not local_threads.choose(2000, 0.001, None).here  # 2 s: the workers are worth it
    assert not local_threads.choose(1, 0.001, "a killed build").here
    assert not local_threads.choose(1, None, None).here  # unknown cost: workers
    assert local_threads.rate_of(4, 0.02, 0.3) == 0.005
    assert local_threads.rate_of(0, 0.0, 0.3) == 0.3  # a copy keeps its parent's
    assert local_threads.rate_of(0, 0.0, None) is None
    assert local_threads.per_sample_seconds({local_threads.RATE_KEY: 0.004}) == 0.004
    for broken in ({}, {local_threads.RATE_KEY: "fast"}, {local_threads.RATE_KEY: -1.0}, None):
        assert local_threads.per_sample_seconds(broken) is None
    crashed = {"rejected": {"s1": [[], "", "", [["a.png", "decode", "worker_crashed", "", "s1"]]]}}
    assert local_threads.refusal(killed=False, resume=False, record=crashed) is not None
    assert local_threads.refusal(killed=False, resume=False, record={"rejected": {}}) is None
