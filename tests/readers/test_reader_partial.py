"""Random reads that decode only part of a chunk, and the cache that keeps whole ones.

Releases are built here by ``h5etl.build`` from tiny PNG folders, one per codec h5etl
writes; every read is compared with what HDF5 itself (h5py, hdf5plugin's filters) reads
from the same file. Blosc frames for the pure tests come from imagecodecs' encoder, which
the writer uses.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any, cast

import h5py
import hdf5plugin  # (also registers Blosc and Zstd for the truth read)
import imagecodecs
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import h5etl
from h5etl.readers import Release
from h5etl.readers._chunks import PART_OF, REMEMBERED, ChunkStore
from h5etl.readers._codecs import BLOSC, SHUFFLE, Pipeline, blosc_range

SIDE = 64  # 12 KiB an image row: a chunk of 16 rows spans several Blosc blocks
CHUNK = 16
COUNT = 40  # chunks of 16, 16 and 8 (the last one short)
CODECS: dict[str, Any] = {
    "none": "none",
    "lzf": "lzf",
    "gzip": "gzip",
    "zstd": "zstd",
    "blosc-lz4": {"codec": "blosc", "cname": "lz4"},  # the default
    "blosc-lz4hc-bit": {"codec": "blosc", "cname": "lz4hc", "blosc_shuffle": "bit"},
    "blosc-zstd": {"codec": "blosc", "cname": "zstd", "level": 3},
    "blosc-zlib-noshuffle": {"codec": "blosc", "cname": "zlib", "blosc_shuffle": "none"},
    "blosc-blosclz": {"codec": "blosc", "cname": "blosclz"},
}
BLOSC_CODECS = [name for name in CODECS if name.startswith("blosc")]


def write_raw(root: Path, count: int = COUNT, *, classes: int = 0) -> None:
    """``count`` RGB images (40..64 px, smooth so they compress) with 0/255 masks under raw/;
    with ``classes``, the images sit in one folder per class and there are no masks."""
    rng = np.random.default_rng(7)
    for index in range(count):
        height, width = (int(v) for v in rng.integers(40, SIDE + 1, size=2))
        ramp = np.add.outer(np.arange(height), np.arange(width))[..., None] * (index % 5 + 1)
        image = ((ramp + rng.integers(0, 4, (height, width, 3))) % 256).astype(np.uint8)
        folder = root / "raw" / "images"
        if classes:
            folder = folder / f"class{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"s_{index:03d}.png")
        if not classes:
            mask = ((ramp[..., 0] // 16) % 2 * 255).astype(np.uint8)
            (root / "raw" / "masks").mkdir(parents=True, exist_ok=True)
            Image.fromarray(mask).save(root / "raw" / "masks" / f"s_{index:03d}.png")


def build(root: Path, name: str, compression: Any, **extra: Any) -> Path:
    """A one-split release of the raw folder under ``root``; returns its link."""
    config: dict[str, Any] = {
        "name": "cells",
        "pipeline": "segmentation",
        "output": f"releases/{name}",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "splits": {"train": 1.0},
        "fields": {
            "image": {"shape": [3, SIDE, SIDE], "dtype": "uint8", "mode": "RGB"},
            "mask": {"shape": [1, SIDE, SIDE], "dtype": "uint8", "mode": "L", "values": [0, 1]},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": CHUNK, "compression": compression},
        **extra,
    }
    (root / f"{name}.yaml").write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(root / f"{name}.yaml"), jobs=1)
    assert report.link is not None
    return report.link


def truth(path: Path, fields: tuple[str, ...] = ("image", "mask")) -> dict[str, Any]:
    """Every field read by HDF5 itself."""
    with h5py.File(path, "r") as handle:
        out: dict[str, Any] = {name: handle[f"train/{name}"][...] for name in fields}
        out["filename"] = np.array(handle["train/filename"].asstr()[...], dtype=object)
    return out


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One release per codec, of the same 40 samples."""
    root = tmp_path_factory.mktemp("partial")
    write_raw(root)
    return {name: build(root, name, compression) for name, compression in CODECS.items()}


def store(reader: Release, field: str = "image") -> ChunkStore:
    return reader._handles()[2][field]


def keys(held: Iterable[Hashable]) -> list[tuple[str, int]]:
    """A cache's keys: (dataset name, first row of the chunk)."""
    return [cast(tuple[str, int], key) for key in held]


def assert_rows(batch: dict[str, Any], expected: dict[str, Any], rows: list[int]) -> None:
    for name, values in expected.items():
        np.testing.assert_array_equal(batch[name], values[rows], err_msg=name)


# --- every codec: single random reads and random batches, against HDF5 ---------------------


@pytest.mark.parametrize("codec", list(CODECS))
def test_random_reads_equal_hdf5s_for_every_codec(releases: dict[str, Path], codec: str) -> None:
    path = releases[codec]
    expected = truth(path)
    order = [*np.random.default_rng(3).permutation(COUNT).tolist(), 0, COUNT - 1, -1, 5, 5]
    with Release(path, "train", batch_size=1) as reader:
        for index in order:
            assert_rows(reader.read([index]), expected, [index])
        picked = [int(i) for i in np.random.default_rng(4).integers(0, COUNT, 12)]
        assert_rows(reader.read(picked), expected, picked)
        stores = reader._handles()[2]
        parts = sum(s.cache.parts for s in stores.values()) if stores else 0
    # Blosc reads part of a chunk; the other codecs are one stream a chunk, decoded whole.
    assert (parts > 0) == (codec in BLOSC_CODECS)


@pytest.mark.parametrize("codec", BLOSC_CODECS)
def test_a_part_decodes_to_the_same_rows_as_the_whole_chunk(
    releases: dict[str, Path], codec: str
) -> None:
    with Release(releases[codec], "train", batch_size=1) as reader:
        for field in ("image", "mask"):
            chunks = store(reader, field)
            assert chunks.partial
            for base in range(0, COUNT, CHUNK):
                whole = chunks.chunk(base)
                rows = min(CHUNK, COUNT - base)
                for first in range(rows):
                    for stop in range(first + 1, min(rows, first + CHUNK // PART_OF) + 1):
                        part = chunks._part(base, first, stop)
                        assert part is not None
                        np.testing.assert_array_equal(part, whole[first:stop])


# --- the cache: miss (part), second touch (whole, kept), hit, eviction ----------------------


def test_a_miss_in_a_full_cache_reads_a_part_and_a_second_touch_keeps_the_chunk(
    releases: dict[str, Path],
) -> None:
    expected = truth(releases["blosc-lz4"])
    with Release(releases["blosc-lz4"], "train", batch_size=1) as reader:
        cache = store(reader).cache
        assert cache.nbytes == 2 * CHUNK * 4 * SIDE * SIDE  # two chunks of image and of mask
        for index, parts, loads in [
            (20, 0, 2),  # the cache has room: decoded whole and kept (image and mask)
            (35, 0, 4),  # room for this one too; now it is full
            (3, 2, 4),  # full: a part of each field, nothing kept
            (4, 2, 6),  # touched again: decoded whole and kept, chunk 1 evicted
            (0, 2, 6),  # a hit
            (21, 4, 6),  # chunk 1 again: evicted, so a part
            (36, 4, 6),  # chunk 2: still held
        ]:
            assert_rows(reader.read([index]), expected, [index])
            assert (cache.parts, cache.loads) == (parts, loads), index
        assert cache.held <= cache.nbytes
        assert sorted(base for _, base in keys(cache._items)) == [0, 0, 2 * CHUNK, 2 * CHUNK]


def test_rows_read_one_by_one_in_order_decode_each_chunk_once(releases: dict[str, Path]) -> None:
    expected = truth(releases["blosc-lz4"])
    with Release(releases["blosc-lz4"], "train", batch_size=1) as reader:
        for index in range(COUNT):
            assert_rows(reader.read([index]), expected, [index])
        cache = store(reader).cache
    # chunks 0 and 1 fill the cache; chunk 2: a part, then the whole (image and mask each)
    assert (cache.parts, cache.loads) == (2, 6)


def test_a_split_cache_decodes_each_chunk_once_whatever_the_order(
    releases: dict[str, Path],
) -> None:
    path = releases["blosc-lz4"]
    expected = truth(path)
    rng = np.random.default_rng(5)
    with Release(path, "train", batch_size=1, cache_bytes="split") as reader:
        for index in rng.integers(0, COUNT, 60).tolist():
            assert_rows(reader.read([index]), expected, [index])
        cache = store(reader).cache
        assert cache.loads == len(cache) == 2 * -(-COUNT // CHUNK)  # every chunk, once
        assert cache.parts == 0  # the memory is there: no chunk is worth reading in part


def test_whole_chunk_batches_never_decode_in_part(releases: dict[str, Path]) -> None:
    path = releases["blosc-lz4"]
    expected = truth(path)
    with Release(path, "train", batch_size=CHUNK) as reader:
        batches = list(reader.iter_batches(CHUNK, prefetch=0))
        cache = store(reader).cache
        assert cache.parts == 0
        assert cache.loads == 2 * -(-COUNT // CHUNK)
    row_of = {str(name): row for row, name in enumerate(expected["filename"])}
    for batch in batches:
        assert_rows(batch, expected, [row_of[str(name)] for name in batch["filename"]])
    assert sum(len(batch["filename"]) for batch in batches) == COUNT


def test_the_chunks_remembered_are_those_of_the_last_two_reads(
    releases: dict[str, Path],
) -> None:
    with Release(releases["blosc-lz4"], "train", batch_size=1, cache_bytes=0) as reader:
        cache = store(reader).cache
        assert cache.remember == 2 * REMEMBERED == 4  # two fields share the cache
        cache.nbytes = 0  # no room at all: every miss of a few rows reads a part
        for index in (0, 16, 32):  # three chunks, image and mask: six keys met
            reader.read([index])
        assert (cache.parts, cache.loads) == (6, 0)
        assert [base for _, base in keys(cache._seen)] == [16, 16, 32, 32]
        reader.read([1])  # chunk 0 was forgotten: read in part again
        assert (cache.parts, cache.loads) == (8, 0)
        reader.read([33])  # chunk 2 is remembered: decoded whole
        assert (cache.parts, cache.loads) == (8, 2)


# --- labels, ragged columns, DataLoader workers --------------------------------------------


def test_labels_come_with_the_images_read_in_part(tmp_path: Path) -> None:
    write_raw(tmp_path, COUNT, classes=3)
    config = {
        "name": "shapes",
        "pipeline": "classification",
        "output": "releases",
        "sources": {"image": {"dir": "raw/images", "glob": "**/*.png"}},
        "splits": {"train": 1.0},
        "fields": {
            "image": {"shape": [3, SIDE, SIDE]},
            "label": {"kind": "label", "source": "image", "from": "folder"},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": CHUNK},  # the default codec: Blosc lz4
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    link = h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"), jobs=1).link
    assert link is not None
    expected = truth(link, ("image", "label"))
    with Release(link, "train", batch_size=1) as reader:
        for index in np.random.default_rng(2).permutation(COUNT).tolist():
            assert_rows(reader.read([index]), expected, [index])
        assert store(reader).cache.parts > 0


def test_ragged_columns_read_beside_columns_read_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragged_kind import use_npy_recording

    rng = np.random.default_rng(3)
    (tmp_path / "raw" / "rec").mkdir(parents=True)
    for i in range(20):
        rows = rng.normal(size=(int(rng.integers(0, 12)), 3)).astype(np.float32)
        np.save(tmp_path / "raw" / "rec" / f"r{i:02d}.npy", rows)
    config = {
        "name": "rec",
        "output": "releases",
        "sources": {"rec": {"dir": "raw/rec", "glob": "*.npy"}},
        "splits": {"train": 1.0},
        "storage": {"chunk_samples": CHUNK},
        "fields": {"rec": {"kind": "image", "shape": [1, 4, 4], "mode": "L"}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    use_npy_recording(monkeypatch, "rec", codec="blosc")
    link = h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"), jobs=1).link
    assert link is not None
    with Release(link, "train", batch_size=1) as reader:
        whole = reader.read_slice(0, len(reader))
        for index in np.random.default_rng(1).permutation(len(reader)).tolist():
            one = reader.read([index])
            for name, values in whole.items():
                if values.dtype == object and name == "rec":
                    np.testing.assert_array_equal(one[name][0], values[index])
                else:
                    np.testing.assert_array_equal(one[name], values[[index]], err_msg=name)


def with_counts(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform run in the worker: the sample, this process and its cache's counts."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is None:  # the main process
        return sample
    dataset: Any = info.dataset  # our H5Dataset, in this worker
    cache = store(dataset.release).cache
    return {**sample, "pid": os.getpid(), "parts": cache.parts, "loads": cache.loads}


def test_dataloader_workers_read_in_part_with_caches_of_their_own(
    releases: dict[str, Path],
) -> None:
    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    path = releases["blosc-lz4"]
    expected = truth(path)
    dataset = H5Dataset(path, "train", batch_size=1, transform=with_counts)
    dataset[7]  # the parent reads first: its cache must not reach the workers' reads
    parent = store(dataset.release).cache
    counts = (parent.parts, parent.loads)
    order = np.random.default_rng(8).permutation(COUNT).tolist()
    loader = torch.utils.data.DataLoader(
        dataset,
        sampler=order,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("fork"),
    )
    samples = list(loader)
    for index, sample in zip(order, samples, strict=True):
        np.testing.assert_array_equal(np.asarray(sample["image"]), expected["image"][index])
        np.testing.assert_array_equal(np.asarray(sample["mask"]), expected["mask"][index])
        assert sample["filename"] == expected["filename"][index]
    workers: dict[int, tuple[int, int]] = {}
    for sample in samples:  # each worker's counts only grow, from its own empty cache
        pid = int(sample["pid"])
        now = (int(sample["parts"]), int(sample["loads"]))
        assert now >= workers.get(pid, (0, 0))
        workers[pid] = now
    assert len(workers) == 2
    assert os.getpid() not in workers
    assert all(parts > 0 and loads >= 4 for parts, loads in workers.values())
    assert (parent.parts, parent.loads) == counts  # the workers decoded in their own caches
    assert store(dataset.release).cache is parent
    dataset.close()


@pytest.mark.parametrize(
    ("dtype", "filters"),
    [
        pytest.param("uint16", {"cname": "lz4", "shuffle": 2}, id="lz4-bitshuffle-uint16"),
        pytest.param("float32", {"cname": "zstd", "shuffle": 1}, id="zstd-shuffle-float32"),
        pytest.param(">i8", {"cname": "blosclz", "shuffle": 1}, id="blosclz-big-endian-int64"),
        pytest.param("uint8", {"cname": "lz4hc", "shuffle": 0}, id="lz4hc-noshuffle-uint8"),
    ],
)
def test_wider_items_written_by_hdf5s_own_blosc_filter_read_in_part(
    tmp_path: Path, dtype: str, filters: dict[str, Any]
) -> None:
    # frames from hdf5plugin's filter (as h5py writes them), items of 1 to 8 bytes
    rng = np.random.default_rng(9)
    ramp = np.add.outer(np.arange(40), np.arange(3 * 32 * 32)).reshape(40, 3, 32, 32)
    data = (ramp % 1000 + rng.integers(0, 3, ramp.shape)).astype(dtype)
    path = tmp_path / "wide.h5"
    with h5py.File(path, "w") as handle:
        blosc = hdf5plugin.Blosc(filters["cname"], 5, filters["shuffle"])
        handle.create_dataset("train/x", data=data, chunks=(CHUNK, 3, 32, 32), **blosc)
    with Release(path, "train", batch_size=1, cache_bytes=0) as reader:
        cache = store(reader, "x").cache
        cache.nbytes = 0  # no room: every single row is read in part
        for index in np.random.default_rng(1).permutation(40).tolist():
            np.testing.assert_array_equal(reader.read([index])["x"], data[[index]])
        assert cache.parts > 0


# --- the pure pieces: Blosc frames read in part --------------------------------------------


def encoded(data: np.ndarray, cname: str, level: int, shuffle: int, typesize: int) -> np.ndarray:
    frame = imagecodecs.blosc_encode(
        data.tobytes(), level, compressor=cname, shuffle=shuffle, typesize=typesize, numthreads=1
    )
    return np.frombuffer(frame, dtype=np.uint8)


@settings(max_examples=120, deadline=None)
@given(
    cname=st.sampled_from(["lz4", "lz4hc", "zstd", "zlib", "blosclz"]),
    level=st.integers(0, 9),
    shuffle=st.sampled_from([0, 1, 2]),
    typesize=st.sampled_from([1, 2, 4, 8]),
    items=st.integers(1, 40_000),
    noise=st.booleans(),
    data=st.data(),
)
def test_any_range_of_a_blosc_frame_decodes_to_the_whole_frames_bytes(
    cname: str,
    level: int,
    shuffle: int,
    typesize: int,
    items: int,
    noise: bool,
    data: st.DataObject,
) -> None:
    rng = np.random.default_rng(items)
    if noise:  # incompressible: Blosc stores it as it is (the "memcpyed" frame)
        raw = rng.integers(0, 256, items * typesize, dtype=np.uint8)
    else:
        raw = (np.arange(items * typesize) // 7 % 251).astype(np.uint8)
    frame = encoded(raw, cname, level, shuffle, typesize)
    start = data.draw(st.integers(0, raw.size - 1))
    stop = data.draw(st.integers(start + 1, raw.size))
    part = blosc_range(frame, start, stop)
    assert part is not None
    np.testing.assert_array_equal(part, raw[start:stop])


@pytest.mark.parametrize("cname", ["lz4", "lz4hc", "zstd", "zlib", "blosclz"])
@pytest.mark.parametrize("typesize", [1, 2, 4, 8])
@pytest.mark.parametrize("shuffle", [0, 1, 2])
def test_ranges_at_block_edges_and_in_the_short_last_block(
    cname: str, typesize: int, shuffle: int
) -> None:
    # a range inside the short last block alone made a frame c-blosc refuses
    raw = (np.arange(300_001 * typesize) // 9 % 241).astype(np.uint8)
    frame = encoded(raw, cname, 5, shuffle, typesize)
    blocksize = int(np.frombuffer(frame[8:12].tobytes(), "<i4")[0])
    size = raw.size
    ranges = [(0, 1), (size - 1, size), (size - 3 * typesize, size), (0, size)]
    ranges += [(blocksize - 1, blocksize + 1), (blocksize, 2 * blocksize)]
    for start, stop in ranges:
        part = blosc_range(frame, start, min(stop, size))
        assert part is not None
        np.testing.assert_array_equal(part, raw[start : min(stop, size)])


def test_blocks_stored_out_of_order_are_found_by_their_offsets() -> None:
    raw = (np.arange(300_000) // 5 % 200).astype(np.uint8)
    frame = encoded(raw, "lz4", 5, 1, 1)
    count = int(np.frombuffer(frame[4:8].tobytes(), "<i4")[0])
    blocksize = int(np.frombuffer(frame[8:12].tobytes(), "<i4")[0])
    nblocks = -(-count // blocksize)
    offsets = np.frombuffer(frame[16 : 16 + 4 * nblocks].tobytes(), "<i4").astype(np.int64)
    ends = np.append(offsets[1:], frame.size)
    blocks = [frame[b:e] for b, e in zip(offsets, ends, strict=True)]
    order = list(reversed(range(nblocks)))  # as threads may store them: last block first
    moved, at = np.empty(nblocks, np.int64), 16 + 4 * nblocks
    for j in order:
        moved[j], at = at, at + blocks[j].size
    shuffled = np.concatenate(
        [frame[:16], moved.astype("<i4").view(np.uint8), *(blocks[j] for j in order)]
    )
    whole = np.frombuffer(imagecodecs.blosc_decode(shuffled.tobytes()), dtype=np.uint8)
    np.testing.assert_array_equal(whole, raw)  # still a valid frame
    for start, stop in [(0, 10), (blocksize - 3, blocksize + 3), (raw.size - 7, raw.size)]:
        part = blosc_range(shuffled, start, stop)
        assert part is not None
        np.testing.assert_array_equal(part, raw[start:stop])


def test_frames_not_understood_are_left_to_the_whole_decode() -> None:
    frame = encoded((np.arange(100_000) % 7).astype(np.uint8), "lz4", 5, 1, 1)
    assert blosc_range(frame[:10], 0, 1) is None  # shorter than a header
    newer = frame.copy()
    newer[0] = 3  # a frame version c-blosc 1 does not write
    assert blosc_range(newer, 0, 1) is None
    flagged = frame.copy()
    flagged[2] |= 0x8  # a flag c-blosc 1 does not set
    assert blosc_range(flagged, 0, 1) is None
    assert blosc_range(frame[:-5], 0, 1) is None  # cut short: cbytes past the end
    assert blosc_range(frame, 5, 200_000) is None  # past the decoded size


def test_only_blosc_without_a_byte_moving_shuffle_is_read_in_part() -> None:
    assert Pipeline((BLOSC,), itemsize=4, nbytes=64).ranged
    assert Pipeline((SHUFFLE, BLOSC), itemsize=1, nbytes=64).ranged  # moves no byte
    assert not Pipeline((SHUFFLE, BLOSC), itemsize=2, nbytes=64).ranged
    assert not Pipeline((32000,), itemsize=1, nbytes=64).ranged
    frame = encoded(np.zeros(64, np.uint8), "lz4", 5, 1, 1)
    whole = Pipeline((BLOSC,), itemsize=1, nbytes=64)
    assert whole.decode_range(frame, 1, 0, 8) is None  # Blosc skipped at write time
    assert Pipeline((BLOSC,), itemsize=1, nbytes=128).decode_range(frame, 0, 0, 8) is None
    part = whole.decode_range(frame, 0, 8, 16)
    assert part is not None
    np.testing.assert_array_equal(part, np.zeros(8, np.uint8))


# --- the benchmark script runs ---------------------------------------------------------------


def test_the_release_read_benchmark_runs_end_to_end(
    releases: dict[str, Path], tmp_path: Path
) -> None:
    script = Path(__file__).parents[1] / "benchmarks" / "read.py"
    args = ["--release", str(releases["blosc-lz4"]), "--probes", "20", "--warmup", "5"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--epochs", "1", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    for row in ("| first-touch | 3 |", "| uniform | 20 |", "| split-cache | 20 |"):
        assert row in done.stdout
    assert "| Release.read |" in done.stdout
    assert "| np.load(mmap_mode='r') |" in done.stdout
