"""arena: a local worker compresses its chunks straight into the shared-memory slot it was
lent; the parent gets the very bytes a plain encode makes, whatever the codec, the sizes or
the room left."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from h5etl.config.sections import Compression
from h5etl.dataflow import BatchResult, DecodeTask, EncodedChunk, EncodedRows
from h5etl.decode import worker_memory
from h5etl.execute import arena, shared_memory
from h5etl.format.codec import ChunkLayout, encode_block, encode_direct

pytestmark = pytest.mark.skipif(not shared_memory.SHM.is_dir(), reason="no /dev/shm here")

SHAPE = (3, 40, 50)
LAYOUTS = [
    pytest.param(Compression(codec="blosc", cname="lz4"), id="blosc-lz4"),
    pytest.param(Compression(codec="lzf"), id="lzf"),
]


def _layout(compression: Compression) -> ChunkLayout:
    return ChunkLayout(SHAPE, "uint8", (8, *SHAPE), compression, True)


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (8, *SHAPE), dtype=np.uint8)
    rows[:, :, :25] = seed  # half flat: it compresses
    return rows


def _result(blocks: list[list[EncodedChunk]], column: str = "image") -> BatchResult:
    result = BatchResult(DecodeTask("train", 0, (), 1, 1), 8 * len(blocks))
    result.columns = {column: EncodedRows(blocks, [b"d" * 32] * len(blocks))}
    return result


def _bytes(result: BatchResult, column: str = "image") -> list[bytes]:
    rows = result.columns[column]
    assert isinstance(rows, EncodedRows)
    return [bytes(chunk.data) for block in rows.blocks for chunk in block]


def _ours(owner: int) -> list[Path]:
    return sorted(shared_memory.SHM.glob(f"{shared_memory.PREFIX}-{owner}-*"))


@contextlib.contextmanager
def _task(slot: str | None) -> Iterator[arena.Arena | None]:
    """As ``schedule.run_pooled`` runs a task: busy, the lent slot the codecs' destination."""
    with worker_memory.busy(), arena.writing_into(slot) as placed:
        yield placed


@dataclass
class Lent:
    """A slot the parent (this process, ``owner``) lent a task, from its ``slots``."""

    owner: int
    slots: shared_memory.Slots
    slot: str


@pytest.fixture
def lent() -> Iterator[Lent]:
    owner = os.getpid()
    slots = shared_memory.Slots(owner, most=1)
    slot = slots.take()
    assert slot is not None
    try:
        yield Lent(owner, slots, slot)
    finally:
        slots.close()
    assert _ours(owner) == []  # the slot, and no file of a result's own, is left


@pytest.mark.parametrize("compression", LAYOUTS)
def test_chunks_compressed_into_the_slot_reach_the_parent_unchanged(
    compression: Compression, lent: Lent
) -> None:
    layout = _layout(compression)
    blocks = [_rows(seed) for seed in (1, 2, 3)]
    expected = [bytes(encode_block(layout, rows)[0].data) for rows in blocks]
    with _task(lent.slot) as placed:
        assert placed is not None
        encoded = [encode_block(layout, rows) for rows in blocks]
        assert all(isinstance(c[0].data, memoryview) for c in encoded)
        assert placed.used == sum(len(e) for e in expected)
        # the small column (under shared_memory.MIN_BYTES) travels in the slot too
        result = shared_memory.share(_result(encoded), lent.owner, lent.slot, placed)
    ref = result.shared["image"]
    assert isinstance(ref, shared_memory.SharedChunks)
    assert ref.slot
    assert len(ref.starts) == 3
    assert _bytes(result) == [b"", b"", b""]  # nothing of the slot goes through the pipe
    shared_memory.attach(result, lent.slots, lent.slot)
    assert _bytes(result) == expected
    with _task(lent.slot) as again:  # the worker's next task in this slot
        assert again is placed  # mapped once: its pages are faulted in once
        assert again.used == 0


def test_a_full_arena_leaves_chunks_as_bytes_written_after_it(
    monkeypatch: pytest.MonkeyPatch, lent: Lent
) -> None:
    layout = _layout(Compression(codec="blosc", cname="lz4"))
    first, second = _rows(4), _rows(5)
    with _task(lent.slot) as placed:
        assert placed is not None
        in_slot, mask = encode_block(layout, first), encode_block(layout, first)
        monkeypatch.setattr(arena, "SLOT_BYTES", placed.used)  # full from here
        monkeypatch.setattr(shared_memory, "MIN_BYTES", 1)  # every column is shared
        as_bytes = encode_block(layout, second)
        assert isinstance(in_slot[0].data, memoryview)
        assert isinstance(mask[0].data, memoryview)
        assert isinstance(as_bytes[0].data, bytes)
        result = _result([in_slot, as_bytes])  # a column partly in the arena
        result.columns["mask"] = EncodedRows([mask], [b"d" * 32])  # one all in it
        shared_memory.share(result, lent.owner, lent.slot, placed)
    image, in_place = result.shared["image"], result.shared["mask"]
    assert isinstance(image, shared_memory.SharedChunks)
    assert isinstance(in_place, shared_memory.SharedChunks)
    assert in_place.starts
    assert in_place.slot
    assert not image.starts  # written into the slot after the arena
    assert image.slot
    assert image.offset == sum(len(c.data) for c in in_slot + mask)
    shared_memory.attach(result, lent.slots, lent.slot)
    expected = [bytes(encode_block(layout, rows)[0].data) for rows in (first, second)]
    assert _bytes(result) == expected
    assert _bytes(result, "mask") == expected[:1]


def test_chunks_of_a_slot_the_parent_gave_up_leave_as_bytes(lent: Lent) -> None:
    """The build stopped (the slot is gone before the result is shared): the chunks still
    reach the parent whole, and nothing keeps viewing the worker's mapping."""
    layout = _layout(Compression(codec="lzf"))
    rows = _rows(6)
    with _task(lent.slot) as placed:
        assert placed is not None
        encoded = encode_block(layout, rows)
        lent.slots.retire(lent.slot)
        result = shared_memory.share(_result([encoded]), lent.owner, lent.slot, placed)
    chunk = result.columns["image"].blocks[0][0]  # type: ignore[union-attr]
    assert not isinstance(chunk.data, memoryview)  # nothing views the worker's mapping
    assert not result.shared["image"].slot  # a file of its own instead of the gone slot
    shared_memory.attach(result)
    assert _bytes(result) == [bytes(encode_block(layout, rows)[0].data)]
    assert arena._mapped(lent.slot) is None  # the gone file's mapping is dropped
    assert lent.slot not in arena._ARENAS


def test_a_block_that_does_not_compress_takes_no_room(lent: Lent) -> None:
    layout = _layout(Compression(codec="lzf"))
    noise = np.random.default_rng(7).integers(0, 256, (8, *SHAPE), dtype=np.uint8)
    with _task(lent.slot) as placed:
        assert placed is not None
        assert encode_direct(layout, noise) is None  # HDF5 stores it raw
        assert placed.used == 0
        stored = encode_block(layout, noise)  # through HDF5: bytes, its filter flagged skipped
        assert isinstance(stored[0].data, bytes)
        assert stored[0].filter_mask != 0


def test_without_a_slot_chunks_are_plain_bytes() -> None:
    layout = _layout(Compression(codec="blosc", cname="lz4"))
    with _task(None) as placed:
        assert placed is None
        assert isinstance(encode_block(layout, _rows(8))[0].data, bytes)
    with _task("h5etl-values-no-such-slot") as placed:
        assert placed is None


def test_a_worker_that_idles_forgets_its_mapped_slots(
    monkeypatch: pytest.MonkeyPatch, lent: Lent
) -> None:
    """The parent removes its slots when the build ends; a worker of a pool that outlives
    the build (a notebook's) must not keep their pages mapped."""
    monkeypatch.setattr(arena, "IDLE_DROP_SECONDS", 0.05)
    layout = _layout(Compression(codec="lzf"))
    with _task(lent.slot) as placed:
        assert placed is not None
        encode_block(layout, _rows(9))
    assert lent.slot in arena._ARENAS  # kept for the next task in this slot
    deadline = time.monotonic() + 10
    while lent.slot in arena._ARENAS and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lent.slot not in arena._ARENAS
