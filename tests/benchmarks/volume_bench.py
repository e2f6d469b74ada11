"""Volume benchmark: CT cases as DICOM series, built with ``pipeline: volumes``.

The corpus (``root/raw/ct/case_NNN/IMnnnn.dcm``, int16 HU slices of ``--size`` px, ``--slices``
per case, written slice by slice with pydicom; a raw ``.npy`` copy of each case beside it) is
deterministic and cached under ``--dir``. Figures, each a median over ``--repeats``, runs
interleaved:

- build throughput: ``h5etl build --jobs J --quiet`` against its own work limit, a child that
  does on all cores (joblib) what the workers must do and nothing else: the volume kind's
  decode of every case (read and decode each file and its SHA-256, order, rescale, exact
  cast, statistics, each slice's chunks compressed with the release's codec and tiles and
  hashed, the block digests); nothing is written. Both are timed as whole processes (start,
  imports, the config, the worker pool, the work). Target: build >= 0.85x the limit.
- random 3-D patch reads per second (``PatchSampler``, uniform, one process) against the same
  volumes as raw ``.npy`` memmaps (same patch starts, the patch copied out);
- bytes on disk: the release against the DICOM files and the raw voxels;
- ``--memory``: peak memory of the build's whole process tree at ``--jobs`` 1, 2 and 4,
  sampled every 20 ms: the sum of its processes' PSS (a page shared between processes
  counted once in all) plus the build's files in ``/dev/shm`` (results waiting there are
  tmpfs memory, in no process's RSS), minus the same build of as many one-slice cases (the
  baseline: interpreter, imports, worker pool), against 3x the largest case; the same with
  RSS beside it.

    python tests/benchmarks/volume_bench.py --cases 8 --slices 200 --size 512 --repeats 3
    python tests/benchmarks/volume_bench.py --memory --cases 20 --slices 500 --size 512 \
        --memory-jobs 2 4 --repeats 1

Child modes (``--run limit|patches``) are what the runner launches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from installed import byte_compile, warm

HERE = Path(__file__).resolve()
MIB = 2**20
DEFAULT_DIR = Path(os.environ.get("H5ETL_BENCH_DIR", "/tmp/h5etl-volume-bench"))
VERSION = 2  # bump when the generator changes, so caches are rebuilt
CONFIG = """\
# Benchmark volume build; written by volume_bench.py.
name: bench-volumes
pipeline: volumes
output: releases
splits: {{train: 1.0}}
sources:
  ct: {{dir: raw/ct, entries: folders}}
fields:
  ct: {{slice_shape: [{size}, {size}]{chunks}}}
"""


# --------------------------------------------------------------------------------------------
# the corpus


def ct_slice(rng: np.random.Generator, size: int, k: int, slices: int) -> np.ndarray:
    """One int16 slice in HU: air around an ellipse of tissue (noise 20 HU) with a bone."""
    t = (k + 0.5) / slices
    yy, xx = np.ogrid[-1 : 1 : size * 1j, -1 : 1 : size * 1j]
    radius = 0.55 + 0.3 * np.sin(np.pi * t)
    body = (yy / (radius * 0.8)) ** 2 + (xx / radius) ** 2 < 1
    bone = (yy / 0.15) ** 2 + ((xx - 0.2) / 0.1) ** 2 < 1
    hu = np.where(body, 40.0, -1000.0) + np.where(bone & body, 1100.0, 0.0)
    hu += rng.normal(0, np.where(body, 20.0, 5.0))
    plane: np.ndarray = np.clip(np.rint(hu), -1024, 3071).astype(np.int16)  # CT's range
    return plane


def ensure_corpus(base: Path, cases: int, slices: int, size: int, *, npy: bool = True) -> Path:
    """The corpus folder for these parameters, written case by case unless it is there;
    ``npy``: with a raw ``.npy`` copy of each case (for the patch reads)."""
    from h5etl.examples.volumes import write_dicom_series

    root = base / f"ct-c{cases}-z{slices}-s{size}-n{int(npy)}-v{VERSION}"
    manifest = {"cases": cases, "slices": slices, "size": size, "npy": npy, "version": VERSION}
    if (root / "corpus.json").exists() and json.loads(
        (root / "corpus.json").read_text()
    ) == manifest:
        return root
    shutil.rmtree(root, ignore_errors=True)
    partial = base / f"{root.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "npy").mkdir(parents=True)
    for case in range(cases):
        rng = np.random.default_rng([case, slices, size])
        name = f"case_{case:03d}"
        shape = (slices, size, size)
        memmap = (
            np.lib.format.open_memmap(partial / "npy" / f"{name}.npy", "w+", np.int16, shape)
            if npy
            else None
        )
        for k in range(slices):  # slice by slice: a case is never whole in memory
            plane = ct_slice(rng, size, k, slices)
            if memmap is not None:
                memmap[k] = plane
            write_dicom_series(partial / "raw" / "ct" / name, plane[None], series=name, first=k)
        if memmap is not None:
            memmap.flush()
        del memmap
    (partial / "corpus.json").write_text(json.dumps(manifest))
    partial.rename(root)
    return root


def write_config(root: Path, size: int, chunks: Sequence[int] | None) -> Path:
    extra = f", chunks: {list(chunks)}" if chunks else ""
    path = root / "bench.yaml"
    path.write_text(CONFIG.format(size=size, chunks=extra), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# measuring a process tree


def _children(pid: int) -> list[int]:
    found, frontier = [], [pid]
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
    while frontier:
        parent = frontier.pop()
        kids = [child for child, p in parents.items() if p == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _kib_field(path: str, name: str) -> int:
    """The bytes of a ``name: <n> kB`` line of a /proc file (0 if the process is gone)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _status_rss(pid: int) -> int:
    return _kib_field(f"/proc/{pid}/status", "VmRSS:")


def _pss(pid: int) -> int:
    """A process's proportional set size: its private pages, and each page it shares (a
    library's, a mapping of /dev/shm) divided by the processes that map it."""
    return _kib_field(f"/proc/{pid}/smaps_rollup", "Pss:")


SHM = Path("/dev/shm")
SHM_PREFIX = (
    "h5etl-values"  # h5etl.execute.shared_memory.PREFIX (not imported: the runner stays light)
)


def _shm_bytes(owner: int) -> int:
    """The bytes of the files in /dev/shm that the build ``owner``'s workers left for it
    and it has not taken yet (``shared_values`` names them for the parent; the parent
    unlinks a file as it maps it, and from then on its pages count in its PSS and RSS)."""
    total = 0
    for path in SHM.glob(f"{SHM_PREFIX}-{owner}-*"):
        try:
            total += path.stat().st_blocks * 512
        except OSError:
            continue
    return total


class TreeMemory(threading.Thread):
    """The peak memory of a process tree, sampled every 20 ms: the sum of its processes' PSS
    plus the bytes waiting for it in /dev/shm (tmpfs memory, in no process's RSS until
    mapped), and for comparison the same with RSS (which counts shared pages once per
    process that maps them)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.peak_rss, self.done = pid, 0, 0, threading.Event()
        self.peak_shm = 0

    def run(self) -> None:
        while not self.done.is_set():
            tree = [self.pid, *_children(self.pid)]
            shm = _shm_bytes(self.pid) if SHM.is_dir() else 0
            self.peak = max(self.peak, sum(_pss(p) for p in tree) + shm)
            self.peak_rss = max(self.peak_rss, sum(_status_rss(p) for p in tree) + shm)
            self.peak_shm = max(self.peak_shm, shm)
            self.done.wait(0.02)


def timed(cmd: Sequence[str], *, sample: bool = False) -> tuple[float, TreeMemory, str]:
    """Wall seconds, the peak tree memory (``TreeMemory``; sampled only if ``sample``: the
    sampler's CPU would come out of the timed work on 2 cores) and stdout of ``cmd``."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeMemory(proc.pid)
    if sample:
        sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.done.set()
    if sample:
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, sampler, out


def build(root: Path, jobs: int, *, sample: bool = False) -> tuple[float, TreeMemory, Path]:
    shutil.rmtree(root / "releases", ignore_errors=True)
    wall, memory, _ = timed(
        ["h5etl", "build", str(root / "bench.yaml"), "--jobs", str(jobs), "--quiet"],
        sample=sample,
    )
    return wall, memory, (root / "releases" / "bench-volumes.h5").resolve()


# --------------------------------------------------------------------------------------------
# child modes


def _limit_case(folder: str, kind: Any) -> int:
    """What a worker does for one case, nothing else: the volume kind's own decode (read
    and decode every file, SHA-256 of each, exact cast, statistics, each slice's chunks
    compressed and hashed, the block digests); nothing is written."""
    from h5etl.dataflow import Sample
    from h5etl.kinds.base import SampleContext

    sample = Sample(Path(folder).name, (Path(folder).name,), (("ct", str(Path(folder).parent)),))
    values = kind.decode(SampleContext(sample, [b""], {}, (folder,)))
    value = values[kind.name]
    if isinstance(value, np.ndarray):
        return _compressed_here(kind, value)
    encoded = value.encoded
    return sum(len(chunk.data) for block in encoded.blocks for chunk in block)


def _compressed_here(kind: Any, volume: np.ndarray) -> int:
    """Chunks of several slices (``--chunks``): the kind hands the voxels over whole, and the
    build's writer cuts and compresses them; the limit compresses them here, the case's slabs
    of ``layout.rows`` slices (the last one padded, as HDF5 pads an edge chunk) in the
    release's chunk tiles and codec. The writer's chunks run on across cases, so it compresses
    at most one slab fewer a case."""
    from h5etl.format.codec import encode_block

    layout = kind.columns[kind.name].layout
    stored = 0
    for start in range(0, len(volume), layout.rows):
        slab = volume[start : start + layout.rows]
        if len(slab) < layout.rows:
            slab = np.concatenate(
                [slab, np.zeros((layout.rows - len(slab), *slab.shape[1:]), slab.dtype)]
            )
        stored += sum(len(chunk.data) for chunk in encode_block(layout, slab))
    return stored


def run_limit(root: Path, jobs: int) -> None:
    from joblib import Parallel, delayed

    from h5etl.config.load import load_spec
    from h5etl.plan.kind_registry import kinds_of

    spec = load_spec(root / "bench.yaml")
    kind = next(k for k in kinds_of(spec) if k.name == "ct")
    folders = sorted(str(p) for p in (root / "raw" / "ct").iterdir())
    started = time.perf_counter()
    stored = Parallel(n_jobs=jobs)(delayed(_limit_case)(f, kind) for f in folders)
    print(json.dumps({"seconds": time.perf_counter() - started, "stored": sum(stored)}))


def run_patches(root: Path, release: Path, count: int, patch: Sequence[int]) -> None:
    from h5etl.readers.volume_patches import PatchSampler, patch_start
    from h5etl.readers.volumes import Volumes

    size = (patch[0], patch[1], patch[2])
    sampler = PatchSampler(release, "train", "ct", patch_size=size, foreground=0, length=count)
    started = time.perf_counter()
    for _ in sampler:
        pass
    h5_rate = count / (time.perf_counter() - started)
    import h5py

    from h5etl.format import contract as fileformat

    with Volumes(release, "train", "ct") as volumes:
        shapes = [volumes.shape_of(i) for i in range(len(volumes))]
    with h5py.File(release, "r") as f:  # each case's folder name, in the release's order
        names = f[fileformat.read_layout(f).path("train", "case")].asstr()[...]
    maps = [np.load(root / "npy" / f"{Path(n).name}.npy", mmap_mode="r") for n in names]
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for _ in range(count):
        case = int(rng.integers(len(maps)))
        z, y, x = patch_start(shapes[case], size, rng)
        np.array(
            maps[case][max(z, 0) : z + size[0], max(y, 0) : y + size[1], max(x, 0) : x + size[2]]
        )
    npy_rate = count / (time.perf_counter() - started)
    print(json.dumps({"h5": h5_rate, "npy": npy_rate}))


# --------------------------------------------------------------------------------------------
# the runner


def _child(*args: str) -> list[str]:
    return [sys.executable, str(HERE), *args]


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f}"


def throughput(root: Path, args: argparse.Namespace) -> list[str]:
    builds, limits, patches, release_bytes = [], [], [], 0
    for repeat in range(args.repeats):
        order = ["build", "limit"] if repeat % 2 == 0 else ["limit", "build"]
        for which in order:
            if which == "build":
                wall, _, release = build(root, args.jobs)
                builds.append(wall)
                release_bytes = release.stat().st_size
            else:
                # its process's wall, as the build's: both start Python, import, load the
                # config and start a worker pool (1.5 s of the limit's 10 here, at load 3)
                wall, _, _ = timed(
                    _child("--run", "limit", "--root", str(root), "--jobs", str(args.jobs))
                )
                limits.append(wall)
        _, _, out = timed(
            _child("--run", "patches", "--root", str(root), "--release", str(release),
                   "--count", str(args.patches), "--patch", *map(str, args.patch))
        )  # fmt: skip
        patches.append(json.loads(out.splitlines()[-1]))
    dicom = sum(f.stat().st_size for f in (root / "raw" / "ct").rglob("*.dcm"))
    voxels = args.cases * args.slices * args.size * args.size * 2
    b, lim = statistics.median(builds), statistics.median(limits)
    h5 = statistics.median(p["h5"] for p in patches)
    npy = statistics.median(p["npy"] for p in patches)
    return [
        f"corpus: {args.cases} cases of {args.slices} x {args.size} x {args.size} int16 "
        f"({_mib(voxels)} MiB of voxels), --jobs {args.jobs}, {args.repeats} repeats",
        "",
        "| figure | value |",
        "|---|---|",
        f"| build wall (median) | {b:.2f} s ({voxels / MIB / b:,.0f} MiB/s of voxels) |",
        f"| work limit wall (decode, compress, digests; all cores; no writes) | {lim:.2f} s |",
        f"| per repeat: build / limit s | "
        f"{', '.join(f'{x:.1f} / {y:.1f}' for x, y in zip(builds, limits, strict=True))} |",
        f"| build / limit throughput (ratio of the medians) | **{lim / b:.2f}x** "
        "(target >= 0.85x) |",
        f"| build / limit throughput (median of each repeat's ratio: a build and its limit "
        f"run back to back, so a load that drifts between repeats cancels) | "
        f"**{statistics.median(y / x for x, y in zip(builds, limits, strict=True)):.2f}x** |",
        f"| random 3-D patches {tuple(args.patch)} per s: release | {h5:,.1f} |",
        f"| random 3-D patches per s: raw .npy memmaps | {npy:,.1f} |",
        f"| release / memmap patch rate | {h5 / npy:.2f}x |",
        f"| on disk: release | {_mib(release_bytes)} MiB "
        f"({release_bytes / voxels:.2f} of the voxels) |",
        f"| on disk: DICOM inputs | {_mib(dicom)} MiB (release {release_bytes / dicom:.2f}x) |",
    ]


def memory(root: Path, tiny: Path, args: argparse.Namespace) -> list[str]:
    """Peak memory against the baseline, per ``--jobs``: PSS + /dev/shm (the target's
    figure) and, for comparison, RSS + /dev/shm (shared library pages once per process)."""
    case = args.slices * args.size * args.size * 2
    lines = [
        f"corpus: {args.cases} cases of {args.slices} x {args.size} x {args.size} int16 "
        f"(a case {_mib(case)} MiB); baseline: {args.cases} one-slice cases, same --jobs; "
        "memory: the tree's PSS + the build's files in /dev/shm, sampled every 20 ms",
        "",
        "| --jobs | peak MiB | baseline MiB | peak - baseline MiB | / largest case "
        "| limit 3x | peak in /dev/shm MiB | with RSS: peak - baseline MiB, / case |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for jobs in args.memory_jobs:
        peaks = [build(root, jobs, sample=True)[1] for _ in range(args.repeats)]
        bases = [build(tiny, jobs, sample=True)[1] for _ in range(args.repeats)]
        peak = statistics.median(m.peak for m in peaks)
        base = statistics.median(m.peak for m in bases)
        shm = statistics.median(m.peak_shm for m in peaks)
        rss = statistics.median(m.peak_rss for m in peaks)
        rss_base = statistics.median(m.peak_rss for m in bases)
        over = (peak - base) / case
        lines.append(
            f"| {jobs} | {_mib(peak)} | {_mib(base)} | {_mib(peak - base)} | **{over:.2f}x** | "
            f"{'met' if over < 3 else 'MISSED'} | {_mib(shm)} | {_mib(rss - rss_base)}, "
            f"{(rss - rss_base) / case:.2f}x |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--slices", type=int, default=200)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--chunks", type=int, nargs=3, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--patches", type=int, default=200)
    parser.add_argument("--patch", type=int, nargs=3, default=[64, 128, 128])
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-jobs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--corpus-only", action="store_true", help="write the corpus, no runs")
    parser.add_argument("--run", choices=["limit", "patches"])
    parser.add_argument("--root", type=Path)
    parser.add_argument("--release", type=Path)
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args(argv)
    if args.run == "limit":
        return run_limit(args.root, args.jobs)
    if args.run == "patches":
        return run_patches(args.root, args.release, args.count, args.patch)
    byte_compile()
    root = ensure_corpus(args.dir, args.cases, args.slices, args.size, npy=not args.memory)
    write_config(root, args.size, args.chunks)
    if args.corpus_only:
        return None
    if args.memory:
        tiny = ensure_corpus(args.dir, args.cases, 1, args.size, npy=False)
        write_config(tiny, args.size, args.chunks)
        lines = memory(root, tiny, args)
    else:
        warm(root)
        lines = throughput(root, args)
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    return None


if __name__ == "__main__":
    main()
