"""decode: worker results for hand-made tasks."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, centre_pad, save

from h5etl.config.load import load_spec
from h5etl.dataflow import DecodeTask, EncodedChunk, EncodedRows, Sample, SourceFile
from h5etl.decode import memory, worker_memory
from h5etl.decode import task as decode
from h5etl.execute import assembly, mapping
from h5etl.plan import admit, discover


def planned(root: Path, key: str) -> Sample:
    files = tuple(
        SourceFile(source, str(root / "raw" / folder), f"{key}.png")
        for source, folder in (("image", "images"), ("mask", "masks"))
    )
    return Sample.of(key, files)


def test_a_rejected_sample_leaves_no_pixels_in_the_next_ones_padding(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a sample whose image was placed before its mask failed left its pixels in the row,
    # and the next (smaller) sample in that row kept them as "padding"
    make_raw(tmp_path, n=0)
    big = np.full((24, 24, 3), 200, np.uint8)
    bad_mask = np.zeros((24, 24), np.uint8)
    bad_mask[0, 0] = 128
    save(tmp_path / "raw" / "images" / "big.png", big)
    save(tmp_path / "raw" / "masks" / "big.png", bad_mask)
    small = np.full((6, 6, 3), 50, np.uint8)
    save(tmp_path / "raw" / "images" / "small.png", small)
    save(tmp_path / "raw" / "masks" / "small.png", np.zeros((6, 6), np.uint8))
    spec = load_spec(write_config(tmp_path))
    recipe = assembly.recipe_of(admit.plan(spec, discover.find_samples(spec).samples))
    samples = (planned(tmp_path, "big"), planned(tmp_path, "small"))
    task = DecodeTask("train", 0, samples, 4, 4, final=True, raw=True)

    result = decode.decode_batch(task, recipe)

    assert result.accepted == 1
    assert {r.reason for r in result.rejects} == {"mask_values"}
    rows = result.columns["image"]
    assert isinstance(rows, np.ndarray)
    np.testing.assert_array_equal(rows[0], centre_pad(small, 24, 24))


def _keys(samples: Sequence[Sample]) -> list[str]:
    return [s.key for s in samples]


def test_map_in_workers_keeps_order(tmp_path: Path) -> None:
    keys = [f"s{i:03d}" for i in range(50)]
    batches = [tuple(planned(tmp_path, k) for k in keys[i : i + 3]) for i in range(0, 50, 3)]
    outcomes = mapping.map_in_workers(_keys, batches, jobs=2, window=3)
    assert [key for batch in outcomes for key in batch] == keys
    # a worker that dies: see test_decode_crashes.py


def test_reused_batch_buffers_never_leak_pixels_between_tasks(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    """A worker reuses its batch arrays; padding is refilled and rows that left are kept."""
    make_raw(tmp_path, n=0)
    images = tmp_path / "raw" / "images"
    masks = tmp_path / "raw" / "masks"
    for key, side, value in [("a", 24, 200), ("b", 24, 180), ("c", 6, 50), ("d", 24, 10)]:
        save(images / f"{key}.png", np.full((side, side, 3), value, np.uint8))
        save(masks / f"{key}.png", np.zeros((side, side), np.uint8))
    bad = np.zeros((24, 24), np.uint8)
    bad[0, 0] = 128
    save(images / "e.png", np.full((24, 24, 3), 90, np.uint8))
    save(masks / "e.png", bad)
    spec = load_spec(write_config(tmp_path, storage={"chunk_samples": 2}))
    recipe = assembly.recipe_of(admit.plan(spec, discover.find_samples(spec).samples))
    height, width = spec.chunks_of("image")[2:]

    def task(*keys: str, raw: bool = False) -> DecodeTask:
        samples = tuple(planned(tmp_path, k) for k in keys)
        return DecodeTask("train", 0, samples, 2, 2, final=True, raw=raw)

    first = decode.decode_batch(task("a", "b"), recipe)  # encoded: buffers kept
    assert isinstance(first.columns["image"], EncodedRows)
    partial = decode.decode_batch(task("c", "e", raw=True), recipe)  # rows leave raw
    raw_rows = partial.columns["image"]
    assert isinstance(raw_rows, np.ndarray)
    kept = raw_rows.copy()
    np.testing.assert_array_equal(kept[0], centre_pad(np.full((6, 6, 3), 50), height, width))
    decode.decode_batch(task("d", "a"), recipe)
    np.testing.assert_array_equal(raw_rows, kept)  # not overwritten by the next task


def test_a_worker_trims_its_heap_once_it_idles_not_between_two_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a trim between two CT cases made the next one fault every page of the heap again
    trimmed = threading.Event()
    monkeypatch.setattr(memory, "release_free_memory", trimmed.set)
    monkeypatch.setattr(worker_memory, "TRIM_IDLE_SECONDS", 0.01)
    monkeypatch.setattr(worker_memory._Activity, "trim_pending", False)
    with worker_memory.busy():  # a result freed while the next task runs
        worker_memory._give_back_memory()
        worker_memory._give_back_memory()  # one trim waits for both
        assert not trimmed.wait(0.2)
    assert trimmed.wait(10)  # idle: trimmed
    assert not worker_memory._Activity.trim_pending


def test_encoded_chunks_pickle_as_they_are() -> None:
    chunk = EncodedChunk((3, 0, 128), 2, b"\x00\x01", "ab" * 32)
    assert pickle.loads(pickle.dumps(chunk)) == chunk
