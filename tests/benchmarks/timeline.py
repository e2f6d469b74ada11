"""Timeline of ``h5etl build``: when each step happens, from process start to exit.

    python tests/benchmarks/timeline.py                       # 3,000 pairs, lzf and blosc-lz4
    python tests/benchmarks/timeline.py --repeats 5 --codec lzf --variant old=/path/to/tree

Runs the CLI with ``H5ETL_TIMELINE`` set (``h5etl.timeline``): every process of the build (the
CLI and its workers) notes its steps on one clock, and this script notes the launch and the
exit. Prints, per codec, the median time of each step after the launch: the parent's steps,
then each worker's (spawned, imports done, first task), and the build's own stage seconds
(``build.json``). A ``--variant`` tree runs interleaved (its launch-to-exit wall at least; a
tree without the marks shows nothing else). Never a timed assertion: a table to read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corpus import DEFAULT_DIR, DEFAULT_SAMPLES, CorpusParams, ensure_corpus
from installed import byte_compile, warm

from h5etl import timeline

LAUNCH, EXIT = "launch (this script)", "exit (this script saw it)"
WORKER = "worker {}: {}"
TASK_SENT = "worker: task sent"


@dataclass
class Run:
    """One build's events: seconds after the launch, by name (the first of each)."""

    parent: dict[str, float] = field(default_factory=dict)
    workers: list[dict[str, float]] = field(default_factory=list)
    results: int = 0
    cpu: float = 0.0  # CPU seconds of the build's processes (those it waited for)
    seconds: dict[str, float] = field(default_factory=dict)  # build.json's stage seconds


def _parse(text: str, launched: float, parent: int) -> Run:
    run = Run()
    by_worker: dict[int, dict[str, float]] = defaultdict(dict)
    for line in text.splitlines():
        stamp, pid, event = line.split(" ", 2)
        at = float(stamp) - launched
        if event == "result":
            run.results += 1
            run.parent.setdefault("first result", at)
            run.parent["last result"] = at
            continue
        events = run.parent if int(pid) == parent else by_worker[int(pid)]
        if event == TASK_SENT:  # a worker's first and last
            events.setdefault(f"first {event}", at)
            events[f"last {event}"] = at
            continue
        events.setdefault(event, at)
    run.workers = [by_worker[pid] for pid in sorted(by_worker)]
    return run


def build_once(config: Path, jobs: int, scratch: Path, pythonpath: str | None) -> Run:
    """``h5etl build config -j jobs --quiet`` into a fresh output folder, on the timeline."""
    out = scratch / "releases"
    shutil.rmtree(out, ignore_errors=True)
    events = scratch / "timeline.txt"
    events.unlink(missing_ok=True)
    env = {**os.environ, timeline.ENV: str(events)}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = ["h5etl", "build", str(config), "--jobs", str(jobs), "--quiet"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = timeline.now()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    code = proc.wait()
    ended = timeline.now()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {code}")
    run = _parse(events.read_text() if events.exists() else "", launched, proc.pid)
    run.parent[LAUNCH], run.parent[EXIT] = 0.0, ended - launched
    run.cpu = sum(getattr(after, f) - getattr(before, f) for f in ("ru_utime", "ru_stime"))
    facts = sorted(out.rglob("*.build.json"))
    if facts:
        run.seconds = json.loads(facts[-1].read_text("utf-8"))["seconds"]
    return run


def scratch_config(corpus_root: Path, codec: str, scratch: Path) -> Path:
    """The corpus's config of ``codec`` with absolute inputs and its output in ``scratch``:
    the corpus's own release folders stay the build benchmark's."""
    text = (corpus_root / f"{codec}.yaml").read_text("utf-8")
    for folder in ("images", "masks"):
        text = text.replace(f"dir: {folder}", f"dir: {corpus_root / folder}")
    text = text.replace(f"output: releases/{codec}", f"output: {scratch / 'releases'}")
    path = scratch / f"{codec}.yaml"
    path.write_text(text, "utf-8")
    return path


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f}" if values else "-"


def table(name: str, runs: list[Run]) -> str:
    """Median seconds after the launch of each step, in the order they happen."""
    rows: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for event, at in run.parent.items():
            rows[event].append(at)
        for index, events in enumerate(sorted(run.workers, key=lambda w: min(w.values()))):
            for event, at in events.items():
                rows[WORKER.format(index + 1, event)].append(at)
    order = sorted(rows, key=lambda event: statistics.median(rows[event]))
    results = statistics.median(run.results for run in runs)
    cpu = _median([run.cpu for run in runs])
    lines = [
        f"### {name}: {len(runs)} builds, {results:.0f} results each, {cpu} CPU-s",
        "",
        "| step | seconds after launch (median) | per build |",
        "|---|---:|---|",
    ]
    for event in order:
        each = " ".join(f"{v:.3f}" for v in rows[event])
        lines.append(f"| {event} | {_median(rows[event])} | {each} |")
    stages: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for stage, seconds in run.seconds.items():
            stages[stage].append(float(seconds))
    if stages:
        shown = ", ".join(f"{stage} {_median(values)}" for stage, values in stages.items())
        lines += ["", f"build.json seconds (medians): {shown}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the corpus is")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--codec", action="append", help="lzf, blosc-lz4, ... (default: both)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="also run the h5etl found on PYTHONPATH, interleaved; repeatable",
    )
    args = parser.parse_args(argv)
    codecs = args.codec or ["lzf", "blosc-lz4"]
    variants = [(None, None), *(tuple(v.split("=", 1)) for v in args.variant)]
    byte_compile(tree for _, tree in variants if tree)
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))
    warm(corpus.root)
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    runs: dict[str, list[Run]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="h5etl-timeline-") as tmp:
        scratch = Path(tmp)
        for _ in range(args.repeats):
            for codec in codecs:
                config = scratch_config(corpus.root, codec, scratch)
                for tag, tree in variants:
                    name = f"h5etl build -j{args.jobs} ({codec})" + (f" [{tag}]" if tag else "")
                    run = build_once(config, args.jobs, scratch, tree)
                    runs[name].append(run)
                    wall = run.parent[EXIT]
                    print(f"  {name}: {wall:.2f} s, {run.cpu:.2f} CPU-s", file=sys.stderr)
    after = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"## Timeline, {corpus.root.name}; load average {load} before, {after} after\n")
    print("\n\n".join(table(name, items) for name, items in runs.items()))


if __name__ == "__main__":
    main()
