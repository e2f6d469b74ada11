"""The part files of a virtual release (``build --shards K --vds``): ``check`` names a part
that is missing or damaged, the readers refuse to read zeros for it, and ``prune`` deletes a
release's parts with it, never one a release that stays maps, and says what it freed.

Real sharded builds (shard writer processes) of tiny PNG folders, made once per module;
each test works on its own copy of the output folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from h5etl import load_spec
from h5etl.cli.app import app
from h5etl.errors import ReaderError
from h5etl.pipeline import run as pipeline
from h5etl.plan import tasks
from h5etl.readers import Release
from h5etl.units import human_size


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """releases/ with cells v0001-v0003, each a virtual release over 3 parts (2 shards and
    the tail), a new pair added before each build; the link at v0003."""
    from conftest import _make_raw, _write_config, add_pairs

    root = tmp_path_factory.mktemp("parts")
    _make_raw(root, n=20)
    spec = load_spec(_write_config(root))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tasks, "TASK_SAMPLES", 4)  # a few tasks per shard: every part has rows
        for version in range(1, 4):
            add_pairs(root, [f"new{version}"], seed=version)
            report = pipeline.build(spec, jobs=2, shards=2, virtual=True)
            assert report.path is not None
            assert report.path.name == f"cells-v{version:04d}.h5"
    return root / "releases"


@pytest.fixture
def folder(built: Path, tmp_path: Path) -> Path:
    """This test's own copy of the output folder (the link and the parts' names are
    relative: the copy is a folder of releases like the first)."""
    target = tmp_path / "releases"
    shutil.copytree(built, target, symlinks=True)
    return target


def _parts(folder: Path, version: int) -> list[Path]:
    return sorted(folder.glob(f"cells-v{version:04d}.part-*.h5"))


def test_the_release_records_its_parts(folder: Path) -> None:
    parts = _parts(folder, 3)
    assert [p.name for p in parts] == [f"cells-v0003.part-{i:04d}.h5" for i in range(3)]
    with h5py.File(folder / "cells-v0003.h5") as handle:
        record = json.loads(handle.attrs["parts"])
        mapped = {s.file_name for s in handle["train/image"].virtual_sources()}
    assert [(e["file"], e["bytes"], e["index"]) for e in record] == [
        (p.name, p.stat().st_size, i) for i, p in enumerate(parts)
    ]
    assert mapped <= {p.name for p in parts}
    code, out = _cli("check", folder / "cells.h5")
    assert code == 0, out
    assert f"parts: the release maps {len(mapped)} part files beside it, all there" in out


def _mapped_part(folder: Path) -> Path:
    with h5py.File(folder / "cells-v0003.h5") as handle:
        name: str = handle["train/image"].virtual_sources()[0].file_name
    return folder / name


def test_plain_check_names_a_missing_part_and_readers_refuse(folder: Path) -> None:
    # HDF5 reads a missing part's rows as the fill value: check said OK, "all 0"
    part = _mapped_part(folder)
    part.unlink()
    code, out = _cli("check", folder / "cells.h5")
    assert code == 1, out
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM part")]
    assert problems == [f"PROBLEM part {part.name}: missing: the release maps rows onto it "
                        "(HDF5 would read them as zeros); copy it back beside the release, "
                        "or build the release again"]  # fmt: skip
    with pytest.raises(ReaderError, match=f"^.*cells-v0003.h5: part {part.name}: missing: "):
        Release(folder / "cells.h5", "train")


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "another part"])
def test_plain_check_names_a_damaged_part(folder: Path, damage: str) -> None:
    part = _mapped_part(folder)
    size = part.stat().st_size
    if damage == "truncated":
        os.truncate(part, size // 2)
        said = f"{size // 2:,} bytes, the release recorded {size:,}: truncated or replaced"
    elif damage == "zeroed":  # the right size, but no HDF5 file any more
        part.write_bytes(bytes(size))
        said = "not readable as HDF5"
    else:  # another part in its place, of the same size (the tests may write HDF5)
        with h5py.File(part, "r+") as handle:
            handle.attrs.modify("shard_index", 7)  # in place: the file keeps its size
        assert part.stat().st_size == size
        said = "another build's part (shard"
    code, out = _cli("check", folder / "cells.h5")
    assert code == 1, out
    assert f"PROBLEM part {part.name}: {said}" in out


def test_readers_read_a_healthy_virtual_release(folder: Path) -> None:
    with h5py.File(folder / "cells-v0003.h5") as handle:
        sources = handle["train/image"].virtual_sources()
    expected = []
    for source in sources:  # in write order: the parts' own rows, read without the mapping
        with h5py.File(folder / source.file_name) as part:
            expected.append(part[source.dset_name][...])
    reader = Release(folder / "cells.h5", "train", fields=["image"])
    batch = reader.read(np.arange(len(reader)))
    np.testing.assert_array_equal(batch["image"], np.concatenate(expected))
    assert batch["image"].any()


def _release_files(folder: Path, version: int) -> dict[Path, int]:
    """Every file of release ``version`` (the release, what lies beside it, its parts)."""
    mark = f"cells-v{version:04d}"
    return {p: p.stat().st_size for p in folder.iterdir() if p.name.lstrip(".").startswith(mark)}


def test_prune_deletes_the_parts_with_their_release(folder: Path) -> None:
    # prune said "deleted ... part-0000.h5 ... freed" and deleted no part; a second prune
    # said the same again
    gone = {**_release_files(folder, 1), **_release_files(folder, 2)}
    assert len([p for p in gone if ".part-" in p.name]) == 6
    kept = {p: p.read_bytes() for p in _release_files(folder, 3)}
    code, out = _cli("prune", folder, "--keep", "1")
    assert code == 0, out
    assert f"dry run: 2 releases ({human_size(sum(gone.values()))}) would be deleted" in out
    code, out = _cli("prune", folder, "--keep", "1", "--yes")
    assert code == 0, out
    assert not any(p.exists() for p in gone)
    assert {p: p.read_bytes() for p in _release_files(folder, 3)} == kept
    assert out.splitlines()[-1] == f"deleted 2 releases, {human_size(sum(gone.values()))} freed"
    assert "cells-v0001.part-0002.h5" in out.splitlines()[0]
    assert _cli("check", folder / "cells.h5", "--deep")[0] == 0
    code, out = _cli("prune", folder, "--keep", "1", "--yes")
    assert out.splitlines() == [
        "keep    cells-v0003.h5  (newest 1, cells.h5 points at it)",
        "deleted 0 releases, 0 B freed",
    ]


def test_prune_keeps_a_part_that_a_release_that_stays_maps(folder: Path) -> None:
    part = folder / "cells-v0001.part-0001.h5"
    with h5py.File(part) as handle:
        rows = handle["train/image"].shape
    layout = h5py.VirtualLayout(shape=rows, dtype=np.uint8)
    layout[:] = h5py.VirtualSource(part.name, "train/image", shape=rows)
    with h5py.File(folder / "cells-v0004.h5", "w") as handle:  # maps v0001's part
        handle.create_virtual_dataset("train/image", layout)
    gone = {**_release_files(folder, 1), **_release_files(folder, 2)}
    del gone[part]
    code, out = _cli("prune", folder, "--keep", "1", "--yes")
    assert code == 0, out
    assert part.is_file()
    assert not any(p.exists() for p in gone)
    assert f"(keeps {part.name}: a release that stays maps it)" in out.splitlines()[0]
    assert out.splitlines()[-1] == f"deleted 2 releases, {human_size(sum(gone.values()))} freed"


def test_deep_check_names_the_part_whose_bytes_changed(folder: Path) -> None:
    # a part of its size and identity whose chunk bytes changed: plain check cannot see it
    # (it reads no data); --deep names the part
    part = _mapped_part(folder)
    with h5py.File(part, "r") as handle:
        info = handle["train/image"].id.get_chunk_info(0)
    with open(part, "r+b") as raw:
        raw.seek(info.byte_offset + info.size // 2)
        byte = raw.read(1)
        raw.seek(info.byte_offset + info.size // 2)
        raw.write(bytes([byte[0] ^ 0xFF]))
    code, out = _cli("check", folder / "cells.h5", "--deep")
    assert code == 1, out
    problem = next(line for line in out.splitlines() if line.startswith("PROBLEM /train/image"))
    assert f"in part {part.name}" in problem


def test_prune_deletes_the_parts_an_earlier_prune_left(folder: Path) -> None:
    # what the prune of before left: the release and the files beside it gone, its parts not
    for path in _release_files(folder, 1):
        if ".part-" not in path.name:
            path.unlink()
    left = _release_files(folder, 1)
    assert len(left) == 3
    code, out = _cli("prune", folder, "--keep", "2", "--yes")
    assert code == 0, out
    assert not any(p.exists() for p in left)
    assert out.splitlines()[-1] == f"deleted 1 releases, {human_size(sum(left.values()))} freed"
    code, out = _cli("prune", folder, "--keep", "2", "--yes")
    assert out.splitlines()[-1] == "deleted 0 releases, 0 B freed"
    assert not any(line.startswith("deleted cells") for line in out.splitlines())
