"""compress_threads: the sink compresses the blocks it re-cuts on threads beside the writer, and the
file is the same byte for byte however many threads there are and however they finish."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import h5etl.sink.compress_threads
from h5etl.dataflow import BatchResult, DecodeTask, RaggedRows
from h5etl.errors import SinkError
from h5etl.format.codec import ChunkLayout, Codec, encode_direct
from h5etl.kinds.columns import RaggedColumn, ScalarColumn
from h5etl.sink.compress_threads import ChunkPool
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink

BLOSC = Codec("blosc", 5, "lz4", "byte")


def _batches(seed: int = 1) -> list[list[np.ndarray]]:
    """Recordings of (n, 3) float32, batches of a few, lengths across many chunks of 64;
    a sensor's quantised readings, so that every chunk compresses (one that does not is
    HDF5's to store raw, through the writer)."""
    rng = np.random.default_rng(seed)
    lengths = [[130, 5, 64], [0, 300, 17], [63], [1, 250, 129, 40]]
    return [
        [rng.integers(-40, 40, (n, 3)).astype(np.float32) / 8 for n in batch] for batch in lengths
    ]


def _write(path: Path, batches: list[list[np.ndarray]], *, threads: int, codec: Codec) -> None:
    column = RaggedColumn.of("float32", (3,), 64, compression=codec)
    layout = SinkLayout(("train",), {"sig": column, "n": ScalarColumn("int64")}, ("sig",))
    sink = Sink(path, layout)
    sink.pool = ChunkPool(threads)
    with sink:
        for number, samples in enumerate(batches):
            task = DecodeTask("train", number, (), 1, 1, final=number == len(batches) - 1)
            lengths = np.array([len(s) for s in samples], dtype=np.int64)
            result = BatchResult(task, len(samples))
            values = np.concatenate([np.empty((0, 3), np.float32), *samples])
            result.columns = {"sig": RaggedRows(values, lengths), "n": lengths}
            result.keys = [f"{number}-{i}" for i in range(len(samples))]
            result.lineage = [(hashlib.sha256(k.encode()).hexdigest(),) for k in result.keys]
            sink.write(result)
        sink.finish({"name": "t"}, {})


def test_values_are_compressed_on_the_pool_threads_never_by_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []

    def recording(layout: ChunkLayout, rows: np.ndarray) -> Any:
        threads.append(threading.current_thread().name)
        return encode_direct(layout, rows)

    class NoEncoder:  # the writer's own (HDF5) encoder: never needed for a direct codec
        def __init__(self, layout: ChunkLayout) -> None:
            raise AssertionError("the writer compressed a block itself")

    monkeypatch.setattr(h5etl.sink.compress_threads, "encode_direct", recording)
    monkeypatch.setattr(h5etl.sink.array_writer, "BlockEncoder", NoEncoder)
    batches = _batches()
    _write(tmp_path / "t.h5", batches, threads=2, codec=BLOSC)
    expected = np.concatenate([s for batch in batches for s in batch])
    assert len(threads) == -(-len(expected) // 64)  # a call per chunk, the last one padded
    assert all(name.startswith("h5etl-chunks") for name in threads)
    with h5py.File(tmp_path / "t.h5", "r") as handle:
        np.testing.assert_array_equal(handle["train/sig"][...], expected)
        ends = np.cumsum([0, *(len(s) for batch in batches for s in batch)])
        np.testing.assert_array_equal(handle["train/sig_offsets"][...], ends)


@pytest.mark.parametrize(
    "codec",
    [
        pytest.param(BLOSC, id="blosc-threads"),
        pytest.param(Codec("gzip", 1, "lz4", "byte"), id="gzip-threads"),
        pytest.param(Codec("lzf", None, "lz4", "byte"), id="lzf-through-hdf5"),
    ],
)
def test_same_file_for_any_number_of_threads_and_any_finishing_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: Codec
) -> None:
    batches = _batches(2)
    _write(tmp_path / "one.h5", batches, threads=1, codec=codec)
    rng = np.random.default_rng(0)

    def late(layout: ChunkLayout, rows: np.ndarray) -> Any:
        threading.Event().wait(float(rng.uniform(0, 0.01)))  # blocks finish out of order
        return encode_direct(layout, rows)

    monkeypatch.setattr(h5etl.sink.compress_threads, "encode_direct", late)
    _write(tmp_path / "four.h5", batches, threads=4, codec=codec)
    assert (tmp_path / "one.h5").read_bytes() == (tmp_path / "four.h5").read_bytes()


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        pytest.param(MemoryError("no memory for the block"), MemoryError, id="memory-as-is"),
        pytest.param(RuntimeError("codec refused the block"), SinkError, id="sink-error"),
    ],
)
def test_a_block_that_fails_on_a_thread_fails_the_write_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, raised: type[Exception]
) -> None:
    """A MemoryError stays one; any other failure reaches the build as a SinkError."""

    def failing(layout: ChunkLayout, rows: np.ndarray) -> Any:
        raise error

    monkeypatch.setattr(h5etl.sink.compress_threads, "encode_direct", failing)
    with pytest.raises(raised, match=str(error)):
        _write(tmp_path / "t.h5", _batches(), threads=2, codec=BLOSC)
