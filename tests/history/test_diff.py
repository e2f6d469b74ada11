"""``h5etl diff A B``: real releases built twice from tiny raw folders, changed in between.

Expectations come from the raw folders and from h5py reads of the files, never from the
diff's own reader: which names each split stores, which files changed (their SHA-256 on disk).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import SHAPE, MakeRaw, WriteConfig, random_pair, save
from test_kind_label import make_pets, pets_config
from test_splits import PATTERN, add_pairs, remove_pairs
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.history.diff import diff_paths, diff_releases
from h5etl.history.snapshot import read_snapshot
from h5etl.pipeline import run as pipeline

runner = CliRunner()
DATA = Path(__file__).parents[1] / "data"


def _cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _build(config: Path) -> Path:
    report = pipeline.build(load_spec(config), jobs=1)
    assert report.path is not None
    return report.path


def _splits_of(path: Path, column: str = "sample_key") -> dict[str, str]:
    """sample key (or file name) -> split, read with h5py."""
    out = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            for name in handle[f"{split}/{column}"].asstr()[...]:
                out[str(name)] = split
    return out


def _keys(changes: list[Any]) -> set[str]:
    return {c.key for c in changes}


def test_a_release_against_itself_is_empty(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    path = _build(write_config(tmp_path))
    found = diff_paths(path, path)
    assert found.empty
    assert found.added == []
    assert found.removed == []
    assert found.changed == []
    assert found.moved == []
    assert found.layout == []
    code, out, _ = _cli("diff", path, tmp_path / "releases" / "cells.h5", "--exit-code")
    assert code == 0, out
    assert "no differences" in out
    code, out, _ = _cli("diff", path, path, "--json")
    assert code == 0
    assert json.loads(out)["empty"] is True


@pytest.mark.parametrize("name", ["cells-0.1-lzf.h5", "cells-0.1-blosc.h5"])
def test_an_old_release_against_itself_is_empty(name: str) -> None:
    assert diff_paths(DATA / name, DATA / name).empty


def test_samples_added_removed_changed(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=10)
    config = write_config(tmp_path)
    first = _build(config)
    # s001 withdrawn; s002's mask corrected (same size); two new pairs
    raw.image("s001").unlink()
    raw.mask("s001").unlink()
    rng = np.random.default_rng(11)
    size = raw.sizes["s002"]
    save(raw.mask("s002"), random_pair(rng, size)[1])
    for key in ("n000", "n001"):
        image, mask = random_pair(rng, (9, 11))
        save(raw.image(key), image)
        save(raw.mask(key), mask)
    second = _build(config)

    before, after = _splits_of(first), _splits_of(second)
    found = diff_paths(first, second)
    assert found.identity == "key"
    assert found.notes == ["changed samples: by the SHA-256 of their source files"]
    assert _keys(found.added) == set(after) - set(before) == {"n000", "n001"}
    assert _keys(found.removed) == set(before) - set(after) == {"s001"}
    assert [(c.key, c.what) for c in found.changed] == [("s002", ("mask",))]
    assert {c.key: c.split for c in found.added} == {k: after[k] for k in ("n000", "n001")}
    moved = {k for k in set(before) & set(after) if before[k] != after[k]}
    assert _keys(found.moved) == moved
    with h5py.File(first, "r") as a, h5py.File(second, "r") as b:
        for split in ("train", "valid"):
            assert found.counts[split] == (len(a[f"{split}/image"]), len(b[f"{split}/image"]))
    assert found.label == "major"  # a sample left the release
    reasons = ["1 sample removed"]
    if moved:
        reasons.append(f"{len(moved)} sample{'s' * (len(moved) != 1)} moved between splits")
    assert found.labelled() == ("major", reasons)
    assert not found.layout

    code, out, _ = _cli("diff", first, second)
    assert code == 0, out
    assert "removed: s001 (" in out
    assert f"changed: s002 ({after['s002']}): mask" in out
    assert out.rstrip().endswith(f"change: major: {', '.join(reasons)}")
    code, out, _ = _cli("diff", first, second, "--json", "--exit-code")
    assert code == 1  # they differ
    data = json.loads(out)
    assert {s["key"] for s in data["samples"]["added"]} == {"n000", "n001"}
    assert data["samples"]["changed"] == [{"key": "s002", "split": after["s002"], "what": ["mask"]}]
    assert data["label"] == "major"
    assert data["a"]["version"] == 1
    assert data["b"]["version"] == 2


def test_only_additions_are_minor_and_the_release_stores_it(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=8)
    config = write_config(tmp_path, splits={"train": 1.0})  # one split: nothing can move
    first = _build(config)
    rng = np.random.default_rng(3)
    image, mask = random_pair(rng, (12, 12))
    save(raw.image("zz"), image)
    save(raw.mask("zz"), mask)
    second = _build(config)
    found = diff_paths(first, second)
    assert [(c.key, c.split) for c in found.added] == [("zz", "train")]
    assert found.removed == []
    assert found.changed == []
    assert found.moved == []
    assert found.summary() == "minor: 1 sample added"
    with h5py.File(first, "r") as a, h5py.File(second, "r") as b:
        assert a.attrs["change"] == "initial"
        assert "parent_version" not in a.attrs
        assert b.attrs["change"] == "minor"
        assert b.attrs["change_summary"] == "minor: 1 sample added"
        assert b.attrs["parent_version"] == 1
        assert b.attrs["parent_fingerprint"] == a.attrs["source_fingerprint"]


def test_storage_only_is_a_patch(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=8)
    first = _build(write_config(tmp_path))
    second = _build(
        write_config(tmp_path, storage={"chunk_samples": 2, "compression": "gzip"}, attrs={"a": 1})
    )
    found = diff_paths(first, second)
    assert found.added == []
    assert found.removed == []
    assert found.changed == []
    assert found.moved == []
    where = {c.where: (c.before, c.after) for c in found.layout}
    assert {c.category for c in found.layout} == {"storage"}
    assert where["train/image chunks"] == ([4, 3, SHAPE, SHAPE], [2, 3, SHAPE, SHAPE])
    before, after = where["train/image codecs"]
    assert before == ["shuffle", "lzf"]
    assert after == ["shuffle", "gzip(4)"]
    assert [(c.where, c.before, c.after) for c in found.attrs] == [("a", None, 1)]
    assert found.config  # the stored config text differs in its storage lines
    assert found.label == "patch"
    with h5py.File(second, "r") as handle:
        assert handle.attrs["change"] == "patch"


def test_fields_and_split_membership_are_major(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=12)
    first = _build(write_config(tmp_path))
    bigger = {"image": {"shape": [3, 30, 30]}, "mask": {"shape": [1, 30, 30]}}
    reshaped = _build(write_config(tmp_path, fields=bigger))
    found = diff_paths(first, reshaped)
    assert [(c.where, c.before, c.after) for c in found.layout if c.category == "field"] == [
        ("image shape", [3, SHAPE, SHAPE], [3, 30, 30]),
        ("mask shape", [1, SHAPE, SHAPE], [1, 30, 30]),
    ]
    assert found.label == "major"
    more = _build(write_config(tmp_path, fields={"maskname": {"kind": "text", "source": "mask"}}))
    found = diff_paths(first, more)
    assert [(c.where, c.before) for c in found.layout] == [("maskname", None)]
    assert found.layout[0].after["kind"] == "text"
    assert found.added == []
    assert found.removed == []
    assert found.changed == []
    assert found.summary() == "major: field maskname"


def test_samples_moved_between_splits(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # splits are sticky from a parent on: builds into two folders (no parent of each other)
    # give two assignments, and the diff works between any two releases
    make_raw(tmp_path, n=20)
    first = _build(write_config(tmp_path, output="one"))
    second = _build(write_config(tmp_path, output="two", splits={"train": 0.5, "valid": 0.5}))
    before, after = _splits_of(first), _splits_of(second)
    expected = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert len(expected) >= 6  # 16/4 -> 10/10: at least six went from train to valid
    found = diff_paths(first, second)
    assert {m.key: (m.before, m.after) for m in found.moved} == expected
    assert found.label == "major"
    _, out, _ = _cli("diff", first, second)
    assert f"{len(expected)} moved" in out
    assert "samples per split: train 16 -> 10 (-6), valid 4 -> 10 (+6)" in out


def test_class_count_deltas(tmp_path: Path) -> None:
    pets = make_pets(tmp_path, extras=False)
    config = pets_config(tmp_path, splits={"train": 1.0})
    first = _build(config)
    rng = np.random.default_rng(1)
    for i in range(3):
        save(pets / "bird" / f"new_{i}.png", rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    (pets / "dog" / "dog_0.png").unlink()
    second = _build(config)
    counts = {}
    for path in (first, second):
        with h5py.File(path, "r") as handle:
            labels = handle["train/label"][...]
            names = [str(n) for n in handle["train/label"].attrs["classes"]]
            counts[path] = {n: int((labels == i).sum()) for i, n in enumerate(names)}
    found = diff_paths(first, second)
    shown = {c.where: (c.before, c.after) for c in found.classes}
    assert shown == {
        f"train/label {n}": (counts[first][n], counts[second][n])
        for n in counts[first]
        if counts[first][n] != counts[second][n]
    }
    assert shown["train/label bird"] == (4, 7)
    _, out, _ = _cli("diff", first, second)
    assert "train/label bird: 4 -> 7 (+3)" in out


def test_an_old_release_against_a_new_one(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    lzf = DATA / "cells-0.1-lzf.h5"
    blosc = tmp_path / "blosc.h5"
    shutil.copyfile(DATA / "cells-0.1-blosc.h5", blosc)
    found = diff_paths(lzf, blosc)  # the same inputs, another codec
    assert found.added == []
    assert found.removed == []
    assert found.changed == []
    assert found.moved == []
    assert {c.category for c in found.layout} == {"storage"}
    assert found.label == "patch"
    make_raw(tmp_path, n=4)
    new = _build(write_config(tmp_path))
    found = diff_paths(lzf, new)
    with h5py.File(lzf, "r") as handle:
        old = {str(n) for s in ("train", "valid") for n in handle[f"{s}/filename"].asstr()[...]}
    assert found.identity == "filename"  # the 0.1 release has no key record
    assert _keys(found.removed) == old - set(_splits_of(new, "filename"))
    assert found.label == "major"
    code, out, _ = _cli("diff", lzf, new)
    assert code == 0, out
    assert (
        "note: samples matched by their file name (the 'filename' field): cells-0.1-lzf.h5 has "
        "no per-sample key record"
    ) in out


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        pytest.param(lambda tmp: tmp / "nowhere.h5", 2, "no such file", id="missing"),
        pytest.param(lambda tmp: tmp, 2, "a folder", id="folder"),
        pytest.param(
            lambda tmp: (tmp / "x.h5", (tmp / "x.h5").write_bytes(b"no"))[0],
            1,
            "not an HDF5 file",
            id="not-hdf5",
        ),
    ],
)
def test_bad_paths_are_one_line(tmp_path: Path, make: Any, code: int, message: str) -> None:
    bad = make(tmp_path)
    got, out, err = _cli("diff", DATA / "cells-0.1-lzf.h5", bad)
    assert got == code
    assert err.count("\n") == 1
    assert message in err
    assert "Traceback" not in out + err


def test_without_keys_or_file_names_samples_are_matched_by_their_sources(tmp_path: Path) -> None:
    # a release of 0.1 whose config had no filename field: the lineage is all it has
    bare = tmp_path / "bare.h5"
    shutil.copyfile(DATA / "cells-0.1-lzf.h5", bare)
    with h5py.File(bare, "r+") as handle:
        for split in ("train", "valid"):
            del handle[f"{split}/filename"]
        dropped = handle["valid/source_sha256"][0]
    found = diff_paths(DATA / "cells-0.1-lzf.h5", bare)
    assert found.identity == "sources"
    assert found.notes[-2:] == [
        "samples matched by the SHA-256 of their source files: bare.h5 has no per-sample key "
        "record or file names",
        "a changed input shows as one sample removed and one added",
    ]
    assert found.added == []
    assert found.removed == []
    assert [(c.where, c.after) for c in found.layout] == [("filename", None)]
    # against itself: empty, the lineage tells every sample apart
    assert diff_paths(bare, bare).empty
    key = ",".join(h.decode() for h in dropped)
    assert key in {c.key for c in diff_releases_without(bare, key).removed}


def diff_releases_without(path: Path, key: str) -> Any:
    """The diff from ``path`` to a copy that lost the sample whose lineage is ``key``."""
    before = read_snapshot(path)
    kept = tuple(s for s in before.samples if ",".join(s.sources.values()) != key)
    assert len(kept) == len(before.samples) - 1
    return diff_releases(before, replace(before, samples=kept))


def test_a_withdrawn_patient_is_what_the_diff_shows(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    keys = [f"pt{p:02d}_{i}" for p in range(8) for i in range(3)]
    add_pairs(tmp_path, keys)
    splits = {"train": 0.75, "valid": 0.25, "group_by": PATTERN}
    config = write_config(tmp_path, splits=splits, max_shrink=0.2)  # 3 of 24 go: 12 %
    first = _build(config)
    remove_pairs(tmp_path, [k for k in keys if k.startswith("pt03_")])
    second = _build(config)
    found = diff_paths(first, second)
    split = _splits_of(first)["pt03_0"]
    assert [(c.key, c.split) for c in found.removed] == [(f"pt03_{i}", split) for i in range(3)]
    assert found.moved == []
    assert found.added == []
    assert found.changed == []
    assert found.summary() == "major: 3 samples removed"


def test_samples_in_another_group_are_shown_and_major(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    """Grouping by image instead of by patient keeps every split (sticky), but changes what
    keeps them leak-free: each sample whose group changed is listed, and it is major."""
    keys = [f"pt{p:02d}_{i}" for p in range(6) for i in range(2)]
    add_pairs(tmp_path, keys)
    first = _build(write_config(tmp_path, splits={"train": 0.5, "valid": 0.5, "group_by": PATTERN}))
    by_image = {"train": 0.5, "valid": 0.5, "group_by": r"^(pt\d+_\d)"}  # its own group
    second = _build(write_config(tmp_path, splits=by_image))
    with h5py.File(first, "r") as one, h5py.File(second, "r") as two:
        groups = {
            str(k): (str(a), str(b))
            for split in ("train", "valid")
            for k, a, b in zip(
                one[f"{split}/sample_key"].asstr()[...],
                one[f"{split}/sample_group"].asstr()[...],
                two[f"{split}/sample_group"].asstr()[...],
                strict=True,
            )
        }
    expected = sorted((k, a, b) for k, (a, b) in groups.items() if a != b)
    assert expected  # the test means something
    found = diff_paths(first, second)
    assert [(m.key, m.before, m.after) for m in found.regrouped] == expected
    assert found.moved == []
    assert found.label == "major"
    assert f"{len(expected)} samples in another group" in found.summary()
    listed = found.as_json()["samples"]["regrouped"]
    assert [m["key"] for m in listed] == [k for k, _, _ in expected]
    code, out, _ = _cli("diff", first, second)
    assert code == 0
    assert f"regrouped: {expected[0][0]}: {expected[0][1]!r} -> {expected[0][2]!r}" in out


def test_a_new_write_order_and_equal_files_twice(tmp_path: Path, write_config: WriteConfig) -> None:
    keys = [f"pt{p:02d}_{i}" for p in range(4) for i in range(3)]
    add_pairs(tmp_path, keys)
    before = read_snapshot(_build(write_config(tmp_path)))
    train = [s for s in before.samples if s.split == "train"]
    others = [s for s in before.samples if s.split != "train"]
    # the same samples, train's in reverse: nothing added or removed, the order changed
    reversed_train = replace(before, samples=(*reversed(train), *others))
    found = diff_releases(before, reversed_train)
    assert found.reordered == ["train"]
    assert (found.added, found.removed, found.moved) == ([], [], [])
    assert found.summary() == "patch: write order"
    assert diff_releases(before, replace(before, samples=(*train, *reversed(others)))).reordered
    # matched by their files' SHA-256: a second sample of the same files is one more (#2)
    twice = replace(before, samples=(*before.samples, train[0]), identities=("sources",))
    found = diff_releases(before, twice)
    assert found.identity == "sources"
    assert [c.key for c in found.added] == [",".join(train[0].sources.values()) + "#2"]
    assert found.removed == []
    assert found.reordered == []
