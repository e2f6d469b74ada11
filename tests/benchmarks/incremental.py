"""Incremental build benchmark: a full build, an unchanged rebuild and 5% more pairs, side by side.

On the 3,000-pair corpus (``corpus.py``), in a work folder of hard links (the files' sizes and
mtimes are the corpus's, as a real folder that did not change). Each repeat runs, each build
in a child process, one after another (each needs the release before it):

    full       a fresh output folder, every sample decoded               (v1, 3,000 pairs)
    unchanged  the same inputs again: up to date, no release published   (still v1)
    copy       the same inputs with new notes: a release, every block carried (v2)
    add 5%     150 more pairs linked in: carried + the new ones decoded   (v3, 3,150 pairs)
    full 5%    the same 3,150 pairs with --full: every sample decoded     (v4)

and the table gives the medians over the repeats and the ratios the issue sets targets for
(unchanged / full <= 10%, add 5% / full 5% <= 15%; copy / full has none), for the build call
alone (the pipeline's modules imported before it) and for the whole process (interpreter
start, imports and worker start-up included), with each repeat's ratio beside the median.

    python tests/benchmarks/incremental.py [--repeats 5] [--jobs 2] [--dir /tmp/h5etl-bench]
        [--in-process]   (every build in this process: the worker pool stays warm)

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): each child's code runs
in this process instead (h5etl imported once), from its arguments to its JSON line.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corpus import DEFAULT_DIR, CorpusParams, ensure_corpus
from installed import byte_compile, exec_child, warm

HERE = Path(__file__).resolve()
SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"
BASE = 3000
CHILD = """
import json, sys, time
started = time.perf_counter()
import h5etl
spec = h5etl.load_spec(sys.argv[1])
build = h5etl.build  # imports the pipeline's modules: the process's cost, not the build's
if sys.argv[3] == "copy":  # new notes: a new release of the same samples, every block carried
    spec = spec.model_copy(update={"notes": "the same samples again"})
begun = time.perf_counter()
report = build(spec, jobs=int(sys.argv[2]), full=sys.argv[3] == "full")
print(json.dumps({"build": time.perf_counter() - begun, "reused": report.reused,
                  "samples": sum(report.samples.values()), "version": report.version,
                  "up_to_date": report.up_to_date}))
"""
CONFIG = """\
name: bench
output: releases
sources:
  image: {dir: images, glob: "*.png"}
  mask: {dir: masks, glob: "*.png"}
splits: {train: 0.8, valid: 0.2}
seed: 0
fields:
  image: {shape: [3, 224, 224], dtype: uint8, mode: RGB}
  mask: {shape: [1, 224, 224], dtype: uint8, mode: L, values: [0, 1]}
  filename: {dtype: str}
storage: {chunk_samples: 32, compression: lzf, shuffle: true}
"""
STEPS = ("full", "unchanged", "copy", "add 5%", "full 5%")
RATIOS = (
    ("unchanged / full", "unchanged", "full", "<= 10%"),
    ("copy / full", "copy", "full", "none"),
    ("add 5% / full 5%", "add 5%", "full 5%", "<= 15%"),
)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)  # another file system: copy2 keeps the mtime


def _cached(base: Path, total: int) -> Path | None:
    """A finished corpus of at least ``total`` pairs (sample i is the same in every size)."""
    for samples in sorted({total, 30000}):
        root = base / CorpusParams(samples=samples).folder_name
        if (root / "corpus.json").is_file():
            return root
    return None


def prepare(base: Path, samples: int) -> tuple[Path, list[tuple[Path, Path]]]:
    """The work folder (``samples`` pairs linked) and 5% more pairs (source, target)."""
    extra_n = max(2, samples // 20)
    total = samples + extra_n
    root = _cached(base, total) or ensure_corpus(base, CorpusParams(samples=total)).root
    work = base / "work" / "incremental"
    shutil.rmtree(work, ignore_errors=True)
    extra = []
    for kind in ("images", "masks"):
        (work / kind).mkdir(parents=True)
        for i in range(total):
            name = f"s{i:06d}.png"
            source, target = root / kind / name, work / kind / name
            if i < samples:
                _link(source, target)
            else:
                extra.append((source, target))
    (work / "bench.yaml").write_text(CONFIG)
    return work, extra


def run(work: Path, jobs: int, mode: str) -> dict[str, Any]:
    """One build in a child process; smoke runs: ``CHILD`` in this process (``exec_child``)."""
    args = [str(work / "bench.yaml"), str(jobs), mode]
    started = time.perf_counter()
    if SMOKE:
        out = exec_child(CHILD, args, work)
    else:
        command = [sys.executable, "-c", CHILD, *args]
        out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=work).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["process"] = time.perf_counter() - started
    return result


def run_here(work: Path, jobs: int, mode: str) -> dict[str, Any]:
    """One build in this process: its worker pool, once started, serves the next builds
    (it idles 60 s), as in ``h5etl build configs/`` or a long-lived service."""
    import h5etl

    spec = h5etl.load_spec(work / "bench.yaml")
    if mode == "copy":
        spec = spec.model_copy(update={"notes": "the same samples again"})
    begun = time.perf_counter()
    report = h5etl.build(spec, jobs=jobs, full=mode == "full")
    took = time.perf_counter() - begun
    return {
        "build": took,
        "process": took,
        "reused": report.reused,
        "samples": sum(report.samples.values()),
        "version": report.version,
        "up_to_date": report.up_to_date,
    }


Runner = Callable[[Path, int, str], dict[str, Any]]


def repeat(
    work: Path, extra: list[tuple[Path, Path]], jobs: int, runner: Runner = run
) -> dict[str, dict[str, Any]]:
    shutil.rmtree(work / "releases", ignore_errors=True)
    for _, target in extra:
        target.unlink(missing_ok=True)
    runs = {"full": runner(work, jobs, "full"), "unchanged": runner(work, jobs, "incremental")}
    runs["copy"] = runner(work, jobs, "copy")
    for source, target in extra:
        _link(source, target)
    runs["add 5%"] = runner(work, jobs, "incremental")
    runs["full 5%"] = runner(work, jobs, "full")
    return runs


def table(results: list[dict[str, dict[str, Any]]]) -> str:
    def median(step: str, key: str) -> float:
        return float(statistics.median(r[step][key] for r in results))

    lines = [
        f"{len(results)} repeats, medians; build = the build() call, process = the whole child",
        "",
        "| build | release | samples | carried | build s | process s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for step in STEPS:
        last = results[-1][step]
        release = f"v{last['version']:04d}" + (" (up to date)" if last.get("up_to_date") else "")
        lines.append(
            f"| {step} | {release} | {last['samples']:,} | {last['reused']:,} | "
            f"{median(step, 'build'):.2f} | {median(step, 'process'):.2f} |"
        )
    lines += [
        "",
        "| ratio (target) | build | process | build, each repeat | process, each repeat |",
        "|---|---:|---:|---|---|",
    ]
    for name, step, over, target in RATIOS:
        cells = []
        for key in ("build", "process"):
            each = [100 * r[step][key] / r[over][key] for r in results]
            cells.append((statistics.median(each), " ".join(f"{v:.1f}" for v in each)))
        lines.append(
            f"| {name} ({target}) | {cells[0][0]:.1f}% | {cells[1][0]:.1f}% | "
            f"{cells[0][1]} | {cells[1][1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=BASE)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every build in this process (warm worker pool; process = build)",
    )
    args = parser.parse_args(argv)
    byte_compile()
    work, extra = prepare(args.dir, args.samples)
    warm(work, *(source for source, _ in extra))
    runner = run_here if args.in_process else run
    if args.in_process:
        import h5etl.pipeline.run  # noqa: F401  (imported once, as a long-lived process has it)
    results = [repeat(work, extra, args.jobs, runner) for _ in range(args.repeats)]
    if args.in_process:
        print("in one process: the worker pool starts with the first build and serves the rest")
    print(table(results))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    main()
