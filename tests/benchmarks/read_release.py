"""Read benchmark on a real release: random single samples (first touch and steady state),
sequential epochs against a raw memmap of the same arrays, peak memory and the cache's bytes.

Run on its own, or as ``read.py --release PATH`` (never under pytest's timing; it asserts
nothing about time)::

    h5etl build configs/bench-blosc-lz4.yaml      # e.g. the 3,000-pair corpus, default codec
    python tests/benchmarks/read_release.py /path/to/bench.h5 --split train

Every phase runs in a child process of its own (this script with ``--phase``), so its peak
RSS (``VmHWM``) is that phase's alone; the table states it beside the RSS after importing
and opening the release (``base``) and the decoded chunks the reader's cache held at the end.
The file is read once before timing: page-cache-warm figures, as a second epoch sees them.

Phases (a "sample" is every field of the split, text included, as ``Release.read([i])``
returns it; the memmap row has the array fields only):

- ``first-touch``: a fresh reader, one random row of every chunk, the chunks in random order:
  each read is the first touch of its chunk in this process (no decoded chunk to reuse).
- ``uniform``: the default cache (``batch_size=1``), uniform random rows over the split;
  ``--warmup`` reads, then ``--probes`` timed reads (the steady state of a random sampler).
- ``split-cache``: ``cache_bytes="split"``, warmed by one pass of single reads in file
  order (each chunk decoded whole once and kept), then the same timed random reads.
- ``sequential``: ``ChunkSampler`` epochs of batches of 32 through ``Release.read`` (array
  fields) and the same batches from ``.npy`` copies of the fields read with
  ``np.load(mmap_mode="r")`` (the limit), epochs alternating, best of ``--epochs`` each;
  ``memmap`` reads the copies alone, for the memory they cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 32
PHASES = ("first-touch", "uniform", "split-cache", "sequential", "memmap")


def rss_kib(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


class AnonPeak:
    """The largest ``RssAnon`` seen between reads: the reader's own memory (decoded chunks,
    buffers), not the file's pages that a mapping counts in ``VmRSS`` (page cache)."""

    def __init__(self) -> None:
        self.kib = rss_kib("RssAnon")

    def sample(self) -> None:
        self.kib = max(self.kib, rss_kib("RssAnon"))


def timed(read: Callable[[int], Any], rows: list[int], peak: AnonPeak) -> list[float]:
    out = []
    for row in rows:
        started = time.perf_counter()
        read(row)
        out.append(time.perf_counter() - started)
        peak.sample()  # (outside the timing)
    return out


def cache_state(release: Any) -> dict[str, int]:
    """The reader's decoded-chunk cache: bytes held, chunks decoded whole, reads in part."""
    decoded = getattr(release, "_decoded", None)
    if not decoded:
        return {"held": 0, "loads": 0, "parts": 0}
    cache = decoded[1]
    return {
        "held": int(cache.held),
        "loads": int(cache.loads),
        "parts": int(getattr(cache, "parts", 0)),  # (older trees do not count parts)
    }


def random_phase(path: Path, split: str, phase: str, args: argparse.Namespace) -> dict[str, Any]:
    from h5etl.readers import Release

    rng = np.random.default_rng(args.seed)
    cache: Any = "split" if phase == "split-cache" else None
    with Release(path, split, batch_size=1, cache_bytes=cache) as release:
        release.read_slice(0, 0)  # opens the file; decodes nothing
        base, peak = rss_kib("VmRSS"), AnonPeak()
        peak_base = peak.kib
        length, rows = len(release), release.chunk_rows

        def read(row: int) -> Any:
            return release.read([row])

        if phase == "first-touch":
            chunks = rng.permutation(-(-length // rows)).tolist()
            probes = [min(length - 1, c * rows + int(rng.integers(rows))) for c in chunks]
        elif phase == "split-cache":
            timed(read, list(range(length)), peak)
            probes = rng.integers(0, length, args.probes).tolist()
        else:
            timed(read, rng.integers(0, length, args.warmup).tolist(), peak)
            probes = rng.integers(0, length, args.probes).tolist()
        times = timed(read, probes, peak)
        state = cache_state(release)
    ms = sorted(1000 * t for t in times)
    return {
        "reads": len(ms),
        "median_ms": statistics.median(ms),
        "mean_ms": statistics.fmean(ms),
        "p90_ms": ms[int(0.9 * (len(ms) - 1))],
        "base_kib": base,
        "peak_kib": rss_kib("VmHWM"),
        "anon_base_kib": peak_base,
        "anon_peak_kib": peak.kib,
        **state,
    }


def sequential_phase(
    path: Path, split: str, phase: str, args: argparse.Namespace, npy: dict[str, str]
) -> dict[str, Any]:
    """Best epoch of each reader; in ``sequential`` the release's and the memmap's epochs
    alternate in one process (the machine is shared: a burst of load hits both alike)."""
    from h5etl.readers import ChunkSampler, Release

    fields = sorted(npy)
    with Release(path, split, batch_size=BATCH, fields=fields) as release:
        release.read_slice(0, 0)
        base, peak = rss_kib("VmRSS"), AnonPeak()
        peak_base = peak.kib
        sampler = ChunkSampler(len(release), release.chunk_rows, seed=args.seed)
        arrays = {n: np.load(p, mmap_mode="r") for n, p in npy.items()}

        def from_memmap(batch: np.ndarray) -> Any:
            return {n: a[batch] for n, a in arrays.items()}

        readers: dict[str, Callable[[np.ndarray], Any]] = {"memmap": from_memmap}
        if phase == "sequential":
            readers = {"release": release.read, **readers}
        epochs: dict[str, list[float]] = {name: [] for name in readers}
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for name in sorted(readers, reverse=bool(epoch % 2)):
                started, done = time.perf_counter(), 0
                for batch in sampler.batches(BATCH):
                    readers[name](batch)
                    done += len(batch)
                epochs[name].append(done / (time.perf_counter() - started))
                peak.sample()
        state = cache_state(release) if phase == "sequential" else {}
    mine = epochs.get("release", epochs["memmap"])
    return {
        "samples_s": max(mine),
        "memmap_samples_s": max(epochs["memmap"]),
        # each epoch against the memmap epoch next to it: what load bursts disturb least
        "ratio_median": statistics.median(
            a / b for a, b in zip(mine, epochs["memmap"], strict=True)
        ),
        "base_kib": base,
        "peak_kib": rss_kib("VmHWM"),
        "anon_base_kib": peak_base,
        "anon_peak_kib": peak.kib,
        **state,
    }


def child(args: argparse.Namespace) -> int:
    npy = json.loads(args.npy) if args.npy else {}
    if args.phase in ("sequential", "memmap"):
        result = sequential_phase(args.release, args.split, args.phase, args, npy)
    else:
        result = random_phase(args.release, args.split, args.phase, args)
    print(json.dumps(result))
    return 0


def run_phase(phase: str, args: argparse.Namespace, npy: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, str(args.release), "--split", args.split, "--phase", phase]
    cmd += ["--probes", str(args.probes), "--warmup", str(args.warmup)]
    cmd += ["--epochs", str(args.epochs), "--seed", str(args.seed), "--npy", json.dumps(npy)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def export_npy(path: Path, split: str, folder: Path) -> dict[str, str]:
    """The split's array fields as ``.npy`` files (the memmap limit reads these)."""
    from h5etl.readers import Release

    with Release(path, split) as release:
        names = [n for n in release.fields if not release.info[n].text and n not in release.ragged]
        out = {}
        for name in names:
            target = folder / f"{name}.npy"
            rows = np.lib.format.open_memmap(
                target, mode="w+", dtype=release.info[name].dtype,
                shape=(len(release), *release.info[name].shape),
            )  # fmt: skip
            for start in range(0, len(release), 256):
                rows[start : start + 256] = release.read_slice(start, start + 256)[name]
            rows.flush()
            del rows
            out[name] = str(target)
    return out


def warm(path: Path) -> None:
    with path.open("rb") as stream:
        while stream.read(1 << 24):
            pass


def table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    mib = 1 / 1024
    lines = [
        f"### Random single samples, {args.release} ({args.split}), {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}",
        "",
        "| phase | reads | median (ms) | mean (ms) | p90 (ms) | RSS base / peak (MiB) "
        "| anonymous base / peak (MiB) | cache held (MiB) | chunks decoded whole "
        "| reads in part |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in ("first-touch", "uniform", "split-cache"):
        r = results[phase]
        lines.append(
            f"| {phase} | {r['reads']} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} "
            f"| {r['p90_ms']:.3f} | {r['base_kib'] * mib:.0f} / {r['peak_kib'] * mib:.0f} "
            f"| {r['anon_base_kib'] * mib:.0f} / {r['anon_peak_kib'] * mib:.0f} "
            f"| {r['held'] / 2**20:.1f} | {r['loads']} | {r['parts']} |"
        )
    seq, limit = results["sequential"], results["memmap"]
    lines += [
        "",
        f"### Sequential: ChunkSampler batches of {BATCH}, array fields, best of {args.epochs} "
        "epochs each, the two readers' epochs alternating in one process (RSS of the memmap "
        "row: a process reading it alone)",
        "",
        "| reader | samples/s | vs memmap (best / median of epoch pairs) "
        "| RSS base / peak (MiB) | anonymous base / peak (MiB) | cache held (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| Release.read | {seq['samples_s']:,.0f} "
        f"| {seq['samples_s'] / seq['memmap_samples_s']:.2f}x / {seq['ratio_median']:.2f}x "
        f"| {seq['base_kib'] * mib:.0f} / {seq['peak_kib'] * mib:.0f} "
        f"| {seq['anon_base_kib'] * mib:.0f} / {seq['anon_peak_kib'] * mib:.0f} "
        f"| {seq['held'] / 2**20:.1f} |",
        f"| np.load(mmap_mode='r') | {seq['memmap_samples_s']:,.0f} | 1.00x "
        f"| {limit['base_kib'] * mib:.0f} / {limit['peak_kib'] * mib:.0f} "
        f"| {limit['anon_base_kib'] * mib:.0f} / {limit['anon_peak_kib'] * mib:.0f} | - |",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", type=Path, help="a release file or its link")
    parser.add_argument("--split", default="train")
    parser.add_argument("--probes", type=int, default=2000, help="timed random reads")
    parser.add_argument("--warmup", type=int, default=1000, help="untimed random reads first")
    parser.add_argument("--epochs", type=int, default=5, help="sequential epochs (best of)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="scratch for the .npy copies")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # a child's
    parser.add_argument("--npy", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.phase:
        return child(args)
    args.release = Path(os.path.realpath(args.release))
    warm(args.release)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a scratch folder named but not made yet
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        npy = export_npy(args.release, args.split, Path(tmp))
        for name in npy.values():
            warm(Path(name))
        results = {phase: run_phase(phase, args, npy) for phase in PHASES}
    print(table(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
