"""Incremental builds of ragged columns (CT volumes, sensor series) and of windows.

Unchanged cases carry: their value chunks copied byte for byte (read_direct_chunk compared
here), their offsets rebased; a changed case is decoded again, a removed one is gone and
nothing else moves split. Expectations come from the written arrays and from a full build.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h5py
import numpy as np
import pytest
from test_kind_series import CHANNELS, LENGTHS, make_recordings, series_config, write_recording
from test_kind_volume import SHAPE, SPACING, ct_config, make_ct, names_for

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.config.spec import Spec
from h5etl.examples.volumes import ct_case, series_affine, write_dicom_series, write_nifti
from h5etl.format import contract as fileformat
from h5etl.history.build_report import BuildReport
from h5etl.incremental import reuse


def _path(report: BuildReport) -> Path:
    assert report.path is not None
    return report.path


def rows_of(path: Path, field: str, name_field: str) -> dict[str, dict[str, Any]]:
    """Per sample name: its split, row, the ragged column's value range and values."""
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as handle:
        layout = fileformat.read_layout(handle)
        for split in layout.splits:
            names = handle[layout.path(split, name_field)].asstr()[...]
            values = handle[layout.path(split, field)]
            offsets = handle[fileformat.offsets_path(layout.path(split, field))][...]
            assert offsets[0] == 0
            assert offsets[-1] == len(values)
            for row, name in enumerate(names):
                first, last = int(offsets[row]), int(offsets[row + 1])
                out[str(name)] = {
                    "split": split,
                    "row": row,
                    "range": (first, last),
                    "values": values[first:last],
                }
    return out


def chunk_bytes(path: Path, dataset: str, first: int, last: int) -> list[bytes]:
    """The stored bytes of every chunk (all tiles) of value rows ``first:last``."""
    with h5py.File(path, "r") as handle:
        data = handle[dataset]
        rows, tiles = data.chunks[0], data.chunks[1:]
        grid = [
            (row, y, x)
            for row in range(first, last, rows)
            for y in range(0, data.shape[1], tiles[0])
            for x in range(0, data.shape[2], tiles[1])
        ]
        return [data.id.read_direct_chunk(offset)[1] for offset in grid]


def statistics(path: Path, fields: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out = {}
    with h5py.File(path, "r") as handle:
        layout = fileformat.read_layout(handle)
        for split in layout.splits:
            for name in fields:
                attrs = handle[layout.path(split, name)].attrs
                out[f"{split}/{name}"] = {k: np.asarray(attrs[k]).tolist() for k in attrs}
    return out


def parent_facts(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as handle:
        facts: dict[str, Any] = json.loads(handle.attrs["parent"])
        return facts


def rewrite_case(root: Path, name: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    slices = int(rng.integers(3, 9))
    volume, labels = ct_case(rng, (slices, *SHAPE))
    shutil.rmtree(root / "raw/ct" / name)
    write_dicom_series(
        root / "raw/ct" / name, volume, spacing=SPACING, series=f"{name}-again",
        names=names_for(rng, slices),
    )  # fmt: skip
    write_nifti(root / "raw/masks" / f"{name}.nii.gz", labels, affine=series_affine(SPACING))
    return {"ct": volume, "mask": labels}


def test_unchanged_ct_cases_carry_their_chunks_byte_for_byte(tmp_path: Path) -> None:
    truth = make_ct(tmp_path, cases=8)
    config = load_spec(ct_config(tmp_path, max_shrink=0.5))  # a withdrawn case of 8: 12 %
    first = build(config, jobs=1)
    before = rows_of(_path(first), "ct", "case")
    truth["case_2"] = rewrite_case(tmp_path, "case_2", seed=11)  # a corrected case
    shutil.rmtree(tmp_path / "raw/ct/case_5")  # a withdrawn patient
    (tmp_path / "raw/masks/case_5.nii.gz").unlink()
    del truth["case_5"]
    second = build(config, jobs=1)
    assert not second.rejects
    after = rows_of(_path(second), "ct", "case")
    assert sorted(after) == sorted(truth)  # the withdrawn case is gone, the others are there
    assert second.reused == 6  # every case but the changed and the removed one
    facts = parent_facts(_path(second))
    assert facts["samples_reused"] == 6
    assert facts["samples_decoded"] == 1
    assert facts["bytes_reused"] == second.reused_bytes > 0
    for name, case in after.items():
        assert case["split"] == before.get(name, case)["split"]  # nothing moved split
        np.testing.assert_array_equal(case["values"], truth[name]["ct"], err_msg=name)
        if name == "case_2":
            continue
        old = before[name]
        old_path = f"/{old['split']}/ct"
        assert chunk_bytes(_path(first), old_path, *old["range"]) == chunk_bytes(
            _path(second), f"/{case['split']}/ct", *case["range"]
        ), name
    masks = rows_of(_path(second), "mask", "case")
    for name, case in masks.items():
        np.testing.assert_array_equal(case["values"], truth[name]["mask"], err_msg=name)
    # a full decode of the same inputs (splits kept) gives the same cases and statistics
    full = build(config, jobs=1, full=True)
    assert full.reused == 0
    again = rows_of(_path(full), "ct", "case")
    for name, case in after.items():
        np.testing.assert_array_equal(again[name]["values"], case["values"], err_msg=name)
    fields = ("ct", "mask", "ct_spacing", "ct_affine")
    assert statistics(_path(second), fields) == statistics(_path(full), fields)
    assert check_release(_path(second), deep=True).ok


def test_series_carry_unchanged_recordings_and_re_cut_their_values(tmp_path: Path) -> None:
    # 16 value rows a chunk: recordings start anywhere in a chunk
    truth = make_recordings(tmp_path, LENGTHS)
    config = load_spec(series_config(tmp_path, field={"chunk_rows": 16}))
    first = build(config, jobs=1)
    before = rows_of(_path(first), "rec_accel", "filename")
    order = sorted(before, key=lambda p: before[p]["row"])
    changed = Path(order[2]).name  # the third row: a run before it, a run after it
    truth[changed] = write_recording(tmp_path / "raw/rec" / changed, 4, seed=40)
    truth["g"] = write_recording(tmp_path / "raw/rec/g", 5, seed=41)  # new
    second = build(config, jobs=1)
    assert second.reused == len(LENGTHS) - 1
    after = rows_of(_path(second), "rec_accel", "filename")
    for path, case in after.items():
        name = Path(path).name
        np.testing.assert_array_equal(case["values"], truth[name]["accel"], err_msg=name)
    # the first run (rows 0 and 1) starts the chunk grid in both files: its whole chunks are
    # the parent's bytes; the run after the changed recording starts mid-chunk: re-cut
    whole = before[order[1]]["range"][1] // 16 * 16
    assert whole >= 16
    carried = chunk_bytes_1d(_path(second), "/train/rec_accel", 0, whole)
    assert carried == chunk_bytes_1d(_path(first), "/train/rec_accel", 0, whole)
    assert [after[p]["row"] for p in order[:2]] == [0, 1]
    assert second.chunk_paths["/train/rec_accel:copied"] == whole // 16
    full = build(config, jobs=1, full=True)
    names = ("rec_accel", "rec_volts", "rec_temp", "rec_temp_time")
    assert statistics(_path(second), names) == statistics(_path(full), names)
    fresh = rows_of(_path(full), "rec_accel", "filename")
    for path, case in after.items():
        np.testing.assert_array_equal(fresh[path]["values"], case["values"], err_msg=path)
    assert check_release(_path(second), deep=True).ok


def chunk_bytes_1d(path: Path, dataset: str, first: int, last: int) -> list[bytes]:
    with h5py.File(path, "r") as handle:
        data = handle[dataset]
        rows = data.chunks[0]
        inner = tuple(0 for _ in data.shape[1:])
        return [data.id.read_direct_chunk((r, *inner))[1] for r in range(first, last, rows)]


def test_windows_of_a_recording_carry_and_decode_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = make_recordings(tmp_path, LENGTHS)
    window = {"window": {"seconds": 2, "stride": 1}}
    config = load_spec(series_config(tmp_path, field=window, splits={"train": 0.5, "valid": 0.5}))
    first = build(config, jobs=1)
    windows = sum(s - 1 for s in LENGTHS.values())
    assert sum(first.samples.values()) == windows
    planned: list[reuse.CarryPlan] = []
    original = reuse.plan_carry

    def spy(*args: Any, **kwargs: Any) -> reuse.CarryPlan:
        planned.append(original(*args, **kwargs))
        return planned[-1]

    monkeypatch.setattr(reuse, "plan_carry", spy)
    # nothing changed: up to date; with new notes, every window is carried (the windows
    # share their recording's key)
    assert build(config, jobs=1).up_to_date
    again = build(config.model_copy(update={"notes": "the same windows"}), jobs=1)
    assert again.reused == windows
    truth["d"] = write_recording(tmp_path / "raw/rec/d", 4, seed=50)  # same length, new values
    third = build(config, jobs=1)
    carried = [s for blocks in planned[-1].blocks.values() for b in blocks for s in b.samples]
    assert carried
    assert not any(s.split_name == "d" for s in carried)  # none of d's windows
    assert third.reused == len(carried) < windows
    with h5py.File(_path(third), "r") as handle:
        count = 0
        for split in ("train", "valid"):
            names = [v.decode() for v in handle[f"{split}/rec_recording"][()]]
            offsets = handle[f"{split}/rec_offset"][()]
            accel = handle[f"{split}/rec_accel"][()]
            for name, offset, values in zip(names, offsets, accel, strict=True):
                start = int(offset) * 50
                expected = truth[name]["accel"][start : start + 100]
                np.testing.assert_array_equal(values, expected, err_msg=f"{name}@{offset}")
                count += 1
    assert count == windows
    assert check_release(_path(third), deep=True).ok


def stem_recordings(tmp_path: Path) -> tuple[Path, dict[str, Any], Spec]:
    """Recordings as files sharing a stem (``a_accel.npy``, ``a_volts.csv``...) in
    ``raw/rec``: the folder, each recording's written channels, the config (stem mode)."""
    raw = tmp_path / "raw" / "rec"
    truth = {
        n: write_recording(raw, s, i, prefix=f"{n}_") for i, (n, s) in enumerate(LENGTHS.items())
    }
    channels = {name: {**spec, "file": "_" + spec["file"]} for name, spec in CHANNELS.items()}
    config = load_spec(
        series_config(
            tmp_path,
            source={"entries": "files", "glob": "*_accel.npy"},
            field={"recording": "stem", "channels": channels},
        )
    )
    return raw, truth, config


def test_a_stem_recording_whose_other_channel_changed_is_decoded_again(tmp_path: Path) -> None:
    """In stem mode a sample's own file is its first channel's; the others are found by
    stem. Their stamps are the plan's too: a corrected volts.csv beside an untouched
    accel.npy must not be carried from the parent."""
    raw, truth, config = stem_recordings(tmp_path)
    first = build(config, jobs=1)
    volts = raw / "c_volts.csv"
    corrected = np.round(truth["c"]["volts"].astype(np.float64) + 0.5, 2)
    volts.write_text("v\n" + "".join(f"{v}\n" for v in corrected))
    truth["c"]["volts"] = corrected.astype(np.float32)
    second = build(config, jobs=1)
    assert second.reused == len(LENGTHS) - 1  # all but c, whose first channel is untouched
    after = rows_of(_path(second), "rec_volts", "filename")
    for path, case in after.items():
        name = Path(path).name.removesuffix("_accel.npy")
        np.testing.assert_array_equal(case["values"], truth[name]["volts"], err_msg=name)
    assert rows_of(_path(first), "rec_volts", "filename").keys() == after.keys()
    assert check_release(_path(second), deep=True).ok


def _by_name(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Each sample's ragged values and fixed head row, by file name (h5py only)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            names = handle[f"{split}/filename"].asstr()[...]
            values, offsets = handle[f"{split}/rec"][...], handle[f"{split}/rec_offsets"][...]
            heads = handle[f"{split}/rec_head"][...]
            for i, name in enumerate(names):
                rows = values[offsets[i] : offsets[i + 1]]
                out[str(name)] = {"values": rows, "head": heads[i], "split": np.array(split)}
    return out


def test_fixed_and_ragged_columns_of_one_kind_carry_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # blocks of 4 samples (the fixed head's chunk rows), values in chunks of 5 rows
    from ragged_kind import HEAD, use_npy_recording
    from test_ragged import make_recordings as make_npy_recordings

    truth = make_npy_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    config = load_spec(tmp_path / "config.yaml")
    first = build(config, jobs=1)
    before = _by_name(_path(first))
    folder = tmp_path / "raw" / "rec"
    (folder / "r04.npy").unlink()
    del truth["r04.npy"]
    rng = np.random.default_rng(99)
    for name, n in (("r06.npy", 11), ("r20.npy", 8)):  # changed, new
        truth[name] = rng.normal(size=(n, 3)).astype(np.float32)
        np.save(folder / name, truth[name])
    second = build(config, jobs=1)
    assert 0 < second.reused < len(truth)
    found = _by_name(_path(second))
    assert sorted(found) == sorted(truth)
    for name, sample in found.items():
        np.testing.assert_array_equal(sample["values"], truth[name], err_msg=name)
        head = np.full((HEAD, 3), -1.0, np.float32)
        head[: min(HEAD, len(truth[name]))] = truth[name][:HEAD]
        np.testing.assert_array_equal(sample["head"], head, err_msg=name)
        if name in before:
            assert sample["split"] == before[name]["split"]
    full = build(config, jobs=1, full=True)
    names = ("rec", "rec_head", "rec_length")
    assert statistics(_path(second), names) == statistics(_path(full), names)
    assert check_release(_path(second), deep=True).ok


def test_a_touched_stem_recording_is_decoded_not_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording's lineage digest is its kind's (over every channel read), so a touched
    file of equal bytes cannot be matched by hashing it: it is decoded again, and carry
    does not read it for nothing first."""
    raw, _, config = stem_recordings(tmp_path)
    build(config, jobs=1)
    touched = raw / "b_accel.npy"
    info = touched.stat()
    os.utime(touched, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))
    hashed: list[str] = []

    def spy(path: str) -> bytes:
        hashed.append(path)
        return Path(path).read_bytes()

    # carry's own reads only (decoding reads the files through h5etl.inputs.opening too)
    monkeypatch.setattr(reuse, "inputs", SimpleNamespace(read_file=spy))
    again = config.model_copy(update={"notes": "touched"})  # new notes: a release either way
    second = build(again, jobs=1)
    assert second.reused == len(LENGTHS) - 1
    assert hashed == []
