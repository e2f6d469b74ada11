"""Reproducible bytes: two builds of the same inputs and config are the same file but for
``created_at``; with SOURCE_DATE_EPOCH set, the same file byte for byte, whatever the folder,
the input files' times, ``--jobs``, the checkpoint times or a kill and ``--resume``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import h5etl
import h5etl.plan.tasks
from h5etl.cli.app import app
from h5etl.config.sections import Compression
from h5etl.dataflow import BatchResult, DecodeTask, EncodedRows
from h5etl.errors import ConfigError
from h5etl.format.codec import ChunkLayout, encode_rows
from h5etl.history import clock
from h5etl.kinds.columns import ArrayColumn, TextColumn
from h5etl.sink import small_columns
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink

EPOCH = "1700000000"  # 2023-11-14T22:13:20Z
BROKEN = ["truncated", "mask_128", "orphan_image"]


def _project(root: Path, make_raw: MakeRaw, write_config: WriteConfig, **overrides: Any) -> Path:
    make_raw(root, n=23, broken=BROKEN)
    return write_config(root, **{"storage": {"chunk_samples": 3}, **overrides})


def _build(config: Path, monkeypatch: pytest.MonkeyPatch, epoch: str | None, **kwargs: Any) -> Path:
    if epoch is None:
        monkeypatch.delenv(clock.ENV, raising=False)
    else:
        monkeypatch.setenv(clock.ENV, epoch)
    report = h5etl.build(h5etl.load_spec(config), **kwargs)
    assert report.path is not None
    return report.path


def _age_inputs(root: Path, seconds: int) -> None:
    """Give every input file another modification time: a checkout made on another day."""
    for path in (root / "raw").rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            os.utime(path, (stat.st_atime - seconds, stat.st_mtime - seconds))


def test_source_date_epoch_makes_identical_files(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _project(tmp_path / "one", make_raw, write_config)
    two = _project(tmp_path / "elsewhere" / "two", make_raw, write_config)
    _age_inputs(two.parent, 86_400 * 3)
    first = _build(one, monkeypatch, EPOCH, jobs=1)
    # another folder, other file times, two workers, a checkpoint after every task
    second = _build(two, monkeypatch, EPOCH, jobs=2, checkpoint_seconds=0)
    assert first.read_bytes() == second.read_bytes()
    with h5py.File(first, "r") as handle:
        assert handle.attrs["created_at"] == "2023-11-14T22:13:20Z"
        assert sum(len(handle[f"{s}/image"]) for s in ("train", "valid")) == 23


def test_without_source_date_epoch_only_created_at_differs(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    first = _build(_project(tmp_path / "a", make_raw, write_config), monkeypatch, None)
    # a build of another moment (SOURCE_DATE_EPOCH stands for it: no sleeping), two workers
    second = _build(_project(tmp_path / "b", make_raw, write_config), monkeypatch, "1800000000")
    with h5py.File(first, "r") as handle:
        stamp = handle.attrs["created_at"]
    made = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= made <= datetime.now(UTC)
    data, other = first.read_bytes(), second.read_bytes()
    assert data != other
    assert len(data) == len(other)
    assert data.count(stamp.encode()) == 1
    assert other.replace(b"2027-01-15T08:00:00Z", stamp.encode()) == data


@pytest.mark.parametrize(
    "compression",
    [
        pytest.param("gzip", id="gzip"),
        pytest.param({"codec": "blosc", "cname": "zstd"}, id="blosc-zstd"),
        pytest.param({"codec": "zstd"}, id="zstd"),
        pytest.param("none", id="none"),
    ],
)
def test_every_codec_is_reproducible(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    compression: Any,
) -> None:
    storage = {"chunk_samples": 2, "compression": compression}
    one = _project(tmp_path / "a", make_raw, write_config, storage=storage)
    two = _project(tmp_path / "b", make_raw, write_config, storage=storage)
    assert (
        _build(one, monkeypatch, EPOCH).read_bytes()
        == _build(two, monkeypatch, EPOCH, jobs=2).read_bytes()
    )


def test_no_object_in_a_release_has_a_timestamp(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HDF5 stamps objects with their creation second unless told not to (h5py before 3.15
    # did so on every track_order group, the root group included).
    path = _build(_project(tmp_path, make_raw, write_config), monkeypatch, None)
    names: list[str] = []
    with h5py.File(path, "r") as handle:
        handle.visit(names.append)
        for name in ["/", *names]:
            info = h5py.h5g.get_objinfo(handle.id, name.encode())
            assert info.mtime == 0, name


def test_timings_are_build_facts_beside_the_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _build(_project(tmp_path, make_raw, write_config), monkeypatch, EPOCH, jobs=2)
    with h5py.File(path, "r") as handle:
        diagnostics = dict(handle["diagnostics"].attrs)
        created = handle.attrs["created_at"]
    assert not [key for key in diagnostics if "second" in key]
    assert diagnostics["inputs"] == 23 * 2 + 2 * 2 + 1
    facts = json.loads(path.with_name("cells-v0001.build.json").read_text("utf-8"))
    assert facts["created_at"] == created == "2023-11-14T22:13:20Z"
    assert facts["built_at"] > "2026"  # the real clock, unlike created_at
    assert facts["jobs"] == 2
    assert {"discover", "decode_and_write", "finish", "workers_decode", "writer"} <= set(
        facts["seconds"]
    )
    assert all(value >= 0 for value in facts["seconds"].values())


def test_a_malformed_source_date_epoch_is_refused_before_any_work(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _project(tmp_path, make_raw, write_config)
    monkeypatch.setenv(clock.ENV, "yesterday")
    result = CliRunner().invoke(app, ["build", str(config), "--jobs", "1", "--quiet"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "h5etl: error: SOURCE_DATE_EPOCH: must be whole seconds since 1970-01-01 UTC, from 0 "
        "to 253402300799 (as `date +%s` prints), got 'yesterday'; unset it to stamp the "
        "build's own time (see docs/reference/config.md#SOURCE_DATE_EPOCH)"
    ]
    assert not (tmp_path / "releases").exists()


@given(st.integers(min_value=0, max_value=253402300799))
def test_any_epoch_in_range_is_its_second(seconds: int) -> None:
    moment = clock.source_date_epoch({clock.ENV: str(seconds)})
    assert moment is not None
    assert int(moment.timestamp()) == seconds
    stamp = clock.created_at(moment)
    assert len(stamp) == 20
    assert stamp.endswith("Z")
    assert datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) == moment


@given(
    st.one_of(
        st.integers(min_value=253402300800).map(str),
        st.integers(max_value=-1).map(str),
        st.text(min_size=1).filter(lambda t: t.strip() and not t.strip().isdigit()),
    )
)
def test_anything_else_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="SOURCE_DATE_EPOCH"):
        clock.source_date_epoch({clock.ENV: value})


def test_an_empty_source_date_epoch_is_unset() -> None:
    assert clock.source_date_epoch({clock.ENV: ""}) is None
    assert clock.source_date_epoch({}) is None


# --- the sink: every path to the file writes the same bytes ---------------------------------

CHUNK = 4
IMAGE = ChunkLayout((3, 5, 6), "uint8", (CHUNK, 3, 5, 6), Compression(codec="lzf"), True)
MASK = ChunkLayout((1, 5, 6), "uint8", (CHUNK, 1, 3, 6), Compression(codec="gzip"), True)
LAYOUT = SinkLayout(
    ("train",),
    {"image": ArrayColumn(IMAGE, 0), "mask": ArrayColumn(MASK, 0), "filename": TextColumn()},
    ("image", "mask"),
)


def _results(rows: int, sizes: list[int], *, encoded: bool) -> list[BatchResult]:
    """``rows`` random samples cut into results of ``sizes``; the last one is a final task's."""
    rng = np.random.default_rng(7)
    data = {
        name: rng.integers(0, 256, (rows, *lay.shape), np.uint8)
        for name, lay in (("image", IMAGE), ("mask", MASK))
    }
    out, start = [], 0
    for index, size in enumerate(sizes):
        final = index == len(sizes) - 1
        result = BatchResult(DecodeTask("train", start, (), CHUNK, CHUNK, final=final), size)
        for name, layout in (("image", IMAGE), ("mask", MASK)):
            part = data[name][start : start + size]
            result.columns[name] = EncodedRows(*encode_rows(layout, part)) if encoded else part
        result.keys = [f"s{start + i}" for i in range(size)]
        result.columns["filename"] = [f"{key}.png" for key in result.keys]
        result.lineage = [(f"{i:064x}", f"{i + 1:064x}") for i in range(start, start + size)]
        out.append(result)
        start += size
    return out


def _written(path: Path, results: list[BatchResult]) -> bytes:
    with Sink(path, LAYOUT) as sink:
        for result in results:
            sink.write(result)
        sink.finish({"name": "t"}, {"inputs": 1})
    return path.read_bytes()


def test_rows_a_crash_isolation_joined_are_stored_as_a_workers_chunks(tmp_path: Path) -> None:
    # A task whose worker died twice is decoded sample by sample and its rows come back raw;
    # the writer compresses them. It once re-cut them chunk by chunk in its carry buffer,
    # which stored the same data at other places in the file.
    sizes = [8, 8, 8, 5]
    encoded = _written(tmp_path / "encoded.h5", _results(29, sizes, encoded=True))
    raw = _written(tmp_path / "raw.h5", _results(29, sizes, encoded=False))
    assert raw == encoded


def test_small_rows_are_written_in_runs_of_the_row_count_alone(tmp_path: Path) -> None:
    # Text and lineage rows are appended in runs cut by row count, never by batch sizes or
    # checkpoint times (they were flushed at every checkpoint, on the clock).
    layout = SinkLayout(("train",), {"filename": TextColumn()}, ("image",))
    rows = 2 * small_columns.SMALL_ROWS_PER_WRITE + 12

    def written(path: Path, sizes: list[int], checkpoint_every: int) -> bytes:
        with Sink(path, layout) as sink:
            start = 0
            for index, size in enumerate(sizes):
                task = DecodeTask("train", start, (), CHUNK, CHUNK, final=index == len(sizes) - 1)
                result = BatchResult(task, size)
                result.keys = [f"s{i}" for i in range(start, start + size)]
                result.columns["filename"] = [f"{key}.png" for key in result.keys]
                result.lineage = [(f"{i:064x}",) for i in range(start, start + size)]
                sink.write(result)
                if index % checkpoint_every == 0:
                    sink.checkpoint()
                start += size
            sink.finish({"name": "t"}, {"inputs": 1})
        return path.read_bytes()

    one = written(tmp_path / "one.h5", [rows - 4, 4], checkpoint_every=1)
    many = [100] * (rows // 100) + [rows % 100]
    other = written(tmp_path / "many.h5", many, checkpoint_every=3)
    with h5py.File(tmp_path / "many.h5", "r") as handle:
        names = [v.decode() for v in handle["train/filename"][...]]
    assert names == [f"s{i}.png" for i in range(rows)]
    assert one == other


# A build that checkpoints after every 5th batch only (a checkpoint then spans batches of
# both splits, as one every two seconds does) and SIGKILLs itself after ``after`` samples.
KILLED_SPARSE = """
    import os, signal, sys
    import h5etl, h5etl.resume.journal_use, h5etl.sink.small_columns, h5etl.plan.tasks
    h5etl.plan.tasks.TASK_SAMPLES = 2
    h5etl.sink.small_columns.SMALL_ROWS_PER_WRITE = int(sys.argv[3])
    config, after = sys.argv[1], int(sys.argv[2])
    original = h5etl.resume.journal_use.Checkpoints.maybe_write
    calls = 0
    def sparse(self, sink):
        global calls
        calls += 1
        if calls % 5 == 0:
            original(self, sink)
    h5etl.resume.journal_use.Checkpoints.maybe_write = sparse
    seen = 0
    def hook(stage, advance, total):
        global seen
        if stage == "decode+write" and total is None:
            seen += advance
            if seen >= after:
                os.kill(os.getpid(), signal.SIGKILL)
    h5etl.build(h5etl.load_spec(config), jobs=1, progress=hook, checkpoint_seconds=0)
"""


@pytest.mark.parametrize("after", [17, 21])
def test_a_resumed_build_is_the_same_file(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    after: int,
) -> None:
    # Small-row runs of 4 rows, so that several come before the kill and must be replayed
    # between the same chunks; the journal lists chunks in write order across datasets.
    monkeypatch.setattr(h5etl.plan.tasks, "TASK_SAMPLES", 2)  # as the killed build cuts its tasks
    monkeypatch.setattr(small_columns, "SMALL_ROWS_PER_WRITE", 4)
    monkeypatch.setenv(clock.ENV, EPOCH)  # the killed build inherits it
    reference = _build(_project(tmp_path / "ref", make_raw, write_config), monkeypatch, EPOCH)
    config = _project(tmp_path / "killed", make_raw, write_config)
    script = textwrap.dedent(KILLED_SPARSE)
    killed = subprocess.run(
        [sys.executable, "-c", script, str(config), str(after), "4"], check=False
    )
    assert killed.returncode == -signal.SIGKILL
    resumed = h5etl.build(h5etl.load_spec(config), resume=True)
    assert resumed.path is not None
    assert resumed.resumed > 0
    assert resumed.path.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("example", ["classification", "metadata", "vibration"])
def test_examples_build_the_same_bytes_in_other_processes(tmp_path: Path, example: str) -> None:
    # Two CLI processes of other hash seeds (set and dict orders), --jobs 1 and 2, folders:
    # labels and class names, tables and sidecars (every example does: README).
    files = []
    for seed, jobs in (("1", "1"), ("2", "2")):
        env = {**os.environ, clock.ENV: EPOCH, "PYTHONHASHSEED": seed}
        folder = tmp_path / f"{example}-{seed}"
        command = ["demo", "--example", example, "--dir", str(folder), "--jobs", jobs, "--quiet"]
        done = subprocess.run(
            [sys.executable, "-m", "h5etl", *command],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        (release,) = (folder / "releases").glob("*-v0001.h5")
        files.append(release.read_bytes())
    assert files[0] == files[1]
