"""Scale-out benchmark: decoding on Dask and sharded writes against the local joblib build.

On the benchmark corpus (``corpus.py``; 3,000 image/mask pairs by default), interleaved
repeats (every contender once, then again, ...), medians:

- throughput, images/s: ``h5etl.build`` with the local joblib/loky pool (``--jobs 1``, ``2``),
  on a ``distributed.LocalCluster`` of 1 and of 2 worker processes (one thread each), and
  sharded (``--shards 2``, local; ``--vds``);
- the ceiling of one writer: MB/s of stored chunks through ``write_direct_chunk`` into a new
  file (flushed and fsynced), and of unpickling them as a result arrives (what the writer
  does besides writing); the ceiling of the stitch: MB/s of stored chunks carried from one
  file into another by ``sink_copy.carry_chunks`` (read, SHA-256, write), fsynced;
- the model's inputs: stored MB/s one decode core produces (the release's stored bytes over
  the CPU seconds of a ``--jobs 1`` build, which decodes and writes in this process), hence
  how many decode cores one writer can serve.

    python tests/benchmarks/dask_bench.py                       # 3000 pairs, 3 repeats
    python tests/benchmarks/dask_bench.py --samples 300 --repeats 1

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): no warm-up round
before the repeats, so each contender builds once per repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
from corpus import DEFAULT_DIR, DEFAULT_SAMPLES, CorpusParams, ensure_corpus
from installed import byte_compile, warm

import h5etl
from h5etl.dataflow import EncodedChunk
from h5etl.pipeline import run as pipeline
from h5etl.sink.chunk_copy import carry_chunks
from h5etl.sink.writer import LIBVER

MB = 1e6
SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _build(spec: Any, out: Path, **options: Any) -> dict[str, Any]:
    """One build into a fresh folder: wall, CPU of this process, samples, stored bytes."""
    shutil.rmtree(out, ignore_errors=True)
    started, cpu = time.perf_counter(), _cpu()
    report = pipeline.build(spec.model_copy(update={"output": out}), **options)
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    assert report.path is not None
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": wall,
        "samples": sum(report.samples.values()),
        "stored": report.stored_bytes,
        "workers": float(report.seconds.get("workers_decode", 0.0)),
        "cpu": cpu,
        "seconds": report.seconds,
    }


def _chunks_of(release: Path) -> list[tuple[str, tuple[int, ...], int, bytes]]:
    """Every stored chunk of the release's array datasets: (dataset, offset, mask, bytes)."""
    out = []
    with h5py.File(release) as handle:
        for split in ("train", "valid"):
            for name in ("image", "mask"):
                dataset = handle[f"{split}/{name}"]
                for index in range(dataset.id.get_num_chunks()):
                    offset = tuple(dataset.id.get_chunk_info(index).chunk_offset)
                    mask, data = dataset.id.read_direct_chunk(offset)
                    out.append((dataset.name, offset, int(mask), bytes(data)))
    return out


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def writer_ceiling(release: Path, scratch: Path) -> dict[str, float]:
    """MB/s of stored chunks: direct chunk writes (fsynced), unpickling, and the stitch."""
    chunks = _chunks_of(release)
    total = sum(len(data) for *_, data in chunks)
    target = scratch / "direct.h5"
    with h5py.File(release) as source:
        shapes = {path: (source[path].shape, source[path]) for path in {c[0] for c in chunks}}
        started = time.perf_counter()
        with h5py.File(target, "w", libver=LIBVER) as out:
            for path, (shape, like) in shapes.items():
                out.create_dataset(
                    path,
                    shape=shape,
                    maxshape=(None, *shape[1:]),
                    dtype=like.dtype,
                    chunks=like.chunks,
                    compression=like.compression,
                    shuffle=like.shuffle,
                )
            for path, offset, mask, data in chunks:
                out[path].id.write_direct_chunk(offset, data, mask)
        _fsync(target)
        direct = time.perf_counter() - started
    # what arrives at the writer: pickled results of ~2 MB chunk lists
    payload = [
        pickle.dumps([EncodedChunk(offset, mask, data, hashlib.sha256(data).hexdigest())])
        for _, offset, mask, data in chunks
    ]
    started = time.perf_counter()
    for blob in payload:
        pickle.loads(blob)
    unpickle = time.perf_counter() - started
    stitched = scratch / "stitched.h5"
    started = time.perf_counter()
    with h5py.File(release) as source, h5py.File(stitched, "w", libver=LIBVER) as out:
        for path, (shape, like) in shapes.items():
            out.create_dataset(
                path,
                shape=(0, *shape[1:]),
                maxshape=(None, *shape[1:]),
                dtype=like.dtype,
                chunks=like.chunks,
                compression=like.compression,
                shuffle=like.shuffle,
            )
            carry_chunks(source[path], out[path], row_offset=0)
    _fsync(stitched)
    stitch = time.perf_counter() - started
    return {
        "stored_mb": total / MB,
        "direct": total / MB / direct,
        "unpickle": total / MB / unpickle,
        "stitch": total / MB / stitch,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace) -> str:
    distributed: Any = importlib.import_module("distributed")  # the optional extra
    local = distributed.LocalCluster
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))
    warm(corpus.root)
    spec = h5etl.load_spec(corpus.config("lzf"))
    work = Path(tempfile.mkdtemp(prefix="dask-bench-", dir=args.dir))
    one = local(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0")
    two = local(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0")
    contenders: dict[str, Callable[[Path], dict[str, Any]]] = {
        "local joblib -j1": lambda out: _build(spec, out, jobs=1),
        "local joblib -j2": lambda out: _build(spec, out, jobs=2),
        "Dask, 1 worker": lambda out: _build(spec, out, scheduler=one.scheduler_address),
        "Dask, 2 workers": lambda out: _build(spec, out, scheduler=two.scheduler_address),
        "local -j2 --shards 2 (stitched)": lambda out: _build(spec, out, jobs=2, shards=2),
        "local -j2 --shards 2 --vds": lambda out: _build(spec, out, jobs=2, shards=2, virtual=True),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    try:
        for contender in [] if SMOKE else contenders.values():  # warm: pools up, corpus cached
            contender(work / "out")
        for repeat in range(args.repeats):
            for name, contender in contenders.items():
                got = contender(work / "out")
                runs[name].append(got)
                print(
                    f"  [{repeat + 1}/{args.repeats}] {name}: {got['wall']:.2f} s", file=sys.stderr
                )
        reference = pipeline.build(spec.model_copy(update={"output": work / "ref"}), jobs=2)
        assert reference.path is not None
        ceilings = [writer_ceiling(reference.path, work) for _ in range(args.repeats)]
    finally:
        one.close()
        two.close()
        shutil.rmtree(work, ignore_errors=True)
    return _tables(runs, ceilings, args)


def _tables(
    runs: dict[str, list[dict[str, Any]]],
    ceilings: list[dict[str, float]],
    args: argparse.Namespace,
) -> str:
    base = _median([r["samples"] / r["wall"] for r in runs["local joblib -j2"]])
    lines = [
        f"{args.samples} pairs, {args.repeats} interleaved repeats, medians; "
        f"load {os.getloadavg()[0]:.1f} at the end; {os.cpu_count()} cores",
        "",
        "| contender | images/s | wall s | / local -j2 | stitch or map s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, items in runs.items():
        rate = _median([r["samples"] / r["wall"] for r in items])
        wall = _median([r["wall"] for r in items])
        joined = _median([r["seconds"].get("stitch", r["seconds"].get("map", 0.0)) for r in items])
        lines.append(f"| {name} | {rate:.0f} | {wall:.2f} | {rate / base:.2f} | {joined:.2f} |")
    # -j1 decodes and writes in this process: its CPU is one core's work, whatever the load
    j1 = runs["local joblib -j1"]
    per_core = _median([r["stored"] / MB / r["cpu"] for r in j1])
    direct = _median([c["direct"] for c in ceilings])
    unpickle = _median([c["unpickle"] for c in ceilings])
    stitch = _median([c["stitch"] for c in ceilings])
    writer = 1 / (1 / direct + 1 / unpickle)
    lines += [
        "",
        "| stored MB | one writer: direct chunk writes, fsynced | unpickling results | "
        "writer (both) | stitch: carry_chunks, fsynced | stored MB/s per decode core | "
        "decode cores one writer serves |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {ceilings[0]['stored_mb']:.0f} | {direct:.0f} MB/s | {unpickle:.0f} MB/s | "
        f"{writer:.0f} MB/s | {stitch:.0f} MB/s | {per_core:.1f} | {writer / per_core:.0f} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    byte_compile()
    print(run(args))


if __name__ == "__main__":
    main()
