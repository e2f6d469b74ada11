"""Sharded builds of ragged columns (volumes, series, a test kind of 5-row value chunks):
K = 2 shard writers and the stitch give the one-writer release, dataset for dataset.

A ragged column's values run on across shards, so a shard's values land anywhere in the
release's chunk grid: where the grids line up (a volume: one slice a chunk) every chunk is
copied as the shard stored it; elsewhere the values are re-cut. Expectations come from the
local build and from h5py reads, never from the stitch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import dataset_digests, read_release
from ragged_kind import use_npy_recording
from test_kind_series import LENGTHS, make_recordings, series_config
from test_kind_volume import ct_config, make_ct
from test_ragged import make_recordings as make_npy_recordings
from test_ragged import prelude

from h5etl.check.health import check_release
from h5etl.config.load import load_spec
from h5etl.format import contract as fileformat
from h5etl.history.build_report import BuildReport
from h5etl.pipeline import run as pipeline
from h5etl.plan import tasks
from h5etl.testing.kill import KILLED_BUILD, KILLED_TASK_SAMPLES


def _path(report: BuildReport) -> Path:
    assert report.path is not None
    return report.path


def _raw_chunks(path: Path) -> dict[str, list[tuple[tuple[int, ...], bytes]]]:
    """Every chunked dataset's stored chunks (offset, bytes), read with read_direct_chunk."""
    out: dict[str, list[tuple[tuple[int, ...], bytes]]] = {}
    with h5py.File(path, "r") as handle:

        def visit(name: str, node: object) -> None:
            if isinstance(node, h5py.Dataset) and node.chunks and node.compression:
                dataset_id = node.id
                offsets = sorted(
                    tuple(dataset_id.get_chunk_info(i).chunk_offset)
                    for i in range(dataset_id.get_num_chunks())
                )
                out[name] = [(o, dataset_id.read_direct_chunk(o)[1]) for o in offsets]

        handle.visititems(visit)
    return out


def _same_release(local: Path, sharded: Path) -> None:
    """The same datasets, rows, order and per-dataset SHA-256 (data and statistics)."""
    assert dataset_digests(local) == dataset_digests(sharded)
    mine, theirs = read_release(local), read_release(sharded)
    assert mine.keys() == theirs.keys()
    for name, rows in mine.items():
        np.testing.assert_array_equal(theirs[name], rows, err_msg=name)
    with h5py.File(local) as a, h5py.File(sharded) as b:
        assert a.attrs["source_fingerprint"] == b.attrs["source_fingerprint"]
        for name in mine:
            for key, value in a[name].attrs.items():
                np.testing.assert_array_equal(b[name].attrs[key], value, err_msg=f"{name} {key}")
    assert check_release(sharded, deep=True).ok


def _sha256_per_dataset(path: Path) -> dict[str, str]:
    """SHA-256 of each dataset's uncompressed bytes (numpy), independent of the product."""
    return {
        name: hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
        for name, rows in read_release(path).items()
        if rows.dtype.kind != "U"
    }


def test_sharded_volumes_copy_every_chunk_of_their_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 1)  # a task a case: each shard gets several
    make_ct(tmp_path, cases=8)
    spec = load_spec(ct_config(tmp_path))
    local = pipeline.build(spec, jobs=1)
    sharded = pipeline.build(spec, jobs=2, shards=2)
    assert sharded.shards == 2
    _same_release(_path(local), _path(sharded))
    assert _sha256_per_dataset(_path(local)) == _sha256_per_dataset(_path(sharded))
    # one slice a chunk: every case starts a chunk, so nothing was re-cut, and each stored
    # chunk is the one a worker compressed (the local build's, byte for byte)
    assert not any(n for key, n in sharded.chunk_paths.items() if "rechunked" in key)
    assert any(n for key, n in sharded.chunk_paths.items() if key.endswith("/ct:copied"))
    assert _raw_chunks(_path(local)) == _raw_chunks(_path(sharded))


def test_sharded_series_are_the_one_writer_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 1)
    make_recordings(tmp_path, {**LENGTHS, "g": 7, "h": 2, "i": 5})
    spec = load_spec(series_config(tmp_path, field={"chunk_rows": 16}))
    local = pipeline.build(spec, jobs=1)
    sharded = pipeline.build(spec, jobs=2, shards=2)
    _same_release(_path(local), _path(sharded))
    assert _sha256_per_dataset(_path(local)) == _sha256_per_dataset(_path(sharded))
    assert _raw_chunks(_path(local)) == _raw_chunks(_path(sharded))


def test_ragged_values_misaligned_across_shards_are_re_cut_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 value rows a chunk, lengths 0..22: the second shard's values start mid-chunk
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    truth = make_npy_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    spec = load_spec(tmp_path / "config.yaml")
    local = pipeline.build(spec, jobs=1)
    sharded = pipeline.build(spec, jobs=2, shards=2)
    _same_release(_path(local), _path(sharded))
    with h5py.File(_path(sharded)) as handle:
        layout = fileformat.read_layout(handle)
        for split in layout.splits:
            names = handle[layout.path(split, "filename")].asstr()[...]
            values = handle[layout.path(split, "rec")][...]
            offsets = handle[fileformat.offsets_path(layout.path(split, "rec"))][...]
            for i, name in enumerate(names):
                got = values[offsets[i] : offsets[i + 1]]
                np.testing.assert_array_equal(got, truth[Path(name).name], err_msg=name)
    assert [r.path for r in sharded.rejects] == [r.path for r in local.rejects]


def test_a_ragged_stitch_killed_in_the_tail_resumes_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # killed right after the stitch: its journal holds the ragged values between chunks
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    make_npy_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    spec = load_spec(tmp_path / "config.yaml")
    local = pipeline.build(spec, jobs=1)
    script = prelude(5) + textwrap.dedent(KILLED_BUILD).replace(
        "jobs=jobs,", "jobs=jobs, shards=2,"
    )
    log, tasks_arg = tmp_path / "killed.log", str(KILLED_TASK_SAMPLES)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "config.yaml"), "1", "2", tasks_arg],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            assert proc.wait(timeout=120) == -signal.SIGKILL, log.read_text()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its shard writers and workers
    journals = list((tmp_path / "releases").glob("*.journal"))
    deltas = [json.loads(line) for line in journals[0].read_text("utf-8").splitlines()[1:]]
    assert any(c["carry_rows"] for d in deltas for c in d.get("ragged", {}).values())
    resumed = pipeline.build(spec, jobs=2, shards=2, resume=True)
    assert resumed.resumed > 0
    _same_release(_path(local), _path(resumed))


def _damage(shard: Path, how: str) -> None:
    """Change a committed shard's ragged column behind its manifest's back."""
    with h5py.File(shard, "r+") as handle:
        if how == "offsets":
            offsets = handle["train/rec_offsets"]
            offsets[1] = offsets[1] + 1
        else:  # a chunk's bytes: other values, compressed alike
            values = handle["train/rec"]
            mask, _ = values.id.read_direct_chunk((0, 0))
            other = np.full(values.chunks, 7, dtype=values.dtype)
            with h5py.File(shard.with_suffix(".scratch"), "w") as scratch:
                kwargs = {"compression": values.compression, "shuffle": values.shuffle}
                made = scratch.create_dataset("x", data=other, chunks=values.chunks, **kwargs)
                _, data = made.id.read_direct_chunk((0, 0))
            values.id.write_direct_chunk((0, 0), data, mask)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("offsets", r"the rows of /train/rec_offsets do not match their recorded digest"),
        ("chunk", r"chunk \[0, 0\] of /train/rec does not match its digest"),
    ],
)
def test_a_damaged_ragged_shard_fails_the_stitch_and_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, said: str
) -> None:
    from h5etl.errors import ShardError
    from h5etl.sink import chunk_copy

    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    make_npy_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    spec = load_spec(tmp_path / "config.yaml")
    local = pipeline.build(spec, jobs=1)
    original = chunk_copy.carry_shard
    damaged: list[Path] = []

    def carry(sink: object, shard: Path, *args: object, **kwargs: object) -> int:
        if not damaged:
            _damage(shard, how)
            damaged.append(shard)
        return original(sink, shard, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(chunk_copy, "carry_shard", carry)  # as sharded looks it up
    with pytest.raises(ShardError, match=f"{said}; its commit was withdrawn") as failed:
        pipeline.build(spec, jobs=2, shards=2)
    assert failed.value.path == damaged[0]
    assert "\n" not in str(failed.value)
    releases = tmp_path / "releases"
    assert sorted(p.name for p in releases.glob("rec-v*.h5")) == ["rec-v0001.h5"]
    assert (releases / "rec.h5").resolve() == _path(local).resolve()
    assert not damaged[0].with_suffix(".manifest").exists()
    monkeypatch.setattr(chunk_copy, "carry_shard", original)
    resumed = pipeline.build(spec, jobs=2, shards=2, resume=True)
    assert resumed.shards_reused == 1  # the other shard; the damaged one is written again
    _same_release(_path(local), _path(resumed))
