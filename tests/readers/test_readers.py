"""Readers: numpy batches, the chunk-aware sampler, PyTorch (fork, spawn) and Keras 3.

Every test builds a tiny real release with ``h5etl.build`` and compares what a reader yields
with what h5py reads directly from the same file.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

import h5py
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import h5etl
from h5etl.readers import (
    ChunkSampler,
    ReaderError,
    Release,
    _core,
    cache_size,
    iter_batches,
)
from h5etl.readers._layout import MAX_NSLOTS, CacheSize, next_prime, widened

FIELDS = ("image", "mask")


def write_raw(root: Path, count: int, *, seed: int = 0, prefix: str = "s") -> None:
    """``count`` RGB images of 10..24 px with 0/255 masks, under root/raw."""
    rng = np.random.default_rng(seed)
    for folder in ("images", "masks"):
        (root / "raw" / folder).mkdir(parents=True, exist_ok=True)
    for index in range(count):
        height, width = (int(v) for v in rng.integers(10, 25, size=2))
        image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        mask = (rng.random((height, width)) > 0.6).astype(np.uint8) * 255
        Image.fromarray(image).save(root / "raw" / "images" / f"{prefix}_{index:03d}.png")
        Image.fromarray(mask).save(root / "raw" / "masks" / f"{prefix}_{index:03d}.png")


def build_release(
    root: Path,
    count: int,
    *,
    chunk: int = 4,
    compression: str = "lzf",
    prefix: str = "s",
    image_chunks: list[int] | None = None,
) -> Path:
    """Build (or rebuild) ``root/releases/cells.h5`` from ``count`` samples; return the link."""
    write_raw(root, count, prefix=prefix)
    config = {
        "name": "cells",
        "pipeline": "segmentation",
        "output": "releases",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "splits": {"train": 1.0},
        "fields": {
            "image": {"shape": [3, 24, 24], "dtype": "uint8", "mode": "RGB"},
            "mask": {"shape": [1, 24, 24], "dtype": "uint8", "mode": "L", "values": [0, 1]},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": chunk, "compression": compression},
    }
    if image_chunks is not None:
        config["fields"]["image"]["chunks"] = image_chunks  # type: ignore[index]
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(root / "config.yaml"), jobs=1)
    assert report.link is not None
    return report.link


def direct(path: Path, split: str = "train") -> dict[str, Any]:
    """Every field read straight with h5py, plus filename -> row."""
    with h5py.File(path, "r") as handle:
        group = handle[split]
        out: dict[str, Any] = {name: group[name][...] for name in FIELDS}
        out["filename"] = list(group["filename"].asstr()[...])
    out["row"] = {name: row for row, name in enumerate(out["filename"])}
    return out


def assert_epoch(truth: dict[str, Any], batches: list[dict[str, Any]]) -> None:
    """The batches hold every sample exactly once, with the right pixels."""
    seen: list[str] = []
    for batch in batches:
        names = [str(n) for n in batch["filename"]]
        rows = [truth["row"][n] for n in names]
        for field in FIELDS:
            np.testing.assert_array_equal(np.asarray(batch[field]), truth[field][rows])
        seen.extend(names)
    assert sorted(seen) == sorted(truth["filename"])


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release of 22 samples in chunks of 4 (the last chunk short), lzf."""
    return build_release(tmp_path_factory.mktemp("lzf"), 22)


# --- the numpy core ------------------------------------------------------------------------


def test_readers_import_without_torch_or_keras() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any import of it now fails
        sys.modules["keras"] = None
        import h5etl.readers as readers
        assert callable(readers.iter_batches) and readers.ChunkSampler
        try:
            readers.H5Dataset
        except ImportError:
            print("lazy")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "lazy"


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("batch_size", [1, 4, 5, 32])
def test_iter_batches_yields_every_sample_once(
    release: Path, shuffle: bool, batch_size: int
) -> None:
    truth = direct(release)
    batches = list(iter_batches(release, "train", batch_size, shuffle=shuffle, seed=3))
    assert all(len(b["image"]) <= batch_size for b in batches)
    assert_epoch(truth, batches)
    if not shuffle:
        order = [n for b in batches for n in b["filename"]]
        assert order == truth["filename"]


def test_iter_batches_order_changes_with_epoch_and_repeats_with_seed(release: Path) -> None:
    def order(seed: int, epoch: int) -> list[str]:
        batches = iter_batches(release, "train", 4, fields=["filename"], seed=seed, epoch=epoch)
        return [str(n) for b in batches for n in b["filename"]]

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)


def test_release_read_returns_rows_in_the_order_asked(release: Path) -> None:
    truth = direct(release)
    indices = [7, 3, 3, 21, 0, -1, 8, 9, 10]
    with Release(release, "train") as reader:
        batch = reader.read(indices)
    wanted = [i % 22 for i in indices]
    for field in FIELDS:
        np.testing.assert_array_equal(batch[field], truth[field][wanted])
    assert list(batch["filename"]) == [truth["filename"][i] for i in wanted]


def test_release_read_rejects_out_of_range(release: Path) -> None:
    with Release(release, "train") as reader, pytest.raises(IndexError):
        reader.read([22])


def test_unknown_split_or_field_is_a_reader_error(release: Path) -> None:
    with pytest.raises(ReaderError, match="no split 'test'; the release has: train"):
        Release(release, "test")
    with pytest.raises(ReaderError, match="no field labels"):
        Release(release, "train", fields=["image", "labels"])


def test_uncompressed_release_is_read_through_mmap(tmp_path: Path) -> None:
    link = build_release(tmp_path, 13, chunk=4, compression="none")
    truth = direct(link)
    with Release(link, "train") as reader:
        batch = reader.read([12, 0, 5, 4, 11])
        assert set(reader._maps) == {"image", "mask"}
        assert reader.caches["image"].nbytes == 0
    np.testing.assert_array_equal(batch["image"], truth["image"][[12, 0, 5, 4, 11]])
    assert_epoch(truth, list(iter_batches(link, "train", 3)))


def test_chunks_that_split_the_sample_are_read_through_hdf5(tmp_path: Path) -> None:
    link = build_release(tmp_path, 9, compression="none", image_chunks=[4, 3, 12, 12])
    truth = direct(link)
    with Release(link, "train") as reader:
        batch = reader.read([8, 1, 2, 3])
        assert set(reader._maps) == {"mask"}  # image chunks are tiles, not whole rows
    np.testing.assert_array_equal(batch["image"], truth["image"][[8, 1, 2, 3]])
    assert_epoch(truth, list(iter_batches(link, "train", 4)))


def test_cache_is_sized_from_the_chunk_layout() -> None:
    chunk_bytes = 32 * 3 * 224 * 224
    one = cache_size((32, 3, 224, 224), 1, batch_size=32)
    assert one.nbytes == 2 * chunk_bytes  # a batch of one chunk's rows may straddle two
    assert one.nslots == 211  # the first prime >= 100 x 2
    two = cache_size((8, 3, 224, 224), 1, batch_size=32)
    assert two.nbytes == 5 * 8 * 3 * 224 * 224
    assert cache_size((32, 3, 224, 224), 1, batch_size=32, filtered=False).nbytes == 0
    tiled = cache_size((32, 3, 112, 112), 1, batch_size=32, shape=(3, 224, 224))
    assert tiled.nbytes == 2 * chunk_bytes  # four chunks per row block, 2 blocks
    assert tiled.nslots == 809  # the first prime >= 100 x 8


def test_cache_slots_are_capped_as_widened_caps_them(release: Path) -> None:
    # batch_size=100_000 over 1-sample chunks asked HDF5 for ~10^7 slots (80 MB per field)
    capped = next_prime(MAX_NSLOTS)
    huge = cache_size((1, 3, 24, 24), 1, batch_size=100_000)
    assert huge.nbytes == 100_001 * 3 * 24 * 24  # the bytes are not capped, only the slots
    assert huge.nslots == capped
    start = CacheSize(nbytes=0, nslots=211)
    assert widened(start, huge.nbytes, (1, 3, 24, 24), 1).nslots == capped
    assert cache_size((32, 3, 224, 224), 1, batch_size=32).nslots == 211  # small ones unchanged
    truth = direct(release)
    with Release(release, "train", batch_size=100_000) as reader:
        assert reader.caches["image"].nslots == capped
        nslots = reader.datasets()["image"].id.get_access_plist().get_chunk_cache()[0]
        batch = reader.read([21, 0, 9])
    assert nslots == capped
    np.testing.assert_array_equal(batch["image"], truth["image"][[21, 0, 9]])


def test_release_opens_datasets_with_the_sized_cache(release: Path) -> None:
    with Release(release, "train", batch_size=8) as reader:
        dataset = reader.datasets()["image"]
        nslots, nbytes, _ = dataset.id.get_access_plist().get_chunk_cache()
    assert nbytes == reader.caches["image"].nbytes == 3 * 4 * 3 * 24 * 24
    assert nslots == reader.caches["image"].nslots


def test_close_releases_the_file(release: Path) -> None:
    reader = Release(release, "train")
    reader.read([0])
    assert reader.is_open
    reader.close()
    assert not reader.is_open
    open_files = [h5py.h5i.get_name(i) for i in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)]
    assert not any(b"cells" in (n or b"") for n in open_files)
    np.testing.assert_array_equal(reader.read([1])["image"], direct(release)["image"][[1]])


def _child_reads(reader: Release, queue: Any) -> None:
    inherited = reader._file is not None
    row = reader.read([2])["image"]
    queue.put((inherited, reader._pid == os.getpid(), row))


def test_a_forked_child_never_inherits_the_open_handle(release: Path) -> None:
    reader = Release(release, "train")
    reader.read([0])  # the parent holds an open handle when it forks
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_reads, args=(reader, queue))
    child.start()
    inherited, own, row = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not inherited  # closed before the fork, reopened by the child itself
    assert own
    np.testing.assert_array_equal(row, direct(release)["image"][[2]])
    np.testing.assert_array_equal(reader.read([3])["image"], direct(release)["image"][[3]])
    reader.close()


def _nothing() -> None:
    pass


def _exit_finalizers(reader: Release) -> list[Any]:
    """The entries of multiprocessing's exit registry that would close ``reader``'s file."""
    registry = vars(multiprocessing.util)["_finalizer_registry"]
    return [
        entry
        for entry in list(registry.values())
        if getattr(entry, "_weakref", None) is not None and entry._weakref() is reader
    ]


def test_reopening_after_every_fork_keeps_one_exit_finalizer(release: Path) -> None:
    # each reopen registered another Finalize holding its closed file: a reader in a
    # process that forks every epoch gained one registry entry per epoch
    truth = direct(release)
    reader = Release(release, "train")
    reader.read([0])
    assert len(_exit_finalizers(reader)) == 1
    context = multiprocessing.get_context("fork")
    for epoch in range(4):
        child = context.Process(target=_nothing)
        child.start()  # closes the reader's handle first
        child.join(timeout=60)
        assert child.exitcode == 0
        assert not reader.is_open
        assert _exit_finalizers(reader) == []  # nothing left to close at exit
        np.testing.assert_array_equal(reader.read([epoch])["image"], truth["image"][[epoch]])
        assert len(_exit_finalizers(reader)) == 1
    for _ in range(3):  # close() and a lazy reopen, as between epochs
        reader.close()
        assert _exit_finalizers(reader) == []
        reader.read([1])
        assert len(_exit_finalizers(reader)) == 1
    reader.close()
    assert _exit_finalizers(reader) == []


def test_iter_batches_opens_the_file_inside_the_fork_gate(
    release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iter_batches opened the file outside the gate: a fork from another thread meanwhile
    # would not wait, and the child could inherit a half-open HDF5 file
    readers_at_open: list[int] = []
    original = Release._open

    def watched(self: Release) -> dict[str, h5py.Dataset]:
        readers_at_open.append(_core._GATE._readers)  # a fork waits while this is above 0
        return original(self)

    monkeypatch.setattr(Release, "_open", watched)
    with Release(release, "train") as reader:
        batches = list(reader.iter_batches(4, prefetch=0))
    assert readers_at_open == [1]
    assert_epoch(direct(release), batches)


def test_reader_keeps_reading_its_release_after_the_link_moves(tmp_path: Path) -> None:
    link = build_release(tmp_path, 9, prefix="old")
    first = link.resolve()
    truth = direct(first)
    reader = Release(link, "train")
    partial = list(iter_batches(link, "train", 4, shuffle=False))[:1]
    build_release(tmp_path, 6, prefix="new")  # 15 samples now; the link points at v0002
    assert link.resolve() != first
    assert reader.path == first
    assert len(reader) == 9
    batch = reader.read(list(range(9)))
    np.testing.assert_array_equal(batch["image"], truth["image"])
    assert partial[0]["filename"][0].startswith("old")
    reader.close()


# --- the sampler (pure) --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    length=st.integers(0, 150),
    chunk=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 1000),
)
def test_epoch_order_is_a_permutation_that_keeps_chunks_together(
    length: int, chunk: int, seed: int, epoch: int
) -> None:
    sampler = ChunkSampler(length, chunk, seed=seed)
    sampler.set_epoch(epoch)
    order = sampler.epoch_order()
    assert sorted(order.tolist()) == list(range(length))
    chunk_ids = order // chunk
    runs = 1 + int(np.count_nonzero(np.diff(chunk_ids))) if length else 0
    assert runs == -(-length // chunk)  # each chunk's rows form one run
    again = ChunkSampler(length, chunk, seed=seed)
    again.set_epoch(epoch)
    assert np.array_equal(again.epoch_order(), order)


@settings(max_examples=150, deadline=None)
@given(
    length=st.integers(1, 150),
    chunk=st.integers(1, 40),
    batch=st.integers(1, 50),
    world=st.integers(1, 5),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_ranks_get_equal_batch_counts_and_cover_the_epoch(
    length: int, chunk: int, batch: int, world: int, drop_last: bool, shuffle: bool, seed: int
) -> None:
    def sampler(rank: int) -> ChunkSampler:
        made = ChunkSampler(
            length,
            chunk,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
        )
        made.set_epoch(2)
        return made

    samplers = [sampler(rank) for rank in range(world)]
    flat = [s.indices().tolist() for s in samplers]
    assert len({len(f) for f in flat}) == 1  # equal sample counts under sampler=
    assert len({len(s) for s in samplers}) == 1
    batches = [s.batches(batch) for s in samplers]
    assert len({len(b) for b in batches}) == 1  # equal batch counts under batch_sampler=
    assert all(len(b) <= batch for per_rank in batches for b in per_rank)
    if not drop_last:
        assert set().union(*map(set, flat)) == set(range(length))
        covered = {int(i) for per_rank in batches for b in per_rank for i in b}
        assert covered == set(range(length))
    if world == 1:
        seen = [int(i) for b in batches[0] for i in b]
        assert len(seen) == len(set(seen))  # no sample twice within one rank's epoch


@settings(max_examples=100, deadline=None)
@given(
    length=st.integers(1, 200),
    chunk=st.integers(1, 16),
    factor=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_batches_of_whole_chunks_read_whole_chunks(
    length: int, chunk: int, factor: int, seed: int
) -> None:
    sampler = ChunkSampler(length, chunk, seed=seed)
    for batch in sampler.batches(chunk * factor):
        assert len(np.unique(batch // chunk)) <= factor  # no batch straddles a chunk boundary


def test_sampler_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.1"):
        ChunkSampler(10, 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="chunk_rows"):
        ChunkSampler(10, 0)


# --- PyTorch -------------------------------------------------------------------------------


def _flip(sample: dict[str, Any]) -> dict[str, Any]:
    """A module-level transform, so spawn workers can unpickle it."""
    return {**sample, "flipped": sample["image"][:, :, ::-1].copy()}


def _loader_epochs(
    dataset: Any, context: str, *, batch_sampler: bool, epochs: int = 2
) -> Iterator[list[dict[str, Any]]]:
    import torch.utils.data

    sampler = dataset.batch_sampler(5, seed=1) if batch_sampler else dataset.sampler(seed=1)
    kwargs: dict[str, Any] = (
        {"batch_sampler": sampler} if batch_sampler else {"sampler": sampler, "batch_size": 5}
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        num_workers=2,
        multiprocessing_context=context,
        persistent_workers=True,
        **kwargs,
    )
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield [
            {k: v.numpy() if hasattr(v, "numpy") else v for k, v in batch.items()}
            for batch in loader
        ]


# A spawned worker unpickles the dataset (2.5 s of torch imports per case): once with the
# batch sampler users are told to use; the samplers' own logic is the same under fork.
@pytest.mark.parametrize(
    ("batch_sampler", "context"),
    [(True, "fork"), (False, "fork"), (True, "spawn")],
    ids=["batch_sampler-fork", "sampler-fork", "batch_sampler-spawn"],
)
def test_torch_dataloader_reads_every_sample_once_per_epoch(
    release: Path, context: str, batch_sampler: bool
) -> None:
    from h5etl.readers import H5Dataset

    truth = direct(release)
    dataset = H5Dataset(release, "train", transform=_flip)
    dataset[0]  # the parent has read too: workers must still open their own handles
    orders = []
    for batches in _loader_epochs(dataset, context, batch_sampler=batch_sampler):
        assert_epoch(truth, batches)
        for batch in batches:
            np.testing.assert_array_equal(batch["flipped"], batch["image"][..., ::-1])
        orders.append([n for b in batches for n in b["filename"]])
    assert orders[0] != orders[1]  # set_epoch reshuffled
    dataset.close()


def test_torch_dataset_getitems_reads_a_batch(release: Path) -> None:
    from h5etl.readers import H5Dataset

    truth = direct(release)
    with H5Dataset(release, "train", fields=["image", "filename"]) as dataset:
        samples = dataset.__getitems__([4, 5, 6, 7, 1])
        assert len(dataset) == 22
        assert dataset.path == str(release.resolve())
        with pytest.raises(IndexError):
            dataset[22]
    assert [s["filename"] for s in samples] == [truth["filename"][i] for i in [4, 5, 6, 7, 1]]
    np.testing.assert_array_equal(samples[-1]["image"], truth["image"][1])


def test_torch_workers_keep_the_release_they_started_with(tmp_path: Path) -> None:
    import torch.utils.data

    from h5etl.readers import H5Dataset

    link = build_release(tmp_path, 10, prefix="old")
    truth = direct(link)
    dataset = H5Dataset(link, "train")
    build_release(tmp_path, 5, prefix="new")  # swaps the link before any worker starts
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=dataset.batch_sampler(4),
        num_workers=2,
        multiprocessing_context="spawn",
    )
    assert_epoch(
        truth, [{k: getattr(v, "numpy", lambda v=v: v)() for k, v in b.items()} for b in loader]
    )


def _decoded_in_worker(sample: dict[str, Any]) -> dict[str, Any]:
    """Tags a sample with its worker, the chunks that worker has decoded, and its share."""
    from h5etl.readers import _fork
    from h5etl.readers._core import Release

    (reader,) = (r for r in _fork._OPEN if isinstance(r, Release) and r.split == "train")
    cache = reader._stores["image"].cache
    return {**sample, "pid": os.getpid(), "loads": cache.loads, "processes": reader.processes}


# spawned once, with the split cache (what a worker started fresh must share correctly)
@pytest.mark.parametrize(
    ("cache_bytes", "context"),
    [("split", "fork"), (None, "fork"), ("split", "spawn")],
    ids=["split-fork", "None-fork", "split-spawn"],
)
def test_persistent_workers_with_a_split_cache_decode_each_chunk_once(
    release: Path, context: str, cache_bytes: Any
) -> None:
    from h5etl.readers import H5Dataset

    truth = direct(release)
    dataset = H5Dataset(
        release, "train", batch_size=5, cache_bytes=cache_bytes, transform=_decoded_in_worker
    )
    loads: dict[int, int] = {}
    for batches in _loader_epochs(dataset, context, batch_sampler=True, epochs=3):
        assert_epoch(truth, batches)
        for batch in batches:
            assert batch["processes"].tolist() == [3] * len(batch["pid"])  # 2 workers + main
            for pid, count in zip(batch["pid"].tolist(), batch["loads"].tolist(), strict=True):
                loads[pid] = max(loads.get(pid, 0), count)
    chunks = 2 * 6  # image and mask, 22 rows in chunks of 4
    assert len(loads) == 2  # both workers read
    if cache_bytes == "split":
        assert all(count <= chunks for count in loads.values())  # no chunk decoded twice
    else:  # the default cache holds a batch's chunks, so a worker decodes some again
        assert max(loads.values()) > chunks
    dataset.close()


# --- Keras 3 -------------------------------------------------------------------------------


def test_keras_dataset_reads_every_sample_once_per_epoch(release: Path) -> None:
    from h5etl.readers import KerasDataset

    truth = direct(release)
    dataset = KerasDataset(release, "train", x=("image", "filename"), y="mask", seed=5)
    assert dataset.batch_size == 4
    assert len(dataset) == 6
    orders = []
    for _ in range(2):
        batches = []
        for step in range(len(dataset)):
            rows = dataset.rows(step)
            assert rows.max() - rows.min() < 4
            assert rows.min() % 4 == 0
            x, y = dataset[step]
            batches.append({"image": x["image"], "filename": x["filename"], "mask": y})
        assert_epoch(truth, batches)
        orders.append([n for b in batches for n in b["filename"]])
        dataset.on_epoch_end()
    assert orders[0] != orders[1]
    dataset.close()


def test_keras_dataset_reads_the_release_it_sized_its_batches_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the link was resolved twice: swapped in between, batch_size came from one release
    # (chunks of 4) and the rows from another (chunks of 8)
    from h5etl.readers import keras as keras_reader

    link = build_release(tmp_path, 9, chunk=4, prefix="old")
    first = link.resolve()
    second = build_release(tmp_path, 6, chunk=8, prefix="new").resolve()
    assert second != first

    def point_link_at(target: Path) -> None:
        temp = link.with_name(".swap.h5")
        os.symlink(target.name, temp)
        os.replace(temp, link)

    point_link_at(first)
    made: list[Release] = []

    def swapping(*args: Any, **kwargs: Any) -> Release:
        made.append(Release(*args, **kwargs))
        if len(made) == 1:
            point_link_at(second)  # a build publishes right after the probe
        return made[-1]

    monkeypatch.setattr(keras_reader, "Release", swapping)
    dataset = keras_reader.KerasDataset(link, "train", x=("image", "filename"), y="mask")
    assert link.resolve() == second
    assert [r.path for r in made] == [first, first]
    assert dataset.release.path == first
    assert dataset.batch_size == dataset.release.chunk_rows == 4
    assert len(dataset.release) == 9
    batches = []
    for step in range(len(dataset)):
        x, y = dataset[step]
        batches.append({"image": x["image"], "filename": x["filename"], "mask": y})
    assert_epoch(direct(first), batches)
    dataset.close()


def test_keras_dataset_decodes_the_next_block_ahead(release: Path) -> None:
    from h5etl.readers import KerasDataset

    truth = direct(release)
    dataset = KerasDataset(release, "train", x="image", y=None, seed=1)
    x = dataset[0]
    cache = dataset.release._stores["image"].cache
    expected = {int(dataset.rows(0).min()), int(dataset.rows(1).min())}

    def blocks() -> set[int]:
        keys: list[Any] = list(cache._items)
        return {key[1] for key in keys if key[0] == "/train/image"}

    # The read-ahead is queued on the decode pool; wait for it to start (no time asserted).
    deadline = time.monotonic() + 60
    while blocks() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocks() == expected
    np.testing.assert_array_equal(x, truth["image"][dataset.rows(0)])
    dataset.close()


def test_keras_dataset_with_a_split_cache_decodes_each_chunk_once(release: Path) -> None:
    from h5etl.readers import KerasDataset

    truth = direct(release)
    dataset = KerasDataset(release, "train", x=("image", "filename"), y="mask", cache_bytes="split")
    for _ in range(3):
        batches = []
        for step in range(len(dataset)):
            x, y = dataset[step]
            batches.append({"image": x["image"], "filename": x["filename"], "mask": y})
        assert_epoch(truth, batches)
        dataset.on_epoch_end()
    assert dataset.release._stores["image"].cache.loads == 2 * 6  # image and mask chunks
    dataset.close()
    assert dataset.release.processes == 1
    pooled = KerasDataset(release, "train", workers=2, use_multiprocessing=True)
    assert pooled.release.processes == 3  # the memory cap is shared with the pool's workers


def test_keras_model_fits_on_the_dataset(release: Path) -> None:
    import keras

    from h5etl.readers import KerasDataset

    truth = direct(release)
    row_of = {truth["image"][row].tobytes(): row for row in range(len(truth["image"]))}
    seen: list[int] = []

    def to_float(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.extend(row_of[image.tobytes()] for image in batch["image"])
        return {
            "image": batch["image"].astype("float32") / 255,
            "mask": batch["mask"].astype("float32"),
        }

    dataset = KerasDataset(release, "train", batch_size=8, transform=to_float)
    model = keras.Sequential(
        [keras.Input((3, 24, 24)), keras.layers.Conv2D(1, 1, data_format="channels_first")]
    )
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(dataset, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    # Keras peeks at one batch first (to learn its structure), then runs the two epochs.
    assert len(seen) in {44 + 6, 44 + 8}  # a 6- or 8-row block, then two epochs of 22
    first, second = seen[-44:-22], seen[-22:]
    assert sorted(first) == sorted(second) == list(range(22))  # each sample once per epoch
    assert first != second


# --- the benchmark script still runs (no timings asserted) ---------------------------------


def test_read_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    script = Path(__file__).parents[1] / "benchmarks" / "read.py"
    args = ["--samples", "40", "--chunk", "8", "--chunks", "8", "1", "--probes", "4"]
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            *args,
            "--budget",
            "0.05",
            "--no-loader",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, "H5ETL_BENCH_SMOKE": "1"},  # no figure meant: each best-of runs once
    )
    assert done.returncode == 0, done.stderr
    assert "### Split cache" in done.stdout
    for row in ("| none |", "| lzf |", "| gzip |", "| blosc-lz4 |", "| npy |", "| 8 | ", "| 1 | "):
        assert row in done.stdout


def test_readers_exports_are_pinned() -> None:
    import h5etl.readers as readers

    assert readers.__all__ == [
        "BatchSampler",
        "CacheBytes",
        "CacheSize",
        "ChunkSampler",
        "H5Dataset",
        "KerasDataset",
        "ReaderError",
        "Release",
        "cache_size",
        "iter_batches",
    ]
    for name in readers.__all__:
        assert getattr(readers, name) is not None


def test_keras_and_iter_batches_give_channels_last_batches_as_views(release: Path) -> None:
    # releases are channels first (N, C, H, W); Keras (and Flax) take (N, H, W, C)
    from h5etl.readers import KerasDataset

    truth = direct(release)
    plain = KerasDataset(release, "train", x=("image", "filename"), y="mask", shuffle=False)
    last = KerasDataset(
        release, "train", x=("image", "filename"), y="mask", shuffle=False, channels_last=True
    )
    for step in range(len(plain)):
        (x, y), (x_last, y_last) = plain[step], last[step]
        rows = [truth["row"][n] for n in x_last["filename"]]
        assert x_last["image"].shape[1:] == (24, 24, 3)
        assert y_last.shape[1:] == (24, 24, 1)
        np.testing.assert_array_equal(x_last["image"], truth["image"][rows].transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(y_last, truth["mask"][rows].transpose(0, 2, 3, 1))
        assert np.moveaxis(x_last["image"], -1, 1).flags.c_contiguous  # a view, not a copy
        assert x["image"].flags.c_contiguous  # as stored, nothing moved
        assert x["image"].shape[1] == 3
        np.testing.assert_array_equal(y, truth["mask"][rows])
    batches = iter_batches(release, "train", 8, shuffle=False, channels_last=True)
    for batch in batches:
        rows = [truth["row"][str(n)] for n in batch["filename"]]
        np.testing.assert_array_equal(batch["image"], truth["image"][rows].transpose(0, 2, 3, 1))
        assert batch["mask"].shape[1:] == (24, 24, 1)
