"""Small columns: what a loader worker pays to read a split's offsets whole, by chunk layout.

Run on its own (never under pytest; it asserts nothing about time)::

    python tests/benchmarks/small_columns.py                 # 100,000 samples, ~1 minute
    python tests/benchmarks/small_columns.py --samples 2000  # the smoke test's size

A ragged column of ``--samples`` samples is written through the real sink twice: as the sink
chunks its small columns now (by bytes, ``sink_datasets.small_chunk_rows``) and as it did
before (one row a chunk: a volume or series release has no array field whose chunk rows the
small columns followed). For each file it prints the offsets dataset's chunks, their bytes,
the file's bytes (the other small columns, the lineage, and every chunk index included: one
B-tree entry per chunk), and the median time to open the file and read the offsets whole,
as every loader worker does when it opens a release (``Release``, ``Volumes``,
``SeriesReader``). Warm page cache: the files are read once before timing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np

from h5etl.dataflow import BatchResult, DecodeTask, RaggedRows
from h5etl.format import contract as fileformat
from h5etl.format.codec import Codec
from h5etl.kinds.columns import RaggedColumn
from h5etl.sink import datasets
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink

BATCH = 4096  # samples per result handed to the sink


@contextmanager
def one_row_chunks() -> Iterator[None]:
    """The sink as it was: every small column one row a chunk."""
    kept = datasets.small_chunk_rows
    datasets.small_chunk_rows = lambda row_bytes, planned=None: 1
    try:
        yield
    finally:
        datasets.small_chunk_rows = kept


def write(path: Path, samples: int) -> None:
    """``samples`` one-value samples of a ragged int16 column, through the sink."""
    column = RaggedColumn.of("int16", (), 1024, compression=Codec("none", None, "lz4", "byte"))
    layout = SinkLayout(("train",), {"ct": column}, ("ct",), planned={"train": samples})
    with Sink(path, layout) as sink:
        for number, start in enumerate(range(0, samples, BATCH)):
            count = min(BATCH, samples - start)
            task = DecodeTask("train", start, (), count, count, final=start + count == samples)
            result = BatchResult(task, count)
            values = (np.arange(start, start + count) % 1000).astype(np.int16)
            result.columns = {"ct": RaggedRows(values, np.ones(count, dtype=np.int64))}
            result.keys = [f"{number}-{i}" for i in range(count)]
            result.lineage = [("0" * 64,)] * count
            sink.write(result)
        sink.finish({"name": "bench", "version": 1}, {})


def read_offsets(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as handle:
        return np.asarray(handle[fileformat.offsets_path("/train/ct")][...])


def measure(path: Path, repeats: int) -> tuple[tuple[int, ...], int, int, float]:
    """Chunks, the offsets' chunk bytes, the file's bytes (the chunk index included) and the
    median seconds of an open + whole read."""
    read_offsets(path)  # warm the page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        read_offsets(path)
        times.append(time.perf_counter() - start)
    with h5py.File(path, "r") as handle:
        dataset = handle[fileformat.offsets_path("/train/ct")]
        chunks, stored = tuple(dataset.chunks), int(dataset.id.get_storage_size())
    return chunks, stored, path.stat().st_size, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        rows: list[tuple[str, tuple[int, ...], int, int, float]] = []
        for name, before in (("one row a chunk (before)", True), ("by bytes", False)):
            path = Path(scratch) / f"{len(rows)}.h5"
            with one_row_chunks() if before else contextlib.nullcontext():
                write(path, args.samples)
            assert np.array_equal(np.diff(read_offsets(path)), np.ones(args.samples))
            rows.append((name, *measure(path, args.repeats)))
    print(
        f"### Offsets of {args.samples:,} samples: open and read whole (median of {args.repeats})"
    )
    print()
    print("| small columns chunked | chunks | offsets' chunks | file | open + read whole |")
    print("|---|---|---|---|---|")
    for name, chunks, stored, size, seconds in rows:
        print(
            f"| {name} | {chunks} | {stored / 1e6:.2f} MB | {size / 1e6:.2f} MB | "
            f"{seconds * 1e3:.2f} ms |"
        )
    (*_, size_before, slow), (*_, size_after, fast) = rows
    print(f"| **before / by bytes** | | | {size_before / size_after:.1f}x | {slow / fast:.0f}x |")


if __name__ == "__main__":
    main()
