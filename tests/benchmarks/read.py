"""Read benchmark: how fast training code gets samples out of a release.

Run on its own (never under pytest; it asserts nothing about time)::

    python tests/benchmarks/read.py               # 2048 samples of 3x224x224, ~2-3 minutes
    python tests/benchmarks/read.py --samples 8192 --dir /data/bench   # bigger, on a real disk
    python tests/benchmarks/read.py --release releases/bench.h5   # a real release instead

``--release PATH`` measures a release you built (``read_release.py``, which see): random
single samples at first touch and in the steady state, sequential epochs against a raw
memmap of the same arrays, peak memory and the decoded-chunk cache's bytes.

It writes the same synthetic uint8 images (cell-like pictures, so they compress like real
ones) into datasets laid out like a release's ``/train/image`` (chunks of 32 samples; no
compression, lzf and gzip, each with the byte shuffle filter as releases use) and into a raw
``.npy`` read with ``np.load(mmap_mode='r')``: the limit. Files are read once before timing,
so numbers are warm page-cache numbers (what a second epoch sees); the "cold" columns read
one epoch right after dropping the file from the page cache (best of two). "Prefetched" is
``iter_batches(..., prefetch=N)``: the same chunk-aware batches, read ahead by background
threads. "Split cache" is a reader made with ``cache_bytes="split"``: its first epoch decodes
(and keeps) every chunk, later epochs gather from memory; the DataLoader variant keeps its
two workers (``persistent_workers``) so their caches survive the epoch. Prints markdown
tables: latencies are medians; throughputs the best of several epochs or runs (the machine
is shared, so noise only ever slows a run), and ratios of those.

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): every table and reader,
each best-of taken over one run or epoch (the cached readers: the filling epoch and one
more), and the synthetic images made from 8 base pictures instead of 48.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np

from h5etl.examples.demo import cell_pair
from h5etl.readers import ChunkSampler, Release, iter_batches

try:
    from h5etl.readers._ahead import prefetched
except ImportError:  # a tree from before _ahead.py (--release compares trees on one script)
    from h5etl.readers._chunks import prefetched  # type: ignore[attr-defined,no-redef]

SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"
SHAPE = (3, 224, 224)
BATCH = 32
FORMATS: dict[str, dict[str, Any]] = {  # the filters a release of that codec gets
    "none": {},
    "lzf": {"compression": "lzf", "shuffle": True},
    "gzip": {"compression": "gzip", "compression_opts": 4, "shuffle": True},
    "blosc-lz4": dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=1)),
}


def synthetic(samples: int, seed: int = 0) -> np.ndarray:
    """``samples`` cell pictures: a few bases, each shifted, flipped and re-noised."""
    rng = np.random.default_rng(seed)
    count = 8 if SMOKE else 48
    bases = [cell_pair(rng, SHAPE[1], SHAPE[2])[0].transpose(2, 0, 1) for _ in range(count)]
    out = np.empty((samples, *SHAPE), dtype=np.uint8)
    for index in range(samples):
        image = bases[int(rng.integers(len(bases)))]
        image = np.roll(image, tuple(int(v) for v in rng.integers(0, 224, 2)), axis=(1, 2))
        out[index] = image[:, :, ::-1] if index % 2 else image
    noise = rng.integers(-3, 4, size=out.shape[1:], dtype=np.int16)
    out[::3] = np.clip(out[::3] + noise, 0, 255).astype(np.uint8)
    return out


def write_h5(path: Path, data: np.ndarray, chunk: int, filters: dict[str, Any]) -> None:
    """One ``/train/image`` dataset in the release layout, written chunk by chunk."""
    with h5py.File(path, "w", libver=("v110", "v110")) as handle:
        dataset = handle.create_dataset(
            "train/image", shape=data.shape, dtype=data.dtype, chunks=(chunk, *SHAPE), **filters
        )
        step = max(chunk, 256 // chunk * chunk)
        for start in range(0, len(data), step):
            dataset[start : start + step] = data[start : start + step]


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (none may be mapped), so reads hit the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_epoch(path: Path, args: argparse.Namespace, *, prefetch: int = 0) -> float:
    """Samples per second of one chunk-aware epoch read straight after evicting the file."""
    sampler = ChunkSampler(args.samples, args.chunk, seed=0)
    sampler.set_epoch(99)
    evict(path)
    try:
        if prefetch:
            return prefetched_epoch(path, args, epoch=99)
        if path.suffix == ".npy":
            memory = np.load(path, mmap_mode="r")
            return throughput(lambda b: memory[b], sampler.batches(BATCH), args.budget)
        with Release(path, "train", fields=["image"], batch_size=BATCH) as release:
            return throughput(release.read, sampler.batches(BATCH), args.budget)
    finally:
        warm(path)


def prefetched_epoch(path: Path, args: argparse.Namespace, *, epoch: int) -> float:
    """Samples per second of ``iter_batches(..., prefetch=args.prefetch)`` over one epoch.

    The ``.npy`` file goes through the same read-ahead threads (``memmap[batch]`` per batch),
    so both sides get the same help from overlapping reads.
    """
    if path.suffix == ".npy":
        memory = np.load(path, mmap_mode="r")
        sampler = ChunkSampler(args.samples, args.chunk, seed=0)
        sampler.set_epoch(epoch)
        batches: Iterator[Any] = prefetched(
            lambda b: {"image": memory[b]}, sampler.batches(BATCH), args.prefetch
        )
    else:
        batches = iter_batches(
            path, "train", BATCH, fields=["image"], seed=0, epoch=epoch, prefetch=args.prefetch
        )
    return stream_throughput(batches, args.budget)


def stream_throughput(batches: Iterable[dict[str, np.ndarray]], budget: float) -> float:
    """Samples per second of an iterator of batches, stopping early after ``budget`` seconds."""
    done, started = 0, time.perf_counter()
    with closing(iter(batches)) as stream:  # type: ignore[type-var]
        for batch in stream:
            done += len(batch["image"])
            if time.perf_counter() - started > budget:
                break
    return done / (time.perf_counter() - started)


def warm(path: Path) -> None:
    with path.open("rb") as stream:
        while stream.read(1 << 24):
            pass


@contextmanager
def stopwatch(out: list[float]) -> Iterator[None]:
    started = time.perf_counter()
    yield
    out.append(time.perf_counter() - started)


def median_ms(fn: Callable[[int], Any], indices: np.ndarray) -> float:
    times: list[float] = []
    for index in indices.tolist():
        with stopwatch(times):
            fn(index)
    return 1000 * statistics.median(times)


def throughput(fn: Callable[[np.ndarray], Any], batches: list[np.ndarray], budget: float) -> float:
    """Samples per second over ``batches``, stopping early after ``budget`` seconds."""
    done, started = 0, time.perf_counter()
    for batch in batches:
        fn(batch)
        done += len(batch)
        if time.perf_counter() - started > budget:
            break
    return done / (time.perf_counter() - started)


def runs(repeats: int) -> int:
    """How many runs a best-of takes: ``repeats``, or one in a smoke run (no figure meant)."""
    return 1 if SMOKE else repeats


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    """The best of ``repeats`` runs: the machine is shared, so noise only ever slows a run."""
    return max(fn() for _ in range(runs(repeats)))


class NpyDataset:
    """The limit for the DataLoader row: a memmapped ``.npy`` with batched fetches."""

    def __init__(self, path: Path):
        self.path = path
        self.length = int(np.load(path, mmap_mode="r").shape[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {"image": np.array(np.load(self.path, mmap_mode="r")[index])}

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        rows = np.load(self.path, mmap_mode="r")[indices]
        return [{"image": row} for row in rows]


def loader_epoch(dataset: Any, batches: Any, workers: int) -> float:
    """Samples per second of one DataLoader epoch (worker start-up included)."""
    import torch.utils.data

    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, num_workers=workers, multiprocessing_context="fork"
    )
    started = time.perf_counter()
    count = sum(len(batch["image"]) for batch in loader)
    return count / (time.perf_counter() - started)


def cached_epochs(path: Path, args: argparse.Namespace) -> tuple[float, float]:
    """A ``cache_bytes="split"`` reader: its first, whole epoch and its best later epoch."""
    sampler = ChunkSampler(args.samples, args.chunk, seed=0)
    with contextlib.ExitStack() as stack:
        if path.suffix == ".npy":
            memory = np.load(path, mmap_mode="r")
            read: Callable[[np.ndarray], Any] = memory.__getitem__
        else:
            release = Release(
                path, "train", fields=["image"], batch_size=BATCH, cache_bytes="split"
            )
            read = stack.enter_context(release).read
        sampler.set_epoch(0)
        first = throughput(read, sampler.batches(BATCH), math.inf)  # fills the cache
        later = 0.0
        for epoch in range(1, 1 + runs(6)):
            sampler.set_epoch(epoch)
            later = max(later, throughput(read, sampler.batches(BATCH), args.budget))
    return first, later


def persistent_loader_epochs(dataset: Any, batches: Any, workers: int) -> float:
    """Samples per second of the best later epoch of a DataLoader that keeps its workers."""
    import torch.utils.data

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=workers,
        multiprocessing_context="fork",
        persistent_workers=True,
    )
    best = 0.0
    for epoch in range(1 + runs(3)):
        batches.set_epoch(epoch)
        started = time.perf_counter()
        count = sum(len(batch["image"]) for batch in loader)
        if epoch:  # the first epoch starts the workers and fills their caches
            best = max(best, count / (time.perf_counter() - started))
    del loader  # stops the workers
    return best


def measure(path: Path, npy: np.ndarray | None, args: argparse.Namespace) -> dict[str, float]:
    """Every number of one row of the main table."""
    rng = np.random.default_rng(1)
    probes = rng.integers(0, args.samples, size=args.probes)
    naive_batches = [rng.integers(0, args.samples, size=BATCH) for _ in range(64)]
    sampler = ChunkSampler(args.samples, args.chunk, seed=0)

    def epochs(read: Callable[[np.ndarray], Any], repeats: int) -> float:
        def one(epoch: int) -> float:
            sampler.set_epoch(epoch)
            return throughput(read, sampler.batches(BATCH), args.budget)

        return max(one(epoch) for epoch in range(runs(repeats)))

    row: dict[str, float] = {}
    if npy is not None:
        row["single_ms"] = median_ms(lambda i: np.array(npy[i]), probes)
        row["naive"] = best_of(
            5,
            lambda: throughput(
                lambda b: [np.array(npy[i]) for i in b.tolist()], naive_batches, args.budget
            ),
        )
        row["random_batch"] = best_of(
            5, lambda: throughput(lambda b: npy[b], naive_batches, args.budget)
        )
        row["sampler"] = epochs(lambda b: npy[b], 7)
        row["prefetched"] = max(prefetched_epoch(path, args, epoch=e) for e in range(runs(7)))
        return row
    # HDF5 shares one chunk cache per dataset between the openings of one process, sized by
    # the first: so each reader below is closed before the next one opens.
    with Release(path, "train", fields=["image"], batch_size=1) as single:
        row["single_ms"] = median_ms(lambda i: single.read([i]), probes)
    with h5py.File(path, "r") as handle:  # what a naive Dataset does: default cache, row by row
        dataset = handle["train/image"]
        row["naive_single_ms"] = median_ms(lambda i: dataset[i], probes[: args.probes // 4])
        row["naive"] = throughput(
            lambda b: [dataset[i] for i in b.tolist()], naive_batches, args.budget
        )
        row["random_batch"] = throughput(
            lambda b: dataset[np.unique(b)], naive_batches, args.budget
        )
    with Release(path, "train", fields=["image"], batch_size=BATCH) as release:
        row["sampler"] = epochs(release.read, 7 if row["single_ms"] < 2 else 3)
    repeats = runs(7 if row["single_ms"] < 2 else 3)
    row["prefetched"] = max(prefetched_epoch(path, args, epoch=e) for e in range(repeats))
    return row


def loader_rows(
    paths: dict[str, Path], args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, float]]:
    """DataLoader epochs: fresh workers each epoch, and persistent workers with a split cache."""
    from h5etl.readers import H5Dataset

    fresh, kept = {}, {}
    for name, path in paths.items():
        if name == "npy":
            dataset: Any = NpyDataset(path)
            cached: Any = dataset
            batches: Any = ChunkSampler(args.samples, args.chunk, seed=0).batch_sampler(BATCH)
        else:
            dataset = H5Dataset(path, "train", fields=["image"], batch_size=BATCH)
            cached = H5Dataset(
                path, "train", fields=["image"], batch_size=BATCH, cache_bytes="split"
            )
            batches = dataset.batch_sampler(BATCH, seed=0)
        fresh[name] = best_of(3, lambda: loader_epoch(dataset, batches, args.workers))  # noqa: B023
        kept[name] = persistent_loader_epochs(cached, batches, args.workers)
    return fresh, kept


def chunk_tradeoff(data: np.ndarray, folder: Path, args: argparse.Namespace) -> list[str]:
    """Random single-sample latency and batch throughput against chunk size (lzf)."""
    lines = [
        "| chunk (samples) | chunk size | lzf ratio | random 1 sample, sized cache (ms) "
        "| random 1 sample, h5py default cache (ms) | random batch-32, row by row (samples/s) "
        "| chunk-aware sampler batch-32 (samples/s) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for chunk in args.chunks:
        path = folder / f"lzf-c{chunk}.h5"
        write_h5(path, data, chunk, FORMATS["lzf"])
        warm(path)
        bench = argparse.Namespace(**{**vars(args), "chunk": chunk})
        row = measure(path, None, bench)
        ratio = data.nbytes / path.stat().st_size
        mib = chunk * math.prod(SHAPE) / 2**20
        lines.append(
            f"| {chunk} | {mib:.2f} MiB | {ratio:.2f} | {row['single_ms']:.2f} "
            f"| {row['naive_single_ms']:.2f} | {row['naive']:,.0f} | {row['sampler']:,.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--release" in argv:  # a real release: every other option is read_release.py's
        import read_release

        at = argv.index("--release")
        return read_release.main([*argv[:at], *argv[at + 1 :]])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--chunks", type=int, nargs="*", default=[32, 8, 1])
    parser.add_argument("--probes", type=int, default=200, help="random single-sample reads")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per throughput run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=4, help="iter_batches(prefetch=)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    parser.add_argument("--no-loader", action="store_true", help="skip the DataLoader rows")
    parser.add_argument("--release", type=Path, help="measure this release (read_release.py)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        data = synthetic(args.samples)
        paths: dict[str, Path] = {}
        for name, filters in FORMATS.items():
            paths[name] = folder / f"{name}.h5"
            write_h5(paths[name], data, args.chunk, filters)
        paths["npy"] = folder / "images.npy"
        np.save(paths["npy"], data)
        for path in paths.values():
            warm(path)
        print(
            f"wrote {args.samples} samples of {SHAPE} uint8 ({data.nbytes / 2**20:.0f} MiB "
            f"raw) in {time.perf_counter() - started:.1f} s, chunks of {args.chunk}; "
            f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f}), h5py {h5py.__version__}, "
            f"HDF5 {h5py.version.hdf5_version}",
            file=sys.stderr,
        )
        rows = {}
        for name, path in paths.items():
            npy = np.load(path, mmap_mode="r") if name == "npy" else None
            rows[name] = measure(path, npy, args)
            print(f"measured {name}", file=sys.stderr)
        del npy  # no mapping may stay alive, or the cold passes read mapped pages
        # Best of two cold epochs, alternating plain and prefetched, for every file alike.
        cold: dict[str, float] = {}
        cold_ahead: dict[str, float] = {}
        for _ in range(runs(2)):
            for name, path in paths.items():
                cold[name] = max(cold.get(name, 0.0), cold_epoch(path, args))
                ahead = cold_epoch(path, args, prefetch=args.prefetch)
                cold_ahead[name] = max(cold_ahead.get(name, 0.0), ahead)
        cached = {name: cached_epochs(path, args) for name, path in paths.items()}
        loader, kept = ({}, {}) if args.no_loader else loader_rows(paths, args)
        limit = rows["npy"]["sampler"]
        print(
            f"\n### Read throughput, {args.samples} x 3x224x224 uint8, chunks of {args.chunk} "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n"
        )
        print(
            "| format | ratio | random 1 sample (ms) | naive batch-32, row by row (samples/s) "
            "| naive batch-32, one fancy read (samples/s) | chunk-aware sampler batch-32 "
            "(samples/s) | sampler vs npy | sampler vs naive | sampler, cold page cache "
            "(samples/s) | cold vs npy cold | DataLoader 2 workers (samples/s) "
            "| DataLoader vs npy |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        npy_loader = loader.get("npy", float("nan"))
        for name, row in rows.items():
            ratio = data.nbytes / paths[name].stat().st_size
            print(
                f"| {name} | {ratio:.2f} | {row['single_ms']:.3f} | {row['naive']:,.0f} "
                f"| {row['random_batch']:,.0f} | {row['sampler']:,.0f} "
                f"| {row['sampler'] / limit:.2f}x | {row['sampler'] / row['naive']:.1f}x "
                f"| {cold[name]:,.0f} | {cold[name] / cold['npy']:.2f}x "
                f"| {loader.get(name, float('nan')):,.0f} "
                f"| {loader.get(name, float('nan')) / npy_loader:.2f}x |"
            )
        print(
            f"\n### Prefetched sampler: iter_batches(batch_size={BATCH}, "
            f"prefetch={args.prefetch}) against the .npy limits\n"
        )
        print(
            "| format | prefetched, warm (samples/s) | vs npy warm | vs npy warm prefetched "
            "| prefetched, cold (samples/s) | vs npy cold | vs npy cold prefetched "
            "| vs own plain sampler (warm / cold) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        npy_ahead = rows["npy"]["prefetched"]
        for name, row in rows.items():
            print(
                f"| {name} | {row['prefetched']:,.0f} | {row['prefetched'] / limit:.2f}x "
                f"| {row['prefetched'] / npy_ahead:.2f}x | {cold_ahead[name]:,.0f} "
                f"| {cold_ahead[name] / cold['npy']:.2f}x "
                f"| {cold_ahead[name] / cold_ahead['npy']:.2f}x "
                f"| {row['prefetched'] / row['sampler']:.1f}x / "
                f"{cold_ahead[name] / cold[name]:.1f}x |"
            )
        print(
            '\n### Split cache: a reader made with cache_bytes="split" (each chunk decoded '
            "once per process), chunk-aware sampler batch-32\n"
        )
        print(
            "| format | first epoch, fills the cache (samples/s) | later epochs (samples/s) "
            "| later vs npy | DataLoader 2 persistent workers, later epochs (samples/s) "
            "| vs npy |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        npy_kept = kept.get("npy", float("nan"))
        for name in paths:
            first, later = cached[name]
            print(
                f"| {name} | {first:,.0f} | {later:,.0f} | {later / cached['npy'][1]:.2f}x "
                f"| {kept.get(name, float('nan')):,.0f} "
                f"| {kept.get(name, float('nan')) / npy_kept:.2f}x |"
            )
        print("\n### Chunk size trade-off (lzf), random access\n")
        print("\n".join(chunk_tradeoff(data, folder, args)))
        print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
