"""A split's first carried run copied with its datasets (HDF5's object copy), not chunk by chunk."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import WriteConfig, add_pairs
from test_incremental import no_seed, project, remove_pairs, rows_by_key, stats_attrs

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.incremental import reuse
from h5etl.sink import parent_rows

ARRAYS = ("image", "mask")
LZF = Codec("lzf", None, "", "none")


def stored_chunks(path: Path) -> dict[str, list[tuple[tuple[int, ...], int, bytes]]]:
    """Every array dataset's chunks as HDF5 stores them: offset, filter mask, bytes."""
    out = {}
    with h5py.File(path, "r") as handle:
        for split in (s for s in handle if s != "diagnostics"):
            for name in ARRAYS:
                dataset = handle[f"{split}/{name}"]
                offsets = [
                    tuple(dataset.id.get_chunk_info(i).chunk_offset)
                    for i in range(dataset.id.get_num_chunks())
                ]
                out[f"{split}/{name}"] = [
                    (offset, *dataset.id.read_direct_chunk(offset)) for offset in sorted(offsets)
                ]
                # every chunk lies inside the dataset: none left of the parent's cut rows
                assert all(o[0] < dataset.shape[0] for o in offsets)
    return out


def digests(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as handle:
        nodes = handle["diagnostics/datasets"]
        return {
            n: (str(nodes[n].attrs["sha256"]), nodes[n]["block_sha256"][...].tolist())
            for n in nodes
        }


def seeded_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The datasets the next builds create as copies (path, rows), as they are made."""
    calls: list[tuple[str, int]] = []
    real = parent_rows.seed_dataset

    def spy(file: h5py.File, source: h5py.File, path: str, rows: int, chunked: ChunkLayout) -> Any:
        dataset = real(file, source, path, rows, chunked)
        if dataset is not None:
            calls.append((path, rows))
        return dataset

    monkeypatch.setattr("h5etl.sink.writer.seed_dataset", spy)
    return calls


def change_added(root: Path) -> None:
    add_pairs(root, [f"new{i:02d}" for i in range(5)], seed=7)


def change_first_block(root: Path) -> None:
    add_pairs(root, ["s000"], seed=11)  # other pixels for a sample of a first block


def change_middle(root: Path) -> None:
    remove_pairs(root, ["s020"])


@pytest.mark.parametrize(
    ("change", "copies"),
    [
        # each split's last, partial block is decoded again (new samples follow it): the
        # copy of each whole dataset is cut before it
        pytest.param(change_added, {"train", "valid"}, id="samples-added"),
        # the split holding s000 has no first run from row 0: chunk by chunk there
        pytest.param(change_first_block, "one", id="first-block-changed"),
        pytest.param(change_middle, "one", id="middle-sample-removed"),
    ],
)
def test_a_dataset_copy_holds_the_chunks_a_loop_would(
    tmp_path: Path,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    change: Any,
    copies: Any,
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    config = load_spec(project(tmp_path, write_config, n=41))
    first = build(config)
    assert first.path is not None
    parent = tmp_path / "parent-releases"
    shutil.copytree(tmp_path / "releases", parent, symlinks=True)
    change(tmp_path)
    calls = seeded_calls(monkeypatch)
    built: dict[str, tuple[Any, ...]] = {}
    for way in ("copy", "copy again", "loop"):
        shutil.rmtree(tmp_path / "releases")
        shutil.copytree(parent, tmp_path / "releases", symlinks=True)
        if way == "loop":
            monkeypatch.setattr(reuse.CarryPlan, "seed", no_seed)
        calls.clear()
        report = build(config)
        assert report.path is not None
        assert report.reused > 0
        assert check_release(report.path, deep=True).ok
        built[way] = (report, report.path.read_bytes(), stored_chunks(report.path))
        built[way] += (digests(report.path), stats_attrs(report.path), rows_by_key(report.path))
        seeded_splits = {path.strip("/").split("/")[0] for path, _ in calls}
        if way == "loop":
            assert calls == []
        elif copies == "one":
            assert len(seeded_splits) == 1
        else:
            assert seeded_splits == copies
            assert sorted(p for p, _ in calls) == sorted(
                f"/{s}/{n}" for s in copies for n in ARRAYS
            )
    # the same inputs: the same bytes (SOURCE_DATE_EPOCH), copied with the datasets or not
    assert built["copy"][1] == built["copy again"][1]
    copy, loop = built["copy"], built["loop"]
    assert copy[0].reused == loop[0].reused
    assert copy[0].reused_bytes == loop[0].reused_bytes
    assert copy[2] == loop[2]  # every stored chunk: offset, filter mask, bytes
    assert copy[3:] == loop[3:]  # dataset and block digests, statistics, rows
    # the carried chunks are the parent's, byte for byte (a block of 4 rows: one chunk each)
    parent_chunks = stored_chunks(first.path)
    for name in ARRAYS:
        found = 0
        for split in ("train", "valid"):
            theirs = {(mask, data) for _, mask, data in parent_chunks[f"{split}/{name}"]}
            found += sum((mask, data) in theirs for _, mask, data in copy[2][f"{split}/{name}"])
        assert found >= copy[0].reused // 4


def test_a_copied_release_opens_in_the_hdf5_tools(
    tmp_path: Path, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HDF5 1.10's h5ls/h5dump read a release whose datasets are object copies (DESIGN.md)
    h5dump = shutil.which("h5dump")
    if h5dump is None:
        pytest.skip("h5dump is not installed")
    config = load_spec(project(tmp_path, write_config, n=12))
    build(config)
    change_added(tmp_path)
    calls = seeded_calls(monkeypatch)
    report = build(config)
    assert report.path is not None
    assert calls
    shown = subprocess.run(
        [h5dump, "-d", "/train/image", "-s", "0,0,0,0", "-c", "1,1,1,4", str(report.path)],
        capture_output=True,
        text=True,
        check=True,
    )
    with h5py.File(report.path, "r") as handle:
        first = handle["train/image"][0, 0, 0, :4]
    assert " ".join(f"{int(v)}" for v in first) in " ".join(shown.stdout.replace(",", " ").split())


def make_parent(path: Path, **create: Any) -> None:
    with h5py.File(path, "w", libver=("v110", "v110")) as handle:
        data = np.arange(10 * 2 * 3, dtype=np.uint8).reshape(10, 2, 3)
        handle.create_dataset(
            "train/image", data=data, maxshape=(None, 2, 3), **{"chunks": (4, 2, 3), **create}
        )


@pytest.mark.parametrize(
    "create",
    [
        pytest.param({"compression": "gzip"}, id="another-codec"),
        pytest.param({"chunks": (2, 2, 3), "compression": "lzf"}, id="other-chunks"),
        pytest.param({"compression": "lzf", "shuffle": True}, id="a-shuffle-more"),
    ],
)
def test_a_dataset_stored_otherwise_is_not_copied(tmp_path: Path, create: dict[str, Any]) -> None:
    make_parent(tmp_path / "parent.h5", **create)
    layout = ChunkLayout((2, 3), "uint8", (4, 2, 3), LZF, shuffle=False)
    with (
        h5py.File(tmp_path / "parent.h5", "r") as source,
        h5py.File(tmp_path / "new.h5", "w", libver=("v110", "v110")) as file,
    ):
        assert parent_rows.seed_dataset(file, source, "/train/image", 8, layout) is None
        assert "train/image" not in file
        assert parent_rows.seed_dataset(file, source, "/train/other", 8, layout) is None


def test_a_dataset_copy_is_cut_to_its_rows(tmp_path: Path) -> None:
    make_parent(tmp_path / "parent.h5", compression="lzf")
    layout = ChunkLayout((2, 3), "uint8", (4, 2, 3), LZF, shuffle=False)
    with (
        h5py.File(tmp_path / "parent.h5", "r") as source,
        h5py.File(tmp_path / "new.h5", "w", libver=("v110", "v110")) as file,
    ):
        copied = parent_rows.seed_dataset(file, source, "/train/image", 8, layout)
        assert copied is not None
        assert copied.shape == (8, 2, 3)
        assert copied.id.get_num_chunks() == 2
        assert dict(copied.attrs) == {}
        for row in (0, 4):
            offset = (row, 0, 0)
            assert copied.id.read_direct_chunk(offset) == source[
                "train/image"
            ].id.read_direct_chunk(offset)
        np.testing.assert_array_equal(copied[...], source["train/image"][:8])
