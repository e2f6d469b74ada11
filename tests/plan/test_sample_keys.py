"""The sample keys: each split's sample_key and sample_group, row-aligned with its fields."""

from __future__ import annotations

import json
import shutil
import signal
import unicodedata
from pathlib import Path

import h5py
import pytest
from conftest import MakeRaw, WriteConfig, dataset_digests

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.format import contract as fileformat
from h5etl.plan import tasks
from h5etl.readers import Release
from h5etl.testing import run_killed_build


def _texts(handle: h5py.File, path: str) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in handle[path][...]]


def test_each_split_records_each_samples_key_and_an_empty_group(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=11, broken=["truncated_late"])
    config = write_config(tmp_path, storage={"chunk_samples": 2})
    report = build(load_spec(config))
    assert report.path is not None
    seen = []
    with h5py.File(report.path, "r") as handle:
        layout = json.loads(handle.attrs[fileformat.LAYOUT_ATTR])
        assert layout["samples"] == ["sample_key", "sample_group"]
        for split in ("train", "valid"):
            keys = _texts(handle, f"{split}/sample_key")
            names = _texts(handle, f"{split}/filename")
            # row-aligned with the fields: row i of every dataset is the same sample
            assert keys == [n.removesuffix(".png") for n in names]
            assert _texts(handle, f"{split}/sample_group") == [""] * len(keys)
            assert handle[f"{split}/sample_key"].dtype.kind == "O"
            seen.extend(keys)
    assert sorted(seen) == raw.keys  # the truncated one is a reject, not a row
    assert check_release(report.path, deep=True).ok


def test_a_renamed_key_records_the_name_its_split_is_seeded_by(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=3)
    # "img:1" sanitises to "img_1", which another file holds: it is stored as "img_1~2", but
    # its split (and so its record) follows the name it was found under
    for name in ("img:1", "img_1", "Cafe\u0301"):  # the last one decomposed: NFC is recorded
        shutil.copy(raw.image("s000"), raw.images / f"{name}.png")
        shutil.copy(raw.mask("s000"), raw.masks / f"{name}.png")
    report = build(load_spec(write_config(tmp_path, splits={"train": 1.0})))
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        keys = _texts(handle, "train/sample_key")
        names = _texts(handle, "train/filename")
    recorded = dict(zip(names, keys, strict=True))
    assert recorded["img:1.png"] == "img:1"
    assert recorded["img_1.png"] == "img_1"
    assert unicodedata.is_normalized("NFC", recorded["Cafe\u0301.png"])
    assert recorded["Cafe\u0301.png"] == unicodedata.normalize("NFC", "Cafe\u0301")


def test_the_record_reads_beside_the_fields(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    report = build(load_spec(write_config(tmp_path)))
    assert report.path is not None
    release = Release(report.path, "train", fields=["filename", "sample_key"])
    rows = release.read_slice(0, len(release))
    assert [str(k) for k in rows["sample_key"]] == [
        str(n).removesuffix(".png") for n in rows["filename"]
    ]


def test_a_resumed_build_restores_the_record(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    make_raw(tmp_path, n=24)
    config = write_config(tmp_path, storage={"chunk_samples": 2})
    reference = build(load_spec(config))
    assert reference.path is not None
    digests = dataset_digests(reference.path)
    reference.path.unlink()
    (reference.path.parent / "cells.h5").unlink()
    assert run_killed_build(config, 10) == -signal.SIGKILL
    resumed = build(load_spec(config), resume=True)
    assert resumed.path is not None
    assert resumed.resumed > 0
    assert dataset_digests(resumed.path) == digests
    assert "/train/sample_key" in digests
    assert check_release(resumed.path, deep=True).ok


def test_a_field_cannot_take_a_record_name(tmp_path: Path, write_config: WriteConfig) -> None:
    from h5etl import ConfigError

    config = write_config(tmp_path, fields={"sample_key": {"dtype": "str"}})
    with pytest.raises(ConfigError, match="sample_key"):
        load_spec(config)
