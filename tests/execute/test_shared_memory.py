"""shared_memory: raw ragged values of local workers come back through /dev/shm, and nothing
is left there, whatever happens to the build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import dataset_digests

import h5etl
from h5etl.dataflow import BatchResult, DecodeTask, EncodedRows, RaggedRows
from h5etl.examples.sensors import START, write_recording
from h5etl.execute import shared_memory

pytestmark = pytest.mark.skipif(not shared_memory.SHM.is_dir(), reason="no /dev/shm here")

CONFIG = """\
name: vib
pipeline: series
output: releases
sources:
  recording: {dir: recordings, entries: folders}
fields:
  recording:
    channels:
      accel: {file: accel.npy, rate_hz: 10000, dtype: float32, shape: [3], units: m/s^2}
      voltage: {file: voltage.csv, rate_hz: 100, columns: [volts], units: V}
      temperature: {file: temperature.csv, time: t, rate_hz: 1, columns: [celsius], units: degC}
    tolerance_s: 1.0
splits: {train: 1.0}
"""


def _spy_on_attach(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The columns every result the parent attaches came with through shared memory (and
    again, marked, those in a slot the parent lent)."""
    taken: list[str] = []
    original = shared_memory.attach

    def attach(result: BatchResult, *lent: Any) -> BatchResult:
        taken.extend(result.shared)
        taken.extend(f"{name} (in a lent slot)" for name, r in result.shared.items() if r.slot)
        return original(result, *lent)

    monkeypatch.setattr(shared_memory, "attach", attach)
    return taken


def _ours(owner: int) -> list[Path]:
    return sorted(shared_memory.SHM.glob(f"{shared_memory.PREFIX}-{owner}-*"))


def _result(rows: int) -> BatchResult:
    values = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    result = BatchResult(DecodeTask("train", 0, (), 1, 1), 2)
    result.columns = {
        "big": RaggedRows(values, np.array([rows - 5, 5])),
        "small": RaggedRows(values[:4].copy(), np.array([4])),
    }
    return result


def test_a_worker_shares_big_values_and_the_parent_takes_them_back() -> None:
    owner = os.getpid()
    result = shared_memory.share(_result(200_000), owner)  # 2.4 MB: shared; 48 bytes: pickled
    big = result.columns["big"]
    assert isinstance(big, RaggedRows)
    assert isinstance(big.values, np.ndarray)
    assert big.values.shape == (0, 3)
    assert list(result.shared) == ["big"]
    assert len(_ours(owner)) == 1
    shared_memory.attach(result)
    assert _ours(owner) == []  # unlinked at once: the memory goes with the array
    assert result.shared == {}
    np.testing.assert_array_equal(
        big.values, np.arange(600_000, dtype=np.float32).reshape(200_000, 3)
    )
    assert not big.values.flags.writeable


def test_what_no_parent_will_take_is_swept() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = int(dead.stdout)
    shared_memory.share(_result(200_000), gone)  # a killed build's
    shared_memory.share(_result(200_000), os.getpid())  # this build's, given up
    living = shared_memory.SHM / f"{shared_memory.PREFIX}-1-left-alone"
    living.write_bytes(b"pid 1 lives")
    try:
        shared_memory.sweep()
        assert _ours(gone) == []
        assert len(_ours(os.getpid())) == 1
        shared_memory.sweep(os.getpid())
        assert _ours(os.getpid()) == []
        assert living.exists()
    finally:
        living.unlink()


def test_a_series_build_is_the_same_through_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = _spy_on_attach(monkeypatch)
    rng = np.random.default_rng(2)
    for index, seconds in enumerate([11, 9, 12]):  # ~1.2 MB of accelerometer each
        write_recording(tmp_path / "recordings" / f"r{index}", rng, seconds, START + index)
    (tmp_path / "series.yaml").write_text(CONFIG, encoding="utf-8")
    one = h5etl.build(h5etl.load_spec(tmp_path / "series.yaml"), jobs=1)
    assert one.path is not None
    expected = dataset_digests(one.path)
    one.path.unlink()
    (one.path.parent / "vib.h5").unlink()
    two = h5etl.build(h5etl.load_spec(tmp_path / "series.yaml"), jobs=2, full=True)
    assert two.path is not None
    assert dataset_digests(two.path) == expected
    assert "recording_accel" in taken  # the accelerometer came through /dev/shm
    assert _ours(os.getpid()) == []
    accel = np.load(tmp_path / "recordings" / "r1" / "accel.npy")
    with h5py.File(two.path, "r") as handle:
        values = handle["train/recording_accel"]
        offsets = handle["train/recording_accel_offsets"][...]
        i = [k.decode() for k in handle["train/filename"][...]].index("r1")
        np.testing.assert_array_equal(values[offsets[i] : offsets[i + 1]], accel)


def _encoded(sizes: list[list[int]]) -> tuple[BatchResult, list[list[bytes]]]:
    from h5etl.dataflow import EncodedChunk

    rng = np.random.default_rng(3)
    data = [[rng.bytes(n) for n in block] for block in sizes]
    rows = EncodedRows(
        [[EncodedChunk((0, i), 0, b, f"{i}") for i, b in enumerate(block)] for block in data],
        [b"d" * 32 for _ in sizes],
    )
    result = BatchResult(DecodeTask("train", 0, (), 1, 1), 2)
    result.columns = {"image": rows}
    return result, data


def test_compressed_chunks_come_back_as_views_of_shared_memory() -> None:
    owner = os.getpid()
    result, data = _encoded([[700_000, 0, 300_000], [200_000]])  # 1.2 MB: shared
    shared_memory.share(result, owner)
    assert list(result.shared) == ["image"]
    rows = result.columns["image"]
    assert isinstance(rows, EncodedRows)
    assert [[c.data for c in block] for block in rows.blocks] == [[b"", b"", b""], [b""]]
    assert len(_ours(owner)) == 1
    shared_memory.attach(result)
    assert _ours(owner) == []
    assert [[bytes(c.data) for c in block] for block in rows.blocks] == data
    assert [[c.sha256 for c in block] for block in rows.blocks] == [["0", "1", "2"], ["0"]]
    small, kept = _encoded([[1000, 2000]])
    shared_memory.share(small, owner)  # below MIN_BYTES: pickled as before
    assert small.shared == {}
    unshared = small.columns["image"]
    assert isinstance(unshared, EncodedRows)
    assert [[c.data for c in b] for b in unshared.blocks] == kept


def test_chunks_survive_short_writes_to_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """writev may write less than asked (a signal, a full tmpfs page): the rest follows,
    from inside the buffer it stopped in, and the file is the chunks end to end."""
    real = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[bytes]) -> int:
        calls.append(len(buffers))
        total = sum(len(b) for b in buffers)
        return real(fd, [b"".join(bytes(b) for b in buffers)[: max(1, total // 3)]])

    monkeypatch.setattr(os, "writev", short)
    owner = os.getpid()
    sizes = [[400_000, 0, 7], [300_000, 500_000], *[[900]] * 2000]  # more than IOV_MAX
    result, data = _encoded(sizes)
    shared_memory.share(result, owner)
    assert list(result.shared) == ["image"]
    assert len(calls) > 3
    assert max(calls) <= shared_memory.IOV_MAX
    shared_memory.attach(result)
    rows = result.columns["image"]
    assert isinstance(rows, EncodedRows)
    assert [[bytes(c.data) for c in block] for block in rows.blocks] == data
    assert _ours(owner) == []


def test_an_image_build_is_the_same_through_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    taken = _spy_on_attach(monkeypatch)
    rng = np.random.default_rng(5)
    for folder in ("images", "masks"):
        (tmp_path / folder).mkdir()
    for i in range(40):  # noise does not compress: a task's chunks are over 1 MiB
        pixels = rng.integers(0, 256, (200, 210, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "images" / f"s{i:02d}.png")
        mask = (rng.random((200, 210)) > 0.5).astype(np.uint8) * 255
        Image.fromarray(mask).save(tmp_path / "masks" / f"s{i:02d}.png")
    (tmp_path / "seg.yaml").write_text(
        "name: seg\noutput: releases\n"
        "sources: {image: {dir: images, glob: '*.png'}, mask: {dir: masks, glob: '*.png'}}\n"
        "splits: {train: 0.75, valid: 0.25}\n"
        "fields:\n"
        "  image: {shape: [3, 224, 224], dtype: uint8, mode: RGB}\n"
        "  mask: {shape: [1, 224, 224], dtype: uint8, mode: L, values: [0, 1]}\n"
        "  filename: {dtype: str}\n"
        "storage: {chunk_samples: 8, compression: lzf, shuffle: true}\n",
        encoding="utf-8",
    )
    one = h5etl.build(h5etl.load_spec(tmp_path / "seg.yaml"), jobs=1)
    assert one.path is not None
    expected = dataset_digests(one.path)
    two = h5etl.build(h5etl.load_spec(tmp_path / "seg.yaml"), jobs=2, full=True)
    assert two.path is not None
    assert dataset_digests(two.path) == expected
    assert "image" in taken  # the image chunks came through /dev/shm
    assert "image (in a lent slot)" in taken  # in a recycled file, not one of their own
    assert _ours(os.getpid()) == []
    with h5py.File(two.path, "r") as handle:
        names = [n.decode() for n in handle["train/filename"][...]]
        stored = handle["train/image"][names.index("s03.png")]
    original_pixels = np.asarray(Image.open(tmp_path / "images" / "s03.png")).transpose(2, 0, 1)
    np.testing.assert_array_equal(stored[:, 12:212, 7:217], original_pixels)


def test_a_lent_slot_comes_back_only_once_no_view_of_its_result_is_left() -> None:
    owner = os.getpid()
    slots = shared_memory.Slots(owner, most=2)
    try:
        slot = slots.take()
        assert slot is not None
        first, data = _encoded([[700_000, 500_000]])
        shared_memory.share(first, owner, slot)
        assert [ref.slot for ref in first.shared.values()] == [True]
        assert len(_ours(owner)) == 1  # the slot itself: no file of the result's own
        shared_memory.attach(first, slots, slot)
        rows = first.columns["image"]
        assert isinstance(rows, EncodedRows)
        kept = rows.blocks[0][1].data  # a view of the slot, held past its result
        del first, rows
        other = slots.take()  # the slot is still in use: another one is made
        assert other not in (None, slot)
        assert slots.take() is None  # at most 2: a task then makes its own files
        assert bytes(kept) == data[0][1]
        del kept
        assert slots.take() == slot  # its last view is gone: lent again
        second, again = _encoded([[300_000, 800_000]])  # shorter first chunk: no stale bytes
        shared_memory.share(second, owner, slot)
        shared_memory.attach(second, slots, slot)
        rows = second.columns["image"]
        assert isinstance(rows, EncodedRows)
        assert [[bytes(c.data) for c in b] for b in rows.blocks] == again
    finally:
        slots.close()
    assert _ours(owner) == []


def test_what_does_not_fit_a_slot_or_finds_it_gone_gets_files_of_its_own() -> None:
    owner = os.getpid()
    slots = shared_memory.Slots(owner, most=4)
    try:
        big = slots.take()
        assert big is not None
        rows = shared_memory.SLOT_BYTES // 12 + 1  # float32 x 3: just over a slot
        result = shared_memory.share(_result(rows), owner, big)
        assert [ref.slot for ref in result.shared.values()] == [False]
        shared_memory.attach(result, slots, big)  # the slot, unused, is back at once
        assert slots.take() == big
        gone = slots.take()
        assert gone is not None
        slots.retire(gone)  # a task that failed: its slot is never lent again
        result = shared_memory.share(_result(200_000), owner, gone)
        assert [ref.slot for ref in result.shared.values()] == [False]
        shared_memory.attach(result)
        values = result.columns["big"]
        assert isinstance(values, RaggedRows)
        np.testing.assert_array_equal(
            values.values, np.arange(600_000, dtype=np.float32).reshape(200_000, 3)
        )
    finally:
        slots.close()
    assert _ours(owner) == []


def test_ragged_values_in_a_slot_are_read_only_views_at_their_offset() -> None:
    owner = os.getpid()
    slots = shared_memory.Slots(owner, most=1)
    try:
        slot = slots.take()
        assert slot is not None
        result = _result(200_000)
        chunks, data = _encoded([[1_100_000]])
        result.columns["image"] = chunks.columns["image"]  # two columns in one slot
        shared_memory.share(result, owner, slot)
        refs = result.shared
        assert sorted(refs) == ["big", "image"]
        assert {ref.name for ref in refs.values()} == {slot}
        assert sorted(ref.offset for ref in refs.values()) == [0, 2_400_000]
        shared_memory.attach(result, slots, slot)
        values = result.columns["big"]
        assert isinstance(values, RaggedRows)
        assert isinstance(values.values, np.ndarray)
        assert not values.values.flags.writeable
        np.testing.assert_array_equal(
            values.values, np.arange(600_000, dtype=np.float32).reshape(200_000, 3)
        )
        image = result.columns["image"]
        assert isinstance(image, EncodedRows)
        assert bytes(image.blocks[0][0].data) == data[0][0]
    finally:
        slots.close()
