"""Compressed chunks decoded outside HDF5: every pixel must match h5py's own read.

Each test writes a small real HDF5 file with h5py (and hdf5plugin for Blosc/Zstd), reads it
through ``Release`` and compares with ``dataset[...]`` read by h5py from the same file.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.readers import Release, _chunks, iter_batches
from h5etl.readers._ahead import prefetched
from h5etl.readers._chunks import ChunkCache
from h5etl.readers._codecs import NotDecodable, Pipeline, unshuffle

SHAPE = (2, 12, 12)
LENGTH = 21  # chunks of 4: the last one holds a single sample


def compressible(dtype: str, length: int = LENGTH, seed: int = 0) -> np.ndarray:
    """Smooth ramps plus a little noise: every codec finds something to gain."""
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(SHAPE[1]), np.arange(SHAPE[2])).astype(np.float64)
    out = np.stack([np.stack([ramp * (i + c + 1) for c in range(SHAPE[0])]) for i in range(length)])
    out += rng.integers(0, 3, size=out.shape)
    if np.dtype(dtype).kind == "f":
        return (out / 7).astype(dtype)
    return (out % np.iinfo(dtype).max).astype(dtype)


def write(
    path: Path,
    data: np.ndarray,
    *,
    chunks: tuple[int, ...] = (4, *SHAPE),
    **filters: Any,
) -> Path:
    """``data`` as ``/train/image`` (plus a text field), chunked and filtered as asked."""
    with h5py.File(path, "w") as handle:
        handle.create_dataset("train/image", data=data, chunks=chunks, **filters)
        names = np.array([f"s{i:03d}" for i in range(len(data))], dtype=object)
        handle.create_dataset("train/name", data=names, dtype=h5py.string_dtype())
    return path


def truth(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as handle:
        return np.asarray(handle["train/image"][...])


def masks(path: Path) -> list[int]:
    with h5py.File(path, "r") as handle:
        dataset = handle["train/image"]
        found: list[int] = []
        dataset.id.chunk_iter(lambda info: found.append(int(info.filter_mask)))
        return found


BLOSC_BIT = hdf5plugin.Blosc.BITSHUFFLE
PIPELINES = [
    pytest.param("uint8", {"compression": "lzf", "shuffle": True}, id="lzf-uint8"),
    pytest.param("uint8", {"compression": "gzip", "compression_opts": 4}, id="gzip"),
    pytest.param("uint16", {"compression": "gzip", "shuffle": True}, id="gzip-shuffle-uint16"),
    pytest.param("uint8", dict(hdf5plugin.Blosc(cname="lz4", clevel=5)), id="blosc-lz4"),
    pytest.param(
        "uint16", dict(hdf5plugin.Blosc("zstd", 5, BLOSC_BIT)), id="blosc-zstd-bitshuffle-u16"
    ),
    pytest.param("float32", dict(hdf5plugin.Zstd(clevel=3)), id="zstd-float32"),
    pytest.param("uint16", {"compression": "lzf", "shuffle": True}, id="lzf-shuffle-uint16"),
    pytest.param("float32", {"compression": "lzf", "shuffle": True}, id="lzf-shuffle-float32"),
    pytest.param("int16", {"shuffle": True}, id="shuffle-only-int16"),
    pytest.param(">f4", {"compression": "gzip", "shuffle": True}, id="gzip-big-endian-float"),
]


@pytest.mark.parametrize(("dtype", "filters"), PIPELINES)
def test_every_codec_decodes_to_hdf5s_own_pixels(
    tmp_path: Path, dtype: str, filters: dict[str, Any]
) -> None:
    path = write(tmp_path / "f.h5", compressible(dtype), **filters)
    expected = truth(path)
    indices = [20, 3, 3, 0, 19, 7, 8, -1, 12]  # unsorted, repeated, negative, the short chunk
    with Release(path, "train") as reader:
        batch = reader.read(indices)
        assert set(reader._stores) == {"image"}  # decoded here, not by HDF5
        block = reader.read_slice(2, 19)
    np.testing.assert_array_equal(batch["image"], expected[indices])
    assert batch["image"].dtype == expected.dtype
    assert list(batch["name"]) == [f"s{i % LENGTH:03d}" for i in indices]
    np.testing.assert_array_equal(block["image"], expected[2:19])


def test_incompressible_lzf_chunks_are_stored_raw_and_read_right(tmp_path: Path) -> None:
    noise = np.random.default_rng(1).integers(0, 256, size=(LENGTH, *SHAPE), dtype=np.uint8)
    noise[:8] = 0  # chunks 0 and 1 compress; 2 to 4 are stored raw, with the lzf bit set
    path = write(tmp_path / "noise.h5", noise, compression="lzf", shuffle=True)
    # (the short last chunk is padded with zeros, so it compresses again)
    assert masks(path) == [0, 0, 0b10, 0b10, 0b10, 0]  # bit 1: filter 1 (lzf) skipped
    with Release(path, "train") as reader:
        np.testing.assert_array_equal(reader.read(list(range(LENGTH)))["image"], noise)
        assert "image" in reader._stores


@pytest.mark.parametrize(
    ("filters", "chunks"),
    [
        pytest.param({"compression": "lzf"}, (4, 2, 6, 12), id="chunks-split-the-sample"),
        pytest.param({"compression": "lzf", "fletcher32": True}, (4, *SHAPE), id="fletcher32"),
        pytest.param(
            {"compression": "gzip", "scaleoffset": 0}, (4, *SHAPE), id="scaleoffset-then-gzip"
        ),
    ],
)
def test_layouts_not_understood_are_read_by_hdf5(
    tmp_path: Path, filters: dict[str, Any], chunks: tuple[int, ...]
) -> None:
    path = write(tmp_path / "f.h5", compressible("uint16"), chunks=chunks, **filters)
    with Release(path, "train") as reader:
        batch = reader.read([5, 1, 20, 1])
        assert reader._stores == {}
    np.testing.assert_array_equal(batch["image"], truth(path)[[5, 1, 20, 1]])


def test_one_value_per_sample_fields_decode_too(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(LENGTH // 3 + 1, dtype=np.int64), 3)[:LENGTH]
    path = tmp_path / "labels.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("train/label", data=labels, chunks=(4,), compression="gzip")
    with Release(path, "train") as reader:
        batch = reader.read([20, 0, 4, 4])
        assert set(reader._stores) == {"label"}
    np.testing.assert_array_equal(batch["label"], labels[[20, 0, 4, 4]])


def test_unallocated_chunks_are_read_by_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "sparse.h5"
    with h5py.File(path, "w") as handle:
        dataset = handle.create_dataset(
            "train/image", shape=(LENGTH, *SHAPE), dtype="uint8", chunks=(4, *SHAPE),
            compression="lzf", fillvalue=7,
        )  # fmt: skip
        dataset[4:8] = compressible("uint8")[4:8]  # one chunk written, the rest fill value
    with Release(path, "train") as reader:
        batch = reader.read([0, 5, 20])
        assert reader._stores == {}
    np.testing.assert_array_equal(batch["image"], truth(path)[[0, 5, 20]])


def test_a_chunk_that_fails_to_decode_is_read_by_hdf5(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "f.h5", compressible("uint8"), compression="lzf")
    with Release(path, "train") as reader:
        reader.read([0])
        store = reader._stores["image"]
        store.sizes[2] -= 5  # chunk 2 (rows 8 to 11) now ends inside its lzf stream
        with caplog.at_level(logging.WARNING, logger="h5etl.readers._chunks"):
            batch = reader.read([9, 8, 1])
    np.testing.assert_array_equal(batch["image"], truth(path)[[9, 8, 1]])
    assert "chunk at row 8 read through h5py" in caplog.text


def test_disabling_the_decoder_reads_the_same_pixels(tmp_path: Path) -> None:
    path = write(tmp_path / "f.h5", compressible("float32"), compression="gzip", shuffle=True)
    reader = Release(path, "train")
    fast = reader.read([3, 2, 1])
    reader.close()
    reader.use_decoder = False
    slow = reader.read([3, 2, 1])
    assert reader._stores == {}
    reader.close()
    np.testing.assert_array_equal(fast["image"], slow["image"])


@pytest.fixture(scope="module")
def lzf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chunks")
    return write(folder / "lzf.h5", compressible("uint16"), compression="lzf", shuffle=True)


@settings(max_examples=60, deadline=None)
@given(indices=st.lists(st.integers(-LENGTH, LENGTH - 1), max_size=40))
def test_any_indices_come_back_in_the_order_asked(lzf_file: Path, indices: list[int]) -> None:
    with Release(lzf_file, "train", batch_size=max(1, len(indices))) as reader:
        batch = reader.read(indices)
    np.testing.assert_array_equal(batch["image"], truth(lzf_file)[indices])
    assert batch["image"].shape == (len(indices), *SHAPE)


def test_returned_rows_are_copies_the_cache_cannot_be_written(lzf_file: Path) -> None:
    with Release(lzf_file, "train") as reader:
        batch = reader.read([0, 1, 2, 3])
        batch["image"][:] = 0  # the caller owns its batch
        np.testing.assert_array_equal(reader.read([0, 1])["image"], truth(lzf_file)[[0, 1]])
        chunk = reader._stores["image"].chunk(0)
        assert not chunk.flags.writeable


def test_prefetched_chunks_are_read_later(lzf_file: Path) -> None:
    with Release(lzf_file, "train", batch_size=8) as reader:
        reader.prefetch([0, 5, 9])
        batch = reader.read([9, 5, 0])
        assert len(reader._stores["image"].cache) >= 1
    np.testing.assert_array_equal(batch["image"], truth(lzf_file)[[9, 5, 0]])


def test_a_closed_readers_queued_read_aheads_decode_nothing(lzf_file: Path) -> None:
    reader = Release(lzf_file, "train", batch_size=4)
    reader.read([0])
    store = reader._stores["image"]
    reader.close()
    assert store.closed
    store.prefetch(np.arange(4, LENGTH))  # queued after the close: all dropped
    _chunks.submit(lambda: None).result()  # FIFO: every read-ahead has been dequeued
    keys: list[Any] = list(store.cache._items)
    assert [key[1] for key in keys] == [0]


# --- the pure pieces -----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    items=st.integers(1, 50),
    itemsize=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 2**16),
)
def test_unshuffle_undoes_hdf5s_byte_shuffle(items: int, itemsize: int, seed: int) -> None:
    raw = np.random.default_rng(seed).integers(0, 256, size=items * itemsize, dtype=np.uint8)
    shuffled = raw.reshape(items, itemsize).T.copy()  # byte j of every item, then byte j+1
    np.testing.assert_array_equal(unshuffle(shuffled.tobytes(), itemsize), raw)


@settings(max_examples=50, deadline=None)
@given(mask=st.integers(0, 3), seed=st.integers(0, 1000))
def test_filters_flagged_in_the_chunk_mask_are_skipped(mask: int, seed: int) -> None:
    import imagecodecs

    raw = np.random.default_rng(seed).integers(0, 4, size=64, dtype=np.uint8).view(np.uint16)
    stored: Any = raw.view(np.uint8).reshape(32, 2).T.tobytes()  # filter 0: shuffle
    if mask & 1:
        stored = raw.tobytes()  # the shuffle was skipped
    if not mask & 2:
        stored = imagecodecs.lzf_encode(stored)  # filter 1: lzf
    pipeline = Pipeline((2, 32000), itemsize=2, nbytes=64)
    np.testing.assert_array_equal(pipeline.decode(stored, mask).view(np.uint16), raw)


def test_a_decoded_size_other_than_the_chunk_is_refused() -> None:
    import imagecodecs

    pipeline = Pipeline((32000,), itemsize=1, nbytes=64)
    with pytest.raises(NotDecodable, match="decoded 32 bytes, the chunk has 64"):
        pipeline.decode(imagecodecs.lzf_encode(bytes(32)), 0)
    with pytest.raises(NotDecodable, match="filter 32000"):
        pipeline.decode(imagecodecs.lzf_encode(bytes(100)), 0)


def test_cache_holds_its_byte_budget_least_recently_used_first_out() -> None:
    cache = ChunkCache(nbytes=300)
    for key in "abc":
        cache.get(key, lambda: np.zeros(100, np.uint8))
    cache.get("a", lambda: pytest.fail("a is cached"))  # a is now the most recent
    cache.get("d", lambda: np.zeros(100, np.uint8))  # evicts b, the least recent
    assert set(cache._items) == {"a", "c", "d"}
    assert cache.held == 300
    cache.get("big", lambda: np.zeros(1000, np.uint8))  # kept alone, past the budget
    assert set(cache._items) == {"big"}


def test_cache_decodes_a_chunk_once_for_two_threads_and_forgets_failures() -> None:
    cache = ChunkCache(nbytes=1000)
    calls: list[int] = []
    started = threading.Event()

    def slow() -> np.ndarray:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return np.ones(10, np.uint8)

    other = threading.Thread(target=cache.get, args=("k", slow))
    other.start()
    started.wait(5)
    assert cache.get("k", slow).sum() == 10  # waited for the other thread's decode
    other.join()
    assert calls == [1]

    def broken() -> np.ndarray:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        cache.get("bad", broken)
    assert "bad" not in cache._items  # the next read tries again


# --- prefetch -------------------------------------------------------------------------------


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("h5etl-prefetch")]


def test_prefetched_batches_equal_the_plain_ones_in_order(lzf_file: Path) -> None:
    def epoch(prefetch: int) -> list[dict[str, Any]]:
        return list(iter_batches(lzf_file, "train", 4, seed=2, epoch=1, prefetch=prefetch))

    plain, ahead = epoch(0), epoch(3)
    assert len(plain) == len(ahead) == 6
    for one, two in zip(plain, ahead, strict=True):
        np.testing.assert_array_equal(one["image"], two["image"])
        assert list(one["name"]) == list(two["name"])


def test_a_reading_error_reaches_the_consumer_in_order() -> None:
    def read(batch: np.ndarray) -> dict[str, np.ndarray]:
        if int(batch[0]) == 3:
            raise OSError("bad sector")
        return {"x": batch}

    batches = prefetched(read, [np.array([i]) for i in range(8)], 2)
    assert [int(next(batches)["x"][0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="bad sector"):
        next(batches)
    assert not _prefetch_threads()


def _slow_batches() -> Iterator[np.ndarray]:
    for i in range(1000):
        yield np.array([i])


def test_closing_or_dropping_the_iterator_stops_its_threads(lzf_file: Path) -> None:
    batches = iter_batches(lzf_file, "train", 4, prefetch=2)
    next(batches)
    assert _prefetch_threads()
    batches.close()
    assert not _prefetch_threads()

    dropped = prefetched(lambda b: {"x": b}, _slow_batches(), 4)
    next(dropped)
    del dropped
    gc.collect()
    assert not _prefetch_threads()


def test_uncompressed_fields_are_read_without_threads(tmp_path: Path) -> None:
    path = write(tmp_path / "raw.h5", compressible("uint8"))
    with h5py.File(path, "a") as handle:
        del handle["train/name"]  # text goes through h5py, which prefetching would help
    batches = iter_batches(path, "train", 4, shuffle=False, prefetch=4)
    first = next(batches)
    assert not _prefetch_threads()
    np.testing.assert_array_equal(first["image"], truth(path)[:4])
    batches.close()


def test_prefetch_must_not_be_negative(lzf_file: Path) -> None:
    with pytest.raises(ValueError, match="prefetch must be >= 0, got -1"):
        next(iter_batches(lzf_file, "train", 4, prefetch=-1))


# --- fork -----------------------------------------------------------------------------------


def _child_reads(reader: Release, queue: Any) -> None:
    before = _chunks._POOL
    rows = reader.read([0, 4, 8, 12, 16, 20])["image"]  # six chunks: the decode pool works
    store = reader._stores["image"]
    pool = _chunks._POOL
    queue.put((before is None, store.file.pid == os.getpid(), pool is not None and pool[0], rows))


def test_a_forked_child_decodes_with_its_own_descriptor_cache_and_pool(lzf_file: Path) -> None:
    reader = Release(lzf_file, "train")
    reader.read([1, 5, 9])  # the parent holds a descriptor, a warm cache and a decode pool
    assert _chunks._POOL is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(reader, queue))
    child.start()
    no_pool_inherited, own_file, pool_pid, rows = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert no_pool_inherited
    assert own_file
    assert pool_pid == child.pid
    np.testing.assert_array_equal(rows, truth(lzf_file)[[0, 4, 8, 12, 16, 20]])
    assert reader._stores == {}  # the parent closed before the fork and reopens lazily
    np.testing.assert_array_equal(reader.read([2])["image"], truth(lzf_file)[[2]])
    reader.close()


def _nothing() -> None:
    pass


def test_forks_while_a_prefetching_iterator_reads_leave_its_batches_whole(lzf_file: Path) -> None:
    # Handles close before every fork: a prefetching thread mid-read must finish first, and
    # must not reopen the file until the fork is done.
    expected = truth(lzf_file)
    context = multiprocessing.get_context("fork")
    batches = iter_batches(lzf_file, "train", 2, shuffle=False, prefetch=3)
    seen = []
    for batch in batches:
        child = context.Process(target=_nothing)
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        seen.append(batch)
    rows = np.concatenate([b["image"] for b in seen])
    np.testing.assert_array_equal(rows, expected)
    assert [n for b in seen for n in b["name"]] == [f"s{i:03d}" for i in range(LENGTH)]


# --- the decoded cache across epochs --------------------------------------------------------

CHUNKS = 6  # LENGTH samples in chunks of 4


def _epochs(reader: Release, epochs: int, prefetch: int) -> list[list[dict[str, np.ndarray]]]:
    return [list(reader.iter_batches(4, epoch=epoch, prefetch=prefetch)) for epoch in range(epochs)]


def _assert_whole_epoch(path: Path, batches: list[dict[str, np.ndarray]]) -> None:
    names = [str(n) for b in batches for n in b["name"]]
    assert sorted(names) == [f"s{i:03d}" for i in range(LENGTH)]
    rows = [int(n[1:]) for n in names]
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in batches]), truth(path)[rows])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_split_cache_decodes_each_chunk_once_over_all_epochs(
    lzf_file: Path, prefetch: int
) -> None:
    with Release(lzf_file, "train", batch_size=4, cache_bytes="split") as reader:
        epochs = _epochs(reader, 3, prefetch)
        assert reader._stores["image"].cache.loads == CHUNKS
    for batches in epochs:
        _assert_whole_epoch(lzf_file, batches)
    assert [b["name"].tolist() for b in epochs[0]] != [b["name"].tolist() for b in epochs[1]]


def test_the_default_cache_decodes_every_epoch_again(lzf_file: Path) -> None:
    with Release(lzf_file, "train", batch_size=4) as reader:
        epochs = _epochs(reader, 2, prefetch=0)
        assert reader._stores["image"].cache.loads > CHUNKS
    for batches in epochs:
        _assert_whole_epoch(lzf_file, batches)


def test_decoded_nbytes_counts_whole_chunks_of_compressed_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "lzf.h5", compressible("uint16"), compression="lzf")
    with Release(path, "train") as reader:
        assert reader.decoded_nbytes == CHUNKS * 4 * 2 * 12 * 12 * 2  # the last chunk whole
    with Release(write(tmp_path / "raw.h5", compressible("uint16")), "train") as raw:
        assert raw.decoded_nbytes == 0  # mapped from the page cache: nothing to decode


def _hdf5_cache_bytes(reader: Release) -> int:
    nbytes: int = reader.datasets()["image"].id.get_access_plist().get_chunk_cache()[1]
    return nbytes


def test_cache_bytes_sizes_hdf5s_cache_for_fields_it_reads(tmp_path: Path) -> None:
    path = write(tmp_path / "f.h5", compressible("uint8"), compression="gzip", fletcher32=True)
    with Release(path, "train", batch_size=4) as default:
        sized = _hdf5_cache_bytes(default)
        assert default._stores == {}  # fletcher32: read by h5py
    with Release(path, "train", batch_size=4, cache_bytes=10_000_000) as wide:
        assert _hdf5_cache_bytes(wide) == 10_000_000
        np.testing.assert_array_equal(wide.read([5, 1])["image"], truth(path)[[5, 1]])
    with Release(path, "train", batch_size=4, cache_bytes=1) as small:
        assert _hdf5_cache_bytes(small) == sized  # never below what one batch needs
    with Release(path, "train", batch_size=4, cache_bytes="split") as whole:
        assert _hdf5_cache_bytes(whole) == whole.decoded_nbytes == CHUNKS * 4 * 2 * 12 * 12


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1, "cache_bytes must be >= 0, got -1"), ("all", "an int, 'split' or None, got 'all'")],
)
def test_bad_cache_bytes_are_refused(lzf_file: Path, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Release(lzf_file, "train", cache_bytes=value)


def test_a_split_larger_than_half_the_free_memory_is_capped_with_a_warning(
    lzf_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from h5etl.readers import _core

    chunk = 4 * 2 * 12 * 12 * 2
    monkeypatch.setattr(_core, "available_memory", lambda: 6 * chunk)  # room for 3 chunks
    with Release(lzf_file, "train", batch_size=4, cache_bytes="split") as reader:
        with caplog.at_level(logging.WARNING, logger="h5etl.readers._core"):
            epochs = _epochs(reader, 2, prefetch=0)  # the cap is worked out on opening
        assert "more than this process's share of half" in caplog.text
        assert str(lzf_file) in caplog.text
        cache = reader._stores["image"].cache
        assert cache.nbytes == 3 * chunk
        assert cache.loads > CHUNKS  # the capped cache evicts, and reads stay right
    for batches in epochs:
        _assert_whole_epoch(lzf_file, batches)


def test_a_fork_keeps_the_readers_decoded_chunks(lzf_file: Path) -> None:
    with Release(lzf_file, "train", batch_size=4, cache_bytes="split") as reader:
        first = _epochs(reader, 1, prefetch=2)
        cache = reader._stores["image"].cache
        child = multiprocessing.get_context("fork").Process(target=_nothing)
        child.start()  # closes the reader's HDF5 handle first, as every fork does
        child.join()
        assert child.exitcode == 0
        assert not reader.is_open
        later = _epochs(reader, 2, prefetch=2)
        assert reader._stores["image"].cache is cache
        assert cache.loads == CHUNKS  # nothing decoded twice
    for batches in first + later:
        _assert_whole_epoch(lzf_file, batches)


def test_closing_the_reader_drops_its_decoded_chunks(lzf_file: Path) -> None:
    reader = Release(lzf_file, "train", batch_size=4, cache_bytes="split")
    _epochs(reader, 1, prefetch=0)
    cache = reader._stores["image"].cache
    reader.close()
    _epochs(reader, 1, prefetch=0)
    assert reader._stores["image"].cache is not cache  # the memory went with close()
    assert reader._stores["image"].cache.loads == CHUNKS
    reader.close()


def test_a_byte_budget_is_shared_by_field_size_and_hdf5_fields_keep_their_own(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "mixed.h5", compressible("uint8"), compression="lzf")
    with h5py.File(path, "a") as handle:  # a second field only h5py reads, half the size
        data = compressible("uint8")[:, :1]
        handle.create_dataset(
            "train/other", data=data, chunks=(4, 1, 12, 12), compression="gzip", fletcher32=True
        )
    budget = 30_000
    with Release(path, "train", fields=["image", "other"], batch_size=4, cache_bytes=budget) as r:
        caches = r.process_caches()
        assert caches["image"].nbytes == budget * 2 // 3
        assert caches["other"].nbytes == budget // 3
        r.read([0])
        assert set(r._stores) == {"image"}
        assert r._stores["image"].cache.nbytes == caches["image"].nbytes  # not other's too
        other = r.datasets()["other"].id.get_access_plist().get_chunk_cache()[1]
        assert other == caches["other"].nbytes
        batch = r.read([7, 2])
    np.testing.assert_array_equal(batch["image"], truth(path)[[7, 2]])
    np.testing.assert_array_equal(batch["other"], compressible("uint8")[[7, 2], :1])


@pytest.mark.parametrize("value", [1.5e9, True, b"split", [1]])
def test_cache_bytes_of_the_wrong_type_are_refused(lzf_file: Path, value: Any) -> None:
    with pytest.raises(TypeError, match="cache_bytes must be an int, 'split' or None"):
        Release(lzf_file, "train", cache_bytes=value)


def test_cache_bytes_takes_any_integer(lzf_file: Path) -> None:
    with Release(lzf_file, "train", batch_size=4, cache_bytes=np.int64(10**6)) as reader:
        assert reader.cache_bytes == 10**6
        assert reader.process_caches()["image"].nbytes == 10**6
    with pytest.raises(ValueError, match="cache_bytes must be >= 0, got -1"):
        Release(lzf_file, "train", cache_bytes=np.int64(-1))


def test_the_memory_cap_is_shared_by_the_reading_processes(
    lzf_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from h5etl.readers import _core

    chunk = 4 * 2 * 12 * 12 * 2
    monkeypatch.setattr(_core, "available_memory", lambda: 12 * chunk)
    reader = Release(lzf_file, "train", batch_size=4, cache_bytes="split")
    assert reader.process_caches()["image"].nbytes == CHUNKS * chunk  # fits half of 12
    assert not caplog.text
    reader.processes = 3
    with caplog.at_level(logging.WARNING, logger="h5etl.readers._core"):
        assert reader.process_caches()["image"].nbytes == 2 * chunk  # a third of 6 chunks
    assert "(3 reading processes)" in caplog.text


def _cgroup_root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal: 9000 kB\nMemAvailable: 8000 kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("cgroup", "files", "expected"),
    [
        pytest.param("", {}, 8000 * 1024, id="no-cgroup"),
        pytest.param(
            "0::/job\n",
            {
                "sys/fs/cgroup/job/memory.max": "4096000\n",
                "sys/fs/cgroup/job/memory.current": "96000",
            },
            4_000_000,
            id="v2-limit",
        ),
        pytest.param(
            "0::/job\n",
            {"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "5"},
            8000 * 1024,
            id="v2-namespaced-unlimited",
        ),
        pytest.param(
            "4:memory:/slot\n1:cpu:/\n",
            {
                "sys/fs/cgroup/memory/slot/memory.limit_in_bytes": "1000000",
                "sys/fs/cgroup/memory/slot/memory.usage_in_bytes": "250000",
            },
            750_000,
            id="v1-limit",
        ),
        pytest.param(
            "4:memory:/slot\n",
            {
                "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
                "sys/fs/cgroup/memory/memory.usage_in_bytes": "250000",
            },
            8000 * 1024,
            id="v1-unlimited",
        ),
    ],
)
def test_available_memory_honours_cgroup_limits(
    tmp_path: Path, cgroup: str, files: dict[str, str], expected: int
) -> None:
    from h5etl.readers._layout import available_memory

    assert available_memory(_cgroup_root(tmp_path, cgroup, files)) == expected


def test_available_memory_is_unknown_without_proc(tmp_path: Path) -> None:
    from h5etl.readers._layout import available_memory

    assert available_memory(tmp_path) is None
