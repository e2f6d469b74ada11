"""File names a build must survive: bytes that are not UTF-8, and keys that collide once
sanitised. Every such file is built (or reported), and no file changes split or key because
another one arrived."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from conftest import SHAPE, MakeRaw, WriteConfig, png_bytes, random_pair

import h5etl
from h5etl.check.health import check_release
from h5etl.config.load import load_spec
from h5etl.dataflow import Reject
from h5etl.format import journal

LATIN1 = b"caf\xe9"  # "café" as a Windows archive stores it: not valid UTF-8


def _write_pair_bytes(raw: Path, stem: bytes, rng: np.random.Generator) -> np.ndarray:
    """An image/mask pair named by raw bytes; returns the image pixels."""
    image, mask = random_pair(rng, (12, 10))
    for sub, pixels in ((b"images", image), (b"masks", mask)):
        with open(os.path.join(os.fsencode(raw), b"raw", sub, stem + b".png"), "wb") as handle:
            handle.write(png_bytes(pixels))
    return image


def _stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """filename -> {"split", "image"} for every stored sample."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as f:
        for split in ("train", "valid"):
            names = f[split]["filename"].asstr()[:]
            for row, name in enumerate(names):
                out[str(name)] = {"split": np.array(split), "image": f[split]["image"][row]}
    return out


def test_names_that_are_not_utf8_are_built_and_reported(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    image = _write_pair_bytes(tmp_path, LATIN1, np.random.default_rng(1))
    orphan = os.path.join(os.fsencode(tmp_path), b"raw", b"images", b"orph\xff.png")
    with open(orphan, "wb") as handle:
        handle.write(png_bytes(image))
    config = write_config(tmp_path)

    report = h5etl.build(load_spec(config))

    assert report.path is not None
    stored = _stored(report.path)
    assert "caf\\xe9.png" in stored  # the undecodable byte, escaped
    height, width = image.shape[:2]
    top, left = (SHAPE - height) // 2, (SHAPE - width) // 2
    np.testing.assert_array_equal(
        stored["caf\\xe9.png"]["image"][:, top : top + height, left : left + width],
        image.transpose(2, 0, 1),
    )
    assert len(stored) == 4
    assert report.rejects_path is not None
    lines = [json.loads(line) for line in report.rejects_path.read_text("utf-8").splitlines()]
    assert [(r["path"], r["reason"]) for r in lines] == [(os.fsdecode(orphan), "orphan")]
    assert check_release(report.path, deep=True).ok
    with h5py.File(report.path) as f:
        renamed = list(f["diagnostics"].attrs["renamed_keys"])
    assert renamed == ["caf\\xe9 -> caf_xe9"]  # keys hold no backslash


def test_dry_run_with_a_name_that_is_not_utf8(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    _write_pair_bytes(tmp_path, LATIN1, np.random.default_rng(2))
    report = h5etl.build(load_spec(write_config(tmp_path)), dry_run=True)
    assert sum(report.samples.values()) == 3


def test_journal_round_trips_undecodable_names(tmp_path: Path) -> None:
    path = tmp_path / "build.journal"
    name = os.fsdecode(b"/raw/images/" + LATIN1 + b".png")
    writer = journal.JournalWriter(path, config_sha256="c", plan_sha256="p")
    reject = Reject(name, "decode", "truncated", "cut short", os.fsdecode(LATIN1))
    delta: dict[str, Any] = {"lineage": {}, "chunks": journal.pack_chunks([], [], [], [], [])}
    delta["fingerprint"] = []
    delta |= {"queues": {}, "rows": {}, "blocks": {}, "texts": {}}
    delta["rejects"] = [reject.as_json()]
    writer.checkpoint(delta)
    writer.close()
    state = journal.read(path)
    assert state is not None
    assert state.rejects == [reject.as_json()]


def test_a_new_colliding_file_moves_and_renames_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=0)
    rng = np.random.default_rng(3)
    originals = [f"k_{i}".encode() for i in range(12)]
    for stem in originals:
        _write_pair_bytes(tmp_path, stem, rng)
    config = write_config(tmp_path)
    first = h5etl.build(load_spec(config))
    assert first.path is not None
    before = {name: entry["split"] for name, entry in _stored(first.path).items()}

    for i in range(12):  # each cleans to the key of an existing file and sorts before it
        _write_pair_bytes(tmp_path, f"k:{i}".encode(), rng)
    second = h5etl.build(load_spec(config))

    assert second.path is not None
    after = {name: entry["split"] for name, entry in _stored(second.path).items()}
    assert len(after) == 24
    assert {name: after[name] for name in before} == before
    with h5py.File(second.path) as f:
        renamed = sorted(f["diagnostics"].attrs["renamed_keys"])
    assert renamed == sorted(f"k:{i} -> k_{i}~2" for i in range(12))
