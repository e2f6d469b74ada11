"""Resume benchmark: a build SIGKILLed at 25 %, 50 % and 75 % of its samples, then ``--resume``,
against a full build of the same corpus.

    python tests/benchmarks/resume.py [--samples 6000] [--repeats 3] [--jobs 2] [--dir DIR]
        [--variant NAME=PYTHONPATH ...]

The kill comes by progress, not by the clock: the killed build counts the samples its sink
stored (the progress hook) and SIGKILLs itself once it passes the share. Full builds and
kills alternate (interleaved repeats, the kills' order rotated each round), every build from
an empty output folder. Printed: per kill point, where the last checkpoint stood (samples the
resume copied, as a share of all), the copy's seconds, the resume's seconds, the ratio of the
medians to the median full build, and the median of each round's ratio (a resume against the
full build of its round: the load of a shared machine drifts less within a round). Every
build is a CLI process (``python -m h5etl build``).
``--variant NAME=PYTHONPATH`` (repeatable) measures other trees too, each round in turn
(``this`` is the tree the script runs from).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
from corpus import DEFAULT_DIR, CorpusParams, ensure_corpus

SHARES = (0.25, 0.5, 0.75)

# A build that SIGKILLs itself once its sink stored ``share`` of the samples it decodes.
KILLED = """
    import os, signal, sys
    import h5etl
    config, share, jobs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    seen, total = 0, None
    def hook(stage, advance, count):
        global seen, total
        if stage != "decode+write":
            return
        if count is not None:
            total = count
            return
        seen += advance
        if total and seen >= share * total:
            os.kill(os.getpid(), signal.SIGKILL)
    h5etl.build(h5etl.load_spec(config), jobs=jobs, progress=hook, full=True)
"""


@dataclass
class Point:
    """The runs of one kill share."""

    resume: list[float] = field(default_factory=list)  # seconds of the resumed build
    copied: list[float] = field(default_factory=list)  # share of samples the resume copied
    copy: list[float] = field(default_factory=list)  # seconds it spent copying them
    killed_at: list[float] = field(default_factory=list)  # seconds into the killed build
    ratios: list[float] = field(default_factory=list)  # resume / the same round's full build


def write_config(work: Path, corpus_root: Path) -> Path:
    """The corpus's lzf config, reading its folders and writing into ``work``."""
    text = (corpus_root / "lzf.yaml").read_text("utf-8")
    text = text.replace("dir: images", f"dir: {corpus_root / 'images'}")
    text = text.replace("dir: masks", f"dir: {corpus_root / 'masks'}")
    text = text.replace("output: releases/lzf", f"output: {work / 'releases'}")
    path = work / "resume-bench.yaml"
    path.write_text(text, "utf-8")
    return path


def build(config: Path, jobs: int, env: dict[str, str], *extra: str) -> float:
    command = [sys.executable, "-m", "h5etl", "build", str(config), "--jobs", str(jobs)]
    started = time.perf_counter()
    subprocess.run([*command, "--quiet", *extra], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def kill_at(config: Path, share: float, jobs: int, env: dict[str, str]) -> float:
    """Run a build that kills itself at ``share``; the seconds until it died."""
    started = time.perf_counter()
    script = textwrap.dedent(KILLED)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(config), str(share), str(jobs)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        code = proc.wait(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its workers
    if code != -signal.SIGKILL:
        raise SystemExit(f"the build to kill at {share:.0%} ended with {code} instead")
    return time.perf_counter() - started


def resumed(releases: Path) -> tuple[float, float]:
    """The share of the samples the resumed build copied, and the seconds it took."""
    (path,) = releases.glob("*.build.json")
    facts = json.loads(path.read_text("utf-8"))
    with h5py.File(path.with_suffix("").with_suffix(".h5"), "r") as release:
        diagnostics = release["diagnostics"].attrs
        total = sum(int(v) for k, v in diagnostics.items() if k.startswith("samples_"))
    return facts["resumed_samples"] / total, float(facts["seconds"].get("resume_copy", 0.0))


def measure(config: Path, jobs: int, env: dict[str, str], shares: tuple[float, ...]) -> float:
    """One round of one tree: a full build, then a kill and a resume at each share."""
    releases = config.parent / "releases"
    shutil.rmtree(releases, ignore_errors=True)
    full = build(config, jobs, env, "--full")
    for share in shares:
        shutil.rmtree(releases, ignore_errors=True)
        point = POINTS[env["PYTHONPATH"]][share]
        point.killed_at.append(kill_at(config, share, jobs, env))
        point.resume.append(build(config, jobs, env, "--resume"))
        point.ratios.append(point.resume[-1] / full)
        copied, seconds = resumed(releases)
        point.copied.append(copied)
        point.copy.append(seconds)
    return full


POINTS: dict[str, dict[float, Point]] = {}


def report(name: str, fulls: list[float], points: dict[float, Point]) -> None:
    full = statistics.median(fulls)
    print(f"\n{name}: full build median {full:.2f} s ({', '.join(f'{s:.2f}' for s in fulls)})")
    print(
        "| killed at | killed after s | last checkpoint | copy s | resume s | resume / full "
        "| per round (median) |"
    )
    print("|---|---|---|---|---|---|---|")
    for share, point in points.items():
        resume = statistics.median(point.resume)
        print(
            f"| {share:.0%} | {statistics.median(point.killed_at):.2f} "
            f"| {statistics.median(point.copied):.0%} | {statistics.median(point.copy):.2f} "
            f"| {resume:.2f} | {resume / full:.2f}x | {statistics.median(point.ratios):.2f}x "
            f"({', '.join(f'{r:.2f}' for r in point.ratios)}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="corpus cache folder")
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH")
    args = parser.parse_args()
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples), jobs=args.jobs)
    this = str(Path(__file__).resolve().parents[2])
    trees = {"this": this} | dict(v.partition("=")[::2] for v in args.variant)
    configs = {}
    for name, path in trees.items():
        work = args.dir / f"resume-n{args.samples}-{name}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        configs[name] = write_config(work, corpus.root)
        POINTS[path] = {share: Point() for share in SHARES}
    fulls: dict[str, list[float]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        shares = SHARES[repeat % len(SHARES) :] + SHARES[: repeat % len(SHARES)]
        for name, path in trees.items():
            env = {**os.environ, "PYTHONPATH": path}
            fulls[name].append(measure(configs[name], args.jobs, env, shares))
            print(f"round {repeat + 1} {name}: full {fulls[name][-1]:.2f} s", file=sys.stderr)
    print(f"\n{args.samples} pairs, --jobs {args.jobs}, {args.repeats} rounds, interleaved")
    for name, path in trees.items():
        report(name, fulls[name], POINTS[path])


if __name__ == "__main__":
    main()
