"""Codec and chunk-size benchmark: what each candidate default costs to build, store and read.

For every candidate codec and chunk size the runner builds the bench corpus (``corpus.py``)
with ``h5etl build CONFIG --jobs 2 --quiet`` in a child process (wall and CPU of the process
tree, as ``build.py`` measures them), notes the size of the release file, and reads it back in
a fresh child through h5etl's own ``Release`` (the ``train`` split, fields ``image`` and
``mask``, batches of 32, page cache warm unless said otherwise):

- **sequential**: ``Release.iter_batches(shuffle=False, prefetch=0)``, file order, one thread;
- **sequential, prefetch=4**: the same with the default read-ahead threads;
- **shuffled**: the chunk-aware shuffled order, ``iter_batches(shuffle=True, prefetch=4)``;
- **cold**: one sequential prefetched epoch right after dropping the file from the page cache;
- **random 1 sample**: median latency of ``Release(batch_size=1).read([i])`` at random ``i``.

Each repeat runs every candidate in turn (interleaved, the order rotated between repeats);
tables show medians over the repeats, and ratios against the current default (lzf, chunks of
32) computed within each repeat, then the median. Nothing here asserts a time.

    python tests/benchmarks/codec_bench.py                       # all candidates, chunks 8/16/32
    python tests/benchmarks/codec_bench.py --candidates lzf blosc-lz4 --chunks 8 32 --repeats 5

``--run read --file RELEASE`` is the read child the runner launches. ``H5ETL_BENCH_SMOKE=1``
(the test suite's smoke run, no figure meant) runs it, and each build, in the runner's process
(``build.measure_child``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from build import IN_PROCESS, SMOKE, Run, _h5etl_origin, become_subreaper, measure_child
from corpus import (
    CONFIG_TEMPLATE,
    DEFAULT_DIR,
    DEFAULT_SAMPLES,
    FIELD_SIZE,
    Corpus,
    CorpusParams,
    ensure_corpus,
)

MIB = 2**20
BATCH = 32
FIELDS = ("image", "mask")
HERE = Path(__file__).resolve()

EVERY_TOOL = "every HDF5 tool (deflate is built in)"
HDF5PLUGIN = "hdf5plugin in Python; elsewhere the {} filter plugin on HDF5_PLUGIN_PATH"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One codec setting as a config's ``storage.compression`` writes it."""

    compression: str  # YAML flow text
    reads_with: str  # what a reader outside h5etl needs


CANDIDATES: dict[str, Candidate] = {
    "none": Candidate("none", "every HDF5 tool"),
    "lzf": Candidate("lzf", "h5py; elsewhere the LZF filter plugin (not in hdf5plugin)"),
    "gzip-1": Candidate("{codec: gzip, level: 1}", EVERY_TOOL),
    "gzip-4": Candidate("{codec: gzip, level: 4}", EVERY_TOOL),
    "blosc-lz4": Candidate(
        "{codec: blosc, cname: lz4, blosc_shuffle: byte}", HDF5PLUGIN.format("Blosc")
    ),
    "blosc-zstd-1": Candidate(
        "{codec: blosc, cname: zstd, level: 1, blosc_shuffle: byte}", HDF5PLUGIN.format("Blosc")
    ),
    "blosc-zstd-5": Candidate(
        "{codec: blosc, cname: zstd, blosc_shuffle: byte}", HDF5PLUGIN.format("Blosc")
    ),
    "zstd-1": Candidate("{codec: zstd, level: 1}", HDF5PLUGIN.format("Zstd")),
    "zstd-3": Candidate("{codec: zstd, level: 3}", HDF5PLUGIN.format("Zstd")),
}
DEFAULT_CHUNKS = (8, 16, 32)
BASELINE = ("lzf", 32)  # the recipe's default today


def label(name: str, chunk: int) -> str:
    return f"{name}-c{chunk}"


def write_config(corpus: Corpus, name: str, chunk: int) -> Path:
    """corpus.py's build config with this candidate's storage and output lines, beside it."""
    compression = CANDIDATES[name].compression
    values = {"samples": corpus.params.samples, "size": FIELD_SIZE, "chunks": chunk}
    text = CONFIG_TEMPLATE.format(**values, codec=name, name=name, compression=compression)
    replaced = {
        "#": f"# {name}, chunks of {chunk}, on the {corpus.params.samples}-sample corpus; "
        "written by codec_bench.py.",
        "storage:": f"storage: {{chunk_samples: {chunk}, compression: {compression}, "
        "shuffle: true}",
        "output:": f"output: releases/codecs/{label(name, chunk)}",
    }
    lines = text.splitlines()
    for key, line in replaced.items():
        if sum(old.startswith(key) for old in lines) != 1:
            raise RuntimeError(f"corpus.CONFIG_TEMPLATE has no single {key} line to replace")
        lines = [line if old.startswith(key) else old for old in lines]
    path = corpus.root / f"codecs-{label(name, chunk)}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# the read child


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache, so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with path.open("rb") as stream:
        while stream.read(1 << 24):
            pass


def epochs_rate(epoch: Callable[[int], Iterable[dict[str, Any]]], min_seconds: float) -> float:
    """Samples per second over whole epochs, as many as fill ``min_seconds`` (at least one)."""
    done, number, started = 0, 0, time.perf_counter()
    while True:
        done += sum(len(batch["image"]) for batch in epoch(number))
        number += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return done / elapsed


def run_read(path: Path, probes: int, min_seconds: float) -> dict[str, float]:
    """Every read figure of one release; each reader closed before the next opens."""
    import numpy as np

    from h5etl.readers import Release

    warm(path)
    out: dict[str, float] = {}
    with Release(path, "train", fields=FIELDS, batch_size=BATCH) as release:
        out["samples"] = len(release)
        release.read([0])  # opens the file and lists its chunks once, as any reader does

        def ordered(prefetch: int, shuffle: bool) -> Callable[[int], Iterable[dict[str, Any]]]:
            return lambda n: release.iter_batches(
                BATCH, shuffle=shuffle, seed=0, epoch=n, prefetch=prefetch
            )

        out["seq"] = epochs_rate(ordered(0, False), min_seconds)
        out["seq_prefetch"] = epochs_rate(ordered(4, False), min_seconds)
        out["shuffled"] = epochs_rate(ordered(4, True), min_seconds)
    indices = np.random.default_rng(1).integers(0, int(out["samples"]), size=probes).tolist()
    times = []
    with Release(path, "train", fields=FIELDS, batch_size=1) as single:
        single.read([0])
        for index in indices:
            started = time.perf_counter()
            single.read([index])
            times.append(time.perf_counter() - started)
    out["random_ms"] = 1000 * statistics.median(times)
    evict(path)
    with Release(path, "train", fields=FIELDS, batch_size=BATCH) as cold:
        out["cold"] = epochs_rate(
            lambda n: cold.iter_batches(BATCH, shuffle=False, epoch=n, prefetch=4), 0.0
        )
    return out


# --------------------------------------------------------------------------------------------
# the runner


@dataclass(slots=True)
class Cell:
    """One candidate at one chunk size, and its runs (one per repeat)."""

    name: str
    chunk: int
    config: Path
    builds: list[Run] = field(default_factory=list)
    reads: list[dict[str, float]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.chunk


def _release_file(folder: Path) -> Path:
    return sorted(p for p in folder.glob("*.h5") if not p.is_symlink())[-1]


def _raw_bytes(release: Path) -> int:
    """Uncompressed bytes of the pixel fields over every split."""
    import h5py

    with h5py.File(release, "r") as handle:
        return sum(
            handle[split][name].nbytes
            for split in handle
            if split != "diagnostics"
            for name in FIELDS
        )


def run_cell(corpus: Corpus, cell: Cell, args: argparse.Namespace) -> None:
    """Build the candidate, read the release back in a fresh child, then delete it."""
    folder = corpus.root / "releases" / "codecs" / label(cell.name, cell.chunk)
    shutil.rmtree(folder, ignore_errors=True)
    build, _ = measure_child(["h5etl", "build", str(cell.config), "--jobs", "2", "--quiet"])
    release = _release_file(folder)
    build.disk = release.stat().st_size
    build.extra["raw_bytes"] = _raw_bytes(release)
    child = [sys.executable, str(HERE), "--run", "read", "--file", str(release)]
    child += ["--probes", str(args.probes), "--min-seconds", str(args.min_seconds)]
    reads = json.loads(_read_child(child).splitlines()[-1])
    build.samples = int(reads["samples"])
    cell.builds.append(build)
    cell.reads.append(reads)
    shutil.rmtree(folder, ignore_errors=True)


def _read_child(child: list[str]) -> str:
    """The read child's output; smoke runs: run here (``build.measure_child``)."""
    if SMOKE:
        return measure_child(child)[1]
    # No /proc sampler beside the reads (measure() runs one): it would take CPU from them.
    done = subprocess.run(child, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(child)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def run_all(corpus: Corpus, cells: list[Cell], args: argparse.Namespace) -> None:
    for repeat in range(args.repeats):
        shift = repeat * len(cells) // args.repeats  # each repeat starts elsewhere in the list
        for cell in cells[shift:] + cells[:shift]:
            run_cell(corpus, cell, args)
            build, reads = cell.builds[-1], cell.reads[-1]
            print(
                f"  [{repeat + 1}/{args.repeats}] {label(*cell.key)}: build {build.wall:.2f} s, "
                f"{build.disk / MIB:.1f} MiB, sequential {reads['seq']:,.0f} samples/s, "
                f"random {reads['random_ms']:.2f} ms",
                file=sys.stderr,
                flush=True,
            )


# --------------------------------------------------------------------------------------------
# tables

# (column, figure of one repeat, ratio column or "" when the ratio is a time turned speed)
FIGURES: list[tuple[str, Callable[[Run, dict[str, float]], float]]] = [
    ("on disk MiB", lambda b, r: b.disk / MIB),
    ("build s (-j2)", lambda b, r: b.wall),
    ("build CPU s", lambda b, r: b.cpu),
    ("sequential samples/s", lambda b, r: r["seq"]),
    ("sequential, prefetch=4", lambda b, r: r["seq_prefetch"]),
    ("shuffled chunk-aware, prefetch=4", lambda b, r: r["shuffled"]),
    ("cold sequential, prefetch=4", lambda b, r: r["cold"]),
    ("random 1 sample ms", lambda b, r: r["random_ms"]),
]
RATIOS = [  # (column, index into FIGURES, invert: a time shown as a speed ratio)
    ("on disk", 0, False),
    ("build speed", 1, True),
    ("build CPU s", 2, False),
    ("sequential", 3, False),
    ("sequential, prefetch=4", 4, False),
    ("shuffled, prefetch=4", 5, False),
    ("cold sequential", 6, False),
    ("random 1 sample ms", 7, False),
]


def _values(cell: Cell, index: int) -> list[float]:
    pick = FIGURES[index][1]
    return [pick(b, r) for b, r in zip(cell.builds, cell.reads, strict=True)]


def _ratio(cell: Cell, base: Cell, index: int, invert: bool) -> float:
    """Median over repeats of candidate / baseline (inverted: baseline / candidate), per repeat."""
    pairs = zip(_values(cell, index), _values(base, index), strict=True)
    return statistics.median((b / a if invert else a / b) for a, b in pairs if a and b)


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def tables(cells: list[Cell]) -> str:
    base = next(c for c in cells if c.key == BASELINE)
    head = ["codec", "chunk", *(f[0] for f in FIGURES), "reads outside h5etl with"]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * len(FIGURES) + "---|"]
    for cell in cells:
        medians = [_number(statistics.median(_values(cell, i))) for i in range(len(FIGURES))]
        row = [cell.name, str(cell.chunk), *medians, CANDIDATES[cell.name].reads_with]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Against {label(*BASELINE)}, the current default: medians of per-repeat ratios "
        "(candidate / baseline, both from the same repeat). Build speed and the reads: above "
        "1 is faster; on disk, build CPU and random latency: below 1 is less.",
        "",
        "| codec | chunk | raw / stored | " + " | ".join(r[0] for r in RATIOS) + " |",
        "|---|---:|---:|" + "---:|" * len(RATIOS),
    ]
    for cell in cells:
        ratios = [f"{_ratio(cell, base, i, inv):.2f}x" for _, i, inv in RATIOS]
        raw = statistics.median(float(b.extra["raw_bytes"]) / b.disk for b in cell.builds)
        lines.append(f"| {cell.name} | {cell.chunk} | {raw:.2f} | " + " | ".join(ratios) + " |")
    lines += ["", "Per repeat (repeat 1 first): build s; sequential samples/s; random ms.", ""]
    lines += ["| codec | chunk | build s | sequential | random ms |", "|---|---:|---|---|---|"]
    for cell in cells:
        cols = [", ".join(_number(v) for v in _values(cell, i)) for i in (1, 3, 7)]
        lines.append(f"| {cell.name} | {cell.chunk} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def _load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def _uptime() -> str:
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or f"load average: {_load()}"


def benchmark(args: argparse.Namespace) -> str:
    import h5py

    # The corpus is written by a child: joblib's workers (and loky's resource tracker) would
    # otherwise stay alive as our children, and measure() waits for every child to exit. A
    # smoke run makes it here: it measures nothing in a child (build.measure_child).
    if not SMOKE:
        make = [sys.executable, str(HERE.with_name("corpus.py")), "--dir", str(args.dir)]
        make += ["--samples", str(args.samples)]
        subprocess.run(make, check=True, stdout=subprocess.DEVNULL)
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))  # cached, unless smoke
    wanted = [(n, c) for n in args.candidates for c in args.chunks]
    if BASELINE not in wanted:
        wanted.insert(0, BASELINE)
    cells = [Cell(n, c, write_config(corpus, n, c)) for n, c in wanted]
    before = _uptime()
    started = time.perf_counter()
    run_all(corpus, cells, args)
    after = _uptime()
    header = (
        f"## Codecs and chunk sizes\n\n{corpus.params.samples} image/mask PNG pairs "
        f"({corpus.root}), {os.cpu_count()} cores, medians of {args.repeats} interleaved "
        f"repeats ({time.perf_counter() - started:.0f} s); {_h5etl_origin()}; "
        f"h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}. Reads: train split, "
        f"fields image+mask, batches of {BATCH}, page cache warm except the cold column; "
        f"random: median of {args.probes} reads.\n\n"
        f"uptime before: `{before}`\n\nuptime after: `{after}`\n"
    )
    return header + "\n" + tables(cells) + "\n"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="corpus and scratch folder")
    parser.add_argument("--samples", type=_positive, default=DEFAULT_SAMPLES)
    parser.add_argument("--repeats", type=_positive, default=3)
    parser.add_argument("--output", type=Path, help="also write the tables here")
    parser.add_argument(
        "--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES)
    )
    parser.add_argument("--chunks", nargs="+", type=_positive, default=list(DEFAULT_CHUNKS))
    parser.add_argument("--probes", type=_positive, default=200, help="random single reads")
    parser.add_argument(
        "--min-seconds", type=float, default=1.0, help="read epochs until this much time passed"
    )
    parser.add_argument("--run", choices=["read"], help="child mode")
    parser.add_argument("--file", type=Path, help="the release the read child reads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.run == "read":
        print(json.dumps(run_read(args.file, args.probes, args.min_seconds)))
        return
    if not become_subreaper():
        print("warning: not a subreaper; CPU of orphaned workers may be missed", file=sys.stderr)
    text = benchmark(args)
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


IN_PROCESS[str(HERE)] = main  # smoke runs: the read child in the runner (build.measure_child)


if __name__ == "__main__":
    main()
