"""Incremental builds: unchanged samples' chunks carried byte for byte from the parent release."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import WriteConfig, add_pairs, random_pair, save

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.history.build_report import BuildReport
from h5etl.testing import run_killed_build

CODECS = ["lzf", "gzip", {"codec": "blosc", "cname": "lz4"}, "zstd"]
FIELDS = ("image", "mask", "filename")


def remove_pairs(root: Path, keys: list[str]) -> None:
    for key in keys:
        (root / "raw" / "images" / f"{key}.png").unlink()
        (root / "raw" / "masks" / f"{key}.png").unlink()


def rows_by_key(path: Path) -> dict[str, tuple[str, int]]:
    out = {}
    with h5py.File(path, "r") as handle:
        for split in (s for s in handle if s != "diagnostics"):
            for row, key in enumerate(handle[f"{split}/sample_key"].asstr()[...]):
                out[str(key)] = (split, row)
    return out


def samples_by_key(path: Path) -> dict[str, dict[str, Any]]:
    """Every stored row, by sample key: each field's value and the lineage."""
    where = rows_by_key(path)
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as handle:
        for key, (split, row) in where.items():
            out[key] = {
                "split": split,
                "image": handle[f"{split}/image"][row],
                "mask": handle[f"{split}/mask"][row],
                "filename": handle[f"{split}/filename"].asstr()[row],
                "lineage": [h.decode() for h in handle[f"{split}/source_sha256"][row]],
            }
    return out


def stats_attrs(path: Path) -> dict[str, dict[str, list[float]]]:
    out = {}
    with h5py.File(path, "r") as handle:
        for split in (s for s in handle if s != "diagnostics"):
            for name in ("image", "mask"):
                attrs = handle[f"{split}/{name}"].attrs
                out[f"{split}/{name}"] = {
                    k: np.asarray(attrs[k]).tolist() for k in attrs if k not in ("kind",)
                }
    return out


def assert_same_samples(one: Path, two: Path) -> None:
    a, b = samples_by_key(one), samples_by_key(two)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key]["split"] == b[key]["split"], key
        for name in ("image", "mask"):
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=key)
        assert a[key]["filename"] == b[key]["filename"]
        assert a[key]["lineage"] == b[key]["lineage"]


def parent_facts(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as handle:
        facts: dict[str, Any] = json.loads(handle.attrs["parent"])
        return facts


def no_seed(self: Any) -> Any:
    """``CarryPlan.seed`` that copies every run chunk by chunk (no dataset copy)."""
    from h5etl.sink.parent_rows import Seed

    return Seed(self.parent.path, {})


def project(tmp_path: Path, write_config: WriteConfig, n: int = 40, **overrides: Any) -> Path:
    add_pairs(tmp_path, [f"s{i:03d}" for i in range(n)])
    return write_config(tmp_path, storage={"chunk_samples": 4, **overrides})


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="one-chunk-rows"),
        pytest.param({"mask": {"chunks": [2, 1, 24, 24]}}, id="mask-chunks-of-2"),
    ],
)
def test_rebuilding_unchanged_inputs_carries_every_sample(
    tmp_path: Path, write_config: WriteConfig, fields: dict[str, Any]
) -> None:
    # 41 samples: each split ends in a partial block, carried too (nothing follows it)
    add_pairs(tmp_path, [f"s{i:03d}" for i in range(41)])
    config = load_spec(write_config(tmp_path, storage={"chunk_samples": 4}, fields=fields))
    first = build(config)
    # the same inputs alone are up to date (test_uptodate.py); new notes make a new release
    second = build(config.model_copy(update={"notes": "the same samples, new notes"}))
    assert first.path is not None
    assert second.path is not None
    assert second.reused == 41
    assert second.seconds.get("decode_and_write", 0) < 1  # nothing was decoded
    with h5py.File(first.path, "r") as one, h5py.File(second.path, "r") as two:
        digests = {
            n: dict(one["diagnostics/datasets"][n].attrs) for n in one["diagnostics/datasets"]
        }
        again = {n: dict(two["diagnostics/datasets"][n].attrs) for n in two["diagnostics/datasets"]}
        assert {n: d["sha256"] for n, d in digests.items()} == {
            n: d["sha256"] for n, d in again.items()
        }
        assert one.attrs["source_fingerprint"] == two.attrs["source_fingerprint"]
    assert stats_attrs(first.path) == stats_attrs(second.path)
    facts = parent_facts(second.path)
    assert facts["version"] == 1
    assert facts["samples_reused"] == 41
    assert facts["samples_decoded"] == 0
    assert facts["bytes_reused"] == second.reused_bytes > 0
    assert check_release(second.path, deep=True).ok


@pytest.mark.parametrize("codec", CODECS, ids=["lzf", "gzip", "blosc", "zstd"])
def test_carried_chunks_are_the_parents_bytes_and_equal_a_full_decode(
    tmp_path: Path, write_config: WriteConfig, codec: Any
) -> None:
    config = load_spec(project(tmp_path, write_config, compression=codec))
    first = build(config)
    assert first.path is not None
    parent_rows = rows_by_key(first.path)
    add_pairs(tmp_path, [f"new{i:02d}" for i in range(7)], seed=9)
    second = build(config)
    assert second.path is not None
    assert 0 < second.reused < 47
    child_rows = rows_by_key(second.path)
    carried = 0
    with h5py.File(first.path, "r") as one, h5py.File(second.path, "r") as two:
        for key, (split, row) in parent_rows.items():
            assert child_rows[key][0] == split  # sticky
            if child_rows[key][1] != row:
                continue  # re-decoded (its block was the split's last, partial one)
            carried += 1
            for name in ("image", "mask"):
                old, new = one[f"{split}/{name}"], two[f"{split}/{name}"]
                assert old.compression == new.compression
                assert old.compression_opts == new.compression_opts
                assert old._filters == new._filters
                offset = (row - row % 4, 0, 0, 0)
                assert old.id.read_direct_chunk(offset) == new.id.read_direct_chunk(offset)
    assert carried == second.reused
    # the same inputs decoded from scratch give the very same samples (another folder)
    fresh_root = tmp_path / "fresh"
    shutil.copytree(tmp_path / "raw", fresh_root / "raw")
    fresh = build(
        load_spec(write_config(fresh_root, storage={"chunk_samples": 4, "compression": codec}))
    )
    assert fresh.path is not None
    # the fresh build splits its 47 samples anew; compare the samples, not the split
    a, b = samples_by_key(second.path), samples_by_key(fresh.path)
    assert a.keys() == b.keys()
    for key in a:
        for name in ("image", "mask", "filename", "lineage"):
            np.testing.assert_array_equal(a[key][name], b[key][name], err_msg=key)
        paths = [tmp_path / "raw" / d / f"{key}.png" for d in ("images", "masks")]
        assert a[key]["lineage"] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert check_release(second.path, deep=True).ok


def test_statistics_of_an_incremental_release_equal_a_full_builds(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    config = load_spec(project(tmp_path, write_config))
    build(config)
    add_pairs(tmp_path, [f"new{i:02d}" for i in range(9)], seed=3)
    remove_pairs(tmp_path, ["s003", "s017"])
    incremental = build(config)
    full = build(config, full=True)  # same splits (sticky), every sample decoded
    assert incremental.path is not None
    assert full.path is not None
    assert incremental.reused > 0
    assert full.reused == 0
    assert stats_attrs(incremental.path) == stats_attrs(full.path)
    assert_same_samples(incremental.path, full.path)
    with h5py.File(full.path, "r") as handle:
        assert "parent" not in handle.attrs


def test_a_sample_never_changes_split_across_five_incremental_releases(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    config = load_spec(project(tmp_path, write_config, n=30))
    report = build(config)
    assert report.path is not None
    history = [rows_by_key(report.path)]
    for release in range(2, 7):
        add_pairs(tmp_path, [f"r{release}-{i}" for i in range(release)], seed=release)
        remove_pairs(tmp_path, [sorted(history[-1])[release * 3]])
        report = build(config)
        assert report.path is not None
        assert report.reused > 0
        assert parent_facts(report.path)["version"] == release - 1
        now = rows_by_key(report.path)
        for key, (split, _) in now.items():
            for earlier in history:
                if key in earlier:
                    assert earlier[key][0] == split
        assert check_release(report.path, deep=True).ok
        history.append(now)


def test_a_withdrawn_patient_disappears_and_nothing_else_moves(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    add_pairs(tmp_path, [f"pt{p:02d}_{i}" for p in range(10) for i in range(4)])
    splits = {"train": 0.8, "valid": 0.2, "group_by": r"^(pt\d+)_"}
    config = load_spec(write_config(tmp_path, splits=splits, storage={"chunk_samples": 4}))
    first = build(config)
    assert first.path is not None
    before = samples_by_key(first.path)
    remove_pairs(tmp_path, [f"pt04_{i}" for i in range(4)])
    second = build(config)
    assert second.path is not None
    after = samples_by_key(second.path)
    assert set(after) == {k for k in before if not k.startswith("pt04_")}
    for key, sample in after.items():
        assert sample["split"] == before[key]["split"]
        np.testing.assert_array_equal(sample["image"], before[key]["image"])
    assert 0 < second.reused < 36
    assert check_release(second.path, deep=True).ok


def test_changed_and_touched_files(tmp_path: Path, write_config: WriteConfig) -> None:
    config = load_spec(project(tmp_path, write_config))
    first = build(config)
    assert first.path is not None
    where = rows_by_key(first.path)
    # s010 gets other pixels; s020 only a new mtime (its bytes are the same: still carried)
    rng = np.random.default_rng(77)
    image, mask = random_pair(rng, (9, 9))
    save(tmp_path / "raw" / "images" / "s010.png", image)
    save(tmp_path / "raw" / "masks" / "s010.png", mask)
    touched = tmp_path / "raw" / "masks" / "s020.png"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    second = build(config)
    assert second.path is not None
    now = samples_by_key(second.path)
    assert (
        now["s010"]["lineage"][0]
        == hashlib.sha256((tmp_path / "raw" / "images" / "s010.png").read_bytes()).hexdigest()
    )
    expected = np.zeros((3, 24, 24), np.uint8)
    top, left = (24 - 9) // 2, (24 - 9) // 2
    expected[:, top : top + 9, left : left + 9] = image.transpose(2, 0, 1)
    np.testing.assert_array_equal(now["s010"]["image"], expected)
    # s020's block was carried unless it shares the changed sample's block
    block_of = {k: (s, r // 4) for k, (s, r) in where.items()}
    if block_of["s020"] != block_of["s010"]:
        assert rows_by_key(second.path)["s020"] == where["s020"]
    assert check_release(second.path, deep=True).ok


def test_another_layout_decodes_everything_and_says_why(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    path = project(tmp_path, write_config)
    build(load_spec(path))
    changed = build(load_spec(write_config(tmp_path, storage={"chunk_samples": 8})))
    assert changed.reused == 0
    assert any("every sample decoded" in w for w in changed.warnings)
    same_bytes = build(
        load_spec(write_config(tmp_path, storage={"chunk_samples": 8}, description="x"))
    )
    assert same_bytes.reused == 40  # a description changes no stored byte


def test_kill_9_during_an_incremental_build_leaves_the_release_and_link(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    path = project(tmp_path, write_config, n=24)
    first = build(load_spec(path))
    assert first.path is not None
    link = tmp_path / "releases" / "cells.h5"
    before = (os.readlink(link), first.path.read_bytes())
    add_pairs(tmp_path, [f"new{i:02d}" for i in range(12)], seed=5)
    assert run_killed_build(path, 4) == -signal.SIGKILL
    assert (os.readlink(link), first.path.read_bytes()) == before
    assert sorted(p.name for p in (tmp_path / "releases").glob("cells-v*.h5")) == ["cells-v0001.h5"]
    # its journal names the parent: --resume does not adopt it, the build carries again
    after: BuildReport = build(load_spec(path), resume=True)
    assert after.version == 2
    assert after.resumed == 0
    assert after.reused > 0
    assert after.path is not None
    assert check_release(after.path, deep=True).ok


def test_a_changed_table_cell_is_decoded_again(tmp_path: Path, write_config: WriteConfig) -> None:
    # the files are unchanged, but the value the table gives the sample is not
    add_pairs(tmp_path, [f"s{i:03d}" for i in range(16)])
    table = tmp_path / "meta.csv"
    table.write_text("file,site\n" + "".join(f"s{i:03d}.png,a{i}\n" for i in range(16)))
    ref = {"table": str(table), "key": "file", "column": "site"}
    config = write_config(
        tmp_path, storage={"chunk_samples": 4}, fields={"site": {"kind": "text", "from": ref}}
    )
    build(load_spec(config))
    table.write_text(table.read_text().replace("s005.png,a5", "s005.png,moved"))
    report = build(load_spec(config))
    assert report.path is not None
    assert 0 < report.reused < 16
    where = rows_by_key(report.path)
    with h5py.File(report.path, "r") as handle:
        sites = {key: handle[f"{split}/site"].asstr()[row] for key, (split, row) in where.items()}
    assert sites == {f"s{i:03d}": "moved" if i == 5 else f"a{i}" for i in range(16)}


def test_copying_the_chunks_in_pieces_writes_the_file_of_one_copy(
    tmp_path: Path, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a large parent is copied a piece at a time, fsynced between the pieces: the same chunks
    # in the same order, so the very same bytes as copied in one go (by the chunk loop: no
    # run is copied with its dataset here, see test_a_dataset_copy_holds_the_chunks_a_loop_would)
    from h5etl.incremental import reuse
    from h5etl.resume import journal_use as resume
    from h5etl.sink import parent_rows as parent_rows_module

    monkeypatch.setattr(reuse.CarryPlan, "seed", no_seed)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    config = load_spec(project(tmp_path, write_config))
    build(config)
    parent = tmp_path / "parent-releases"
    shutil.copytree(tmp_path / "releases", parent, symlinks=True)
    add_pairs(tmp_path, [f"new{i:02d}" for i in range(5)], seed=4)
    synced: list[int] = []
    real = resume.Checkpoints.sync_soon

    def counted(self: resume.Checkpoints, sink: Any) -> None:
        synced.append(1)
        real(self, sink)

    monkeypatch.setattr(resume.Checkpoints, "sync_soon", counted)
    files = []
    for piece in (10**9, 4):
        shutil.rmtree(tmp_path / "releases")
        shutil.copytree(parent, tmp_path / "releases", symlinks=True)
        monkeypatch.setattr(parent_rows_module, "PIECE_ROWS", piece)
        synced.clear()
        report = build(config)
        assert report.path is not None
        assert report.reused > 8
        # once per split and field in one go (and after the copy); per piece of 4 rows
        if piece > 4:
            assert len(synced) == 5
        else:
            assert len(synced) >= report.reused // 4 * 2
        files.append(report.path.read_bytes())
        assert check_release(report.path, deep=True).ok
    assert files[0] == files[1]


def test_the_parents_bytes_are_asked_for_once_a_build_will_copy_them(
    tmp_path: Path, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h5etl.sink import disk as sink_disk

    asked: list[Path] = []
    monkeypatch.setattr(sink_disk, "prefetch", asked.append)
    config = load_spec(project(tmp_path, write_config, n=12))
    first = build(config)
    assert asked == []  # no parent
    assert build(config).up_to_date
    assert asked == []  # up to date: nothing is copied, nothing read ahead
    add_pairs(tmp_path, ["new00"], seed=5)
    second = build(config)
    assert second.reused > 0
    assert asked == [first.path]  # once (at discovery: one sample more than the parent's)
    third = build(config.model_copy(update={"notes": "the same again"}))
    assert third.reused == 13
    assert asked == [first.path, second.path]  # after the up-to-date check said no
