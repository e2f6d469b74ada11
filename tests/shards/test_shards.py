"""shards: K shard writers and one committer give the one-writer release, row for row.

The shard writers are real processes (spawned); the functions that replace their entry below
are imported by name in them (this folder is on their ``sys.path``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, dataset_digests, read_release
from hypothesis import given
from hypothesis import strategies as st

from h5etl.config.load import load_spec
from h5etl.dataflow import DecodeTask, Sample
from h5etl.errors import ClusterLost, SchedulerUnreachable, ShardError, UsageError
from h5etl.history.build_report import BuildReport
from h5etl.pipeline import run as pipeline
from h5etl.plan import tasks
from h5etl.plan.result import Plan
from h5etl.shards import committer
from h5etl.shards import writers as shards
from h5etl.sink.chunk_copy import carry_chunks


def _published(report: BuildReport) -> Path:
    assert report.path is not None
    return report.path


def _corpus(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, **overrides: object
) -> Path:
    make_raw(tmp_path, n=60, broken=["mask_128", "truncated_late", "empty"])
    return write_config(tmp_path, **overrides)


def _same_release(one: Path, other: Path) -> None:
    assert dataset_digests(one) == dataset_digests(other)
    mine, theirs = read_release(one), read_release(other)
    assert mine.keys() == theirs.keys()
    for name, rows in mine.items():
        np.testing.assert_array_equal(theirs[name], rows, err_msg=name)
    with h5py.File(one) as a, h5py.File(other) as b:
        for attr in ("config_sha256", "source_fingerprint", "layout"):
            assert a.attrs[attr] == b.attrs[attr], attr
        assert any("mean" in a[name].attrs for name in mine)
        for name in mine:  # statistics, class names, kinds: every dataset attribute
            assert a[name].attrs.keys() == b[name].attrs.keys(), name
            for key, value in a[name].attrs.items():
                np.testing.assert_array_equal(b[name].attrs[key], value, err_msg=f"{name} {key}")


@pytest.mark.parametrize("count", [2, 3])
def test_a_sharded_build_is_the_one_writer_build(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    count: int,
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 4)  # many tasks: each shard gets several
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    plain = pipeline.build(spec, jobs=1)
    done: list[int] = []

    def progress(stage: str, advance: int, total: int | None) -> None:
        if stage == "shards" and total is None:
            done.append(advance)

    sharded_report = pipeline.build(spec, jobs=2, shards=count, progress=progress)
    # the progress bar counts the shards as they commit: twice when decoding rejected
    # samples and the build wrote the stored ones again (h5etl.pipeline.settle)
    again = any(w.startswith("decoding rejected") for w in sharded_report.warnings)
    assert again
    assert sum(done) == count * 2
    _same_release(_published(plain), _published(sharded_report))
    assert sharded_report.samples == plain.samples
    assert sorted(r.path for r in sharded_report.rejects) == sorted(r.path for r in plain.rejects)
    assert sharded_report.shards == count
    leftovers = [p.name for p in (tmp_path / "releases").iterdir() if ".partial-" in p.name]
    assert leftovers == []  # the shard files went with the stitch
    assert "stitch" in sharded_report.seconds  # a build fact (build.json), not in the file
    # the stitch carried the workers' chunks: not one block was re-cut and recompressed
    assert not any(n for path, n in sharded_report.chunk_paths.items() if "rechunked" in path)
    with h5py.File(_published(sharded_report)) as handle, h5py.File(_published(plain)) as one:
        mine, theirs = handle["diagnostics"].attrs, one["diagnostics"].attrs
        assert sorted(mine) == sorted(theirs)
        for key in theirs:
            np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def test_a_sharded_cli_build_with_fork_server_workers_is_the_one_writer_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the CLI's decode workers and shard writers are forks of one fork server that preloads
    # both stacks (h5etl.execute.pool); an in-process build's decode workers are loky's
    config = _corpus(tmp_path, make_raw, write_config)
    plain = pipeline.build(load_spec(config), jobs=1)
    command = [sys.executable, "-m", "h5etl", "build", str(config), "-j", "2", "--shards", "2"]
    done = subprocess.run([*command, "--full", "-q"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    published = sorted((tmp_path / "releases").glob("*-v0002.h5"))
    assert len(published) == 1, done.stdout
    _same_release(_published(plain), published[0])


def test_one_split_smaller_than_a_task_and_a_flat_layout(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the small split is cut as one final task, which pads its last chunk inside a shard
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 8)
    config = _corpus(
        tmp_path,
        make_raw,
        write_config,
        splits={"valid": 0.1, "train": 0.9},
        layout="{field}_{split}",
        storage={"chunk_samples": 3},
    )
    spec = load_spec(config)
    plain = pipeline.build(spec, jobs=1)
    _same_release(_published(plain), _published(pipeline.build(spec, jobs=1, shards=2)))


def _die_once(job: shards.ShardJob, outcome: object) -> None:
    """A shard writer entry whose first run of shard 0 dies as if the OOM killer took it."""
    mark = job.path.parent / "died-once"
    if job.index == 0 and not mark.exists():
        mark.write_text("died once")
        os.kill(os.getpid(), signal.SIGKILL)
    shards.run_shard(job, outcome)  # type: ignore[arg-type]


def _always_die(job: shards.ShardJob, outcome: object) -> None:
    if job.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    shards.run_shard(job, outcome)  # type: ignore[arg-type]


def test_a_shard_writer_killed_is_started_again(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    plain = pipeline.build(spec, jobs=1)
    monkeypatch.setattr(committer, "SHARD_WRITER", _die_once)
    again = pipeline.build(spec, jobs=2, shards=2)
    assert (tmp_path / "releases" / "died-once").exists()
    _same_release(_published(plain), _published(again))


def test_a_shard_writer_that_keeps_dying_fails_the_build_cleanly(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    first = pipeline.build(spec, jobs=1)
    monkeypatch.setattr(committer, "SHARD_WRITER", _always_die)
    with pytest.raises(ShardError, match="shard writer 1 died 2 times"):
        pipeline.build(spec, jobs=2, shards=2)
    link = tmp_path / "releases" / "cells.h5"
    assert link.resolve() == _published(first).resolve()  # the previous release stays current
    assert sorted(p.name for p in (tmp_path / "releases").glob("cells-v*.h5")) == ["cells-v0001.h5"]


def _slow_first_shard(job: shards.ShardJob, outcome: object) -> None:
    """Shard 0 waits (and would then fail in its own words); shard 1 dies at once."""
    if job.index == 0:
        time.sleep(30)
        outcome.send(("ShardError", "shard 0 was waited for", ""))  # type: ignore[attr-defined]
        return
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_first_shard_to_fail_stops_the_build_without_waiting_for_the_others(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # outcomes were awaited in shard order: shard 1's failure waited for shard 0, and when a
    # Dask scheduler died, a shard still connecting reported "cannot reach" ahead of the one
    # that lost it mid-task
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    monkeypatch.setattr(committer, "SHARD_WRITER", _slow_first_shard)
    with pytest.raises(ShardError, match="shard writer 1 died 2 times"):
        pipeline.build(spec, jobs=2, shards=2)
    assert not list((tmp_path / "releases").glob("cells*.h5"))


def _one_connects_one_cannot(job: shards.ShardJob, outcome: Any) -> None:
    """Shard 0's decoder comes up; shard 1 then cannot reach the scheduler (it was connecting
    when the scheduler died)."""
    up = job.path.parent / "shard-0-up"
    if job.index == 0:
        outcome.send(shards.CONNECTED)
        up.touch()
        time.sleep(30)
        return
    while not up.exists():
        time.sleep(0.01)
    outcome.send(("SchedulerUnreachable", "cannot reach the Dask scheduler at local", ""))


def _none_connects(job: shards.ShardJob, outcome: Any) -> None:
    outcome.send(("SchedulerUnreachable", "cannot reach the Dask scheduler at local", ""))


def test_a_shard_that_cannot_connect_after_another_did_has_lost_the_scheduler(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI: a scheduler killed while shard 1 was still connecting read "cannot reach ...; start
    # one with `dask scheduler`", though the build had reached it: it was lost mid-build
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    monkeypatch.setattr(committer, "SHARD_WRITER", _one_connects_one_cannot)
    with pytest.raises(ClusterLost) as lost:
        pipeline.build(spec, jobs=2, shards=2)
    assert lost.value.message.startswith("lost the Dask scheduler at local mid-build")
    assert "shard writer 1 could not connect after another had" in lost.value.message
    monkeypatch.setattr(committer, "SHARD_WRITER", _none_connects)
    with pytest.raises(SchedulerUnreachable, match="cannot reach the Dask scheduler"):
        pipeline.build(spec, jobs=2, shards=2)


# A sharded build in its own session whose shard 1 never finishes: the test kills the whole
# build once shard 0 has committed, as a lost machine or a Ctrl-\\ would.
KILLED_SHARDED = """
    import sys, time
    import h5etl, h5etl.shards.committer, h5etl.plan.tasks, h5etl.shards.writers
    import stuckshard
    h5etl.plan.tasks.TASK_SAMPLES = 4
    h5etl.shards.committer.SHARD_WRITER = stuckshard.run
    h5etl.build(h5etl.load_spec(sys.argv[1]), jobs=2, shards=2)
"""
STUCK = """
    import time
    import h5etl.shards.writers

    def run(job, outcome):
        if job.index == 1:
            time.sleep(120)
        h5etl.shards.writers.run_shard(job, outcome)
"""


def test_a_killed_sharded_build_resumes_with_the_committed_shards(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 4)
    config = _corpus(tmp_path, make_raw, write_config)
    spec = load_spec(config)
    plain = pipeline.build(spec, jobs=1)
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "stuckshard.py").write_text(textwrap.dedent(STUCK))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(helpers), *sys.path])}
    log = tmp_path / "build.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(KILLED_SHARDED), str(config)],
            env=env,
            start_new_session=True,
            stderr=stderr,
        )
    releases = tmp_path / "releases"
    try:
        deadline = time.monotonic() + 60
        while not list(releases.glob(".cells.partial-shard-*-0000.manifest")):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "shard 0 never committed"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the committer and its shard writers
        proc.wait()
    assert len(list(releases.glob(".cells.partial-shard-*.manifest"))) == 1  # shard 1 was not
    resumed = pipeline.build(spec, jobs=2, shards=2, resume=True)
    assert resumed.shards_reused == 1
    _same_release(_published(plain), _published(resumed))
    assert not list(releases.glob(".cells.partial-*"))


def _plan(sizes: dict[str, int]) -> Plan:
    roots = (("image", "/in"),)
    return Plan(
        {
            split: [Sample(f"{split}{i:04d}", (f"{i}.png",), roots) for i in range(size)]
            for split, size in sizes.items()
        },
        [],
    )


@given(
    st.dictionaries(st.sampled_from(["train", "valid", "test"]), st.integers(0, 400), min_size=1),
    st.integers(1, 6),
    st.sampled_from([1, 4, 32]),
)
def test_dealing_gives_each_first_round_task_to_one_shard_in_order(
    sizes: dict[str, int], count: int, block: int
) -> None:
    plan = _plan(sizes)
    dealt = shards.deal(tasks.TaskCutter(plan, block), count)
    first = [t for t in tasks.TaskCutter(plan, block) if isinstance(t, DecodeTask)]
    assert len(dealt) == count
    for split in sizes:
        runs = [[t for t in shard if t.split == split] for shard in dealt]
        flat = [t for run in runs for t in run]
        assert flat == [t for t in first if t.split == split]  # contiguous, in order, once
        sizes_of_runs = [len(run) for run in runs]
        assert max(sizes_of_runs) - min(sizes_of_runs) <= 1


def test_a_manifest_that_loses_a_sample_is_refused() -> None:
    plan = _plan({"train": 40})
    task = next(t for t in tasks.TaskCutter(plan, 4, rows=16) if isinstance(t, DecodeTask))
    assert (len(task.samples), task.final) == (18, False)  # 16 rows and 2 reserves
    keys = {"train": [s.key for s in plan.splits["train"]]}
    lines = [f"{keys['train'][i]}\tabc\n" for i in range(16)]
    entry = {"split": "train", "start": 0, "rows": 16, "fingerprint": lines, "rejects": []}
    manifest = {
        "index": 0,
        "rows": {"train": 16},
        "tasks": [{**entry, "deferred": [16, 17]}],
    }
    shards.check_manifest(manifest, [task], keys)
    lost = {**manifest, "tasks": [{**entry, "deferred": [16]}]}
    with pytest.raises(ShardError, match="exactly once"):
        shards.check_manifest(lost, [task], keys)
    twice = {**manifest, "tasks": [{**entry, "deferred": [15, 16, 17]}]}
    with pytest.raises(ShardError, match="exactly once"):
        shards.check_manifest(twice, [task], keys)


def test_carrying_chunks_keeps_their_bytes_at_a_row_offset(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 4, (10, 2, 6, 6), dtype=np.uint8)
    options = {"chunks": (4, 2, 3, 6), "compression": "gzip", "shuffle": True}
    with h5py.File(tmp_path / "a.h5", "w") as source, h5py.File(tmp_path / "b.h5", "w") as target:
        data = source.create_dataset("x", data=rows, maxshape=(None, 2, 6, 6), **options)
        out = target.create_dataset(
            "x", shape=(8, 2, 6, 6), maxshape=(None, 2, 6, 6), dtype="u1", **options
        )
        out[:8] = 1
        carried = carry_chunks(data, out, row_offset=8)
        assert out.shape == (18, 2, 6, 6)
        np.testing.assert_array_equal(out[8:], rows)
        np.testing.assert_array_equal(out[:8], 1)
        for offset, _ in carried.chunks:
            source_offset = (offset[0] - 8, *offset[1:])
            assert out.id.read_direct_chunk(offset) == data.id.read_direct_chunk(source_offset)
        wrong = {offset: "0" * 64 for offset, _ in carried.chunks}
        with pytest.raises(ValueError, match="does not match its digest"):
            carry_chunks(data, out, row_offset=20, expected=wrong)
        with pytest.raises(ValueError, match="does not start a chunk"):
            carry_chunks(data, out, row_offset=6)
        other = target.create_dataset(
            "y",
            shape=(0, 2, 6, 6),
            maxshape=(None, 2, 6, 6),
            dtype="u1",
            chunks=(4, 2, 3, 6),
            compression="lzf",
        )
        with pytest.raises(ValueError, match="compression"):
            carry_chunks(data, other, row_offset=0)


def test_a_virtual_release_maps_the_shards_and_reads_as_one_file(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 4)
    spec = load_spec(_corpus(tmp_path, make_raw, write_config))
    plain = pipeline.build(spec, jobs=1)
    virtual = pipeline.build(spec, jobs=2, shards=2, virtual=True)
    release = _published(virtual)
    _same_release(_published(plain), release)
    parts = sorted(p.name for p in release.parent.glob("cells-v0002.part-*.h5"))
    assert parts == [f"cells-v0002.part-{i:04d}.h5" for i in range(3)]  # 2 shards, the tail
    with h5py.File(release) as handle:
        image = handle["train/image"]
        assert image.is_virtual
        assert sorted({s.file_name for s in image.virtual_sources()}) == parts  # relative names
    assert not list(release.parent.glob(".cells.partial-*"))
    # the folder moves as a whole: HDF5 finds the parts beside the release
    moved = tmp_path / "moved"
    release.parent.rename(moved)
    monkeypatch.chdir(tmp_path / "raw")
    _same_release(moved / "cells-v0001.h5", moved / "cells-v0002.h5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "h5etl", "check", str(moved / "cells-v0002.h5"), "--deep"]
    assert subprocess.run(command, env=env, capture_output=True, check=False).returncode == 0
    # without a part HDF5 reads the fill value, silently: check --deep finds it
    (moved / parts[0]).unlink()
    broken = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert broken.returncode == 1, broken.stdout


def test_vds_without_shards_is_a_usage_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config), "--vds"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "h5etl: error: --vds needs --shards K (K >= 2): it maps the shard files"
    )


def test_a_sharded_build_makes_the_same_bytes_again(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # reproducible bytes hold for sharded builds too: the same K, other folders, same file
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    files = []
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        files.append(
            _published(
                pipeline.build(load_spec(_corpus(folder, make_raw, write_config)), jobs=2, shards=2)
            )
        )
    assert files[0].read_bytes() == files[1].read_bytes()


def test_a_ragged_column_in_a_virtual_release_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its values run on across the parts mid-chunk: the block digests could not be the parts'
    from ragged_kind import use_npy_recording
    from test_ragged import make_recordings

    make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    with pytest.raises(
        UsageError, match=r"config.yaml: --vds: column 'rec' is ragged: .*without --vds$"
    ):
        pipeline.build(load_spec(tmp_path / "config.yaml"), jobs=2, shards=2, virtual=True)
    assert not list((tmp_path / "releases").glob("*.h5"))
