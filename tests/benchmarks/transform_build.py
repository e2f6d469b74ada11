"""Transform build benchmark: a whole build with a trivial user transform against the same
build without one (issue 28), and what the transform itself costs (its work limit).

A corpus of RGB PNGs with masks (written once, seeded) is built by child processes,
interleaved (each contender once a round, ``--repeats`` rounds): ``h5etl build`` of the plain
config, and of the same config with ``transform: [{call: prep:invert}]`` on the image field
(an 8-bit invert beside the config). The table shows medians of wall and CPU seconds (user +
sys of the child and its workers) and the overhead per sample; the work limit is the
transform called directly on the decoded images in one process (what no build can beat).

    python tests/benchmarks/transform_build.py                   # 600 samples, 5 rounds
    python tests/benchmarks/transform_build.py --samples 200 --repeats 2 --jobs 1
    python tests/benchmarks/transform_build.py --corpus DIR    # against the honest limit

``--corpus DIR`` (a ``corpus.py`` corpus: real photos padded to 224, lzf): ``h5etl build`` of
its ``lzf.yaml`` with the image inverted by the user transform, against the honest work limit
(``honest_limit.py --invert``: the same decode, the same invert, pad, statistics, compression
and digests in a process that imports nothing of h5etl), interleaved: what issue 28 asks
(>= 0.9x); ``build.py --gap`` measures the pair without a transform.

``H5ETL_BENCH_SMOKE=1`` (no figure meant): 12 samples, 1 round, and the ``h5etl build`` runs of
this tree in this process (``installed.h5etl_here``: its imports paid once).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from installed import byte_compile, h5etl_here
from PIL import Image

MODULE = """import numpy as np

def invert(value):
    return np.subtract(255, value, dtype=value.dtype)
"""
SIDE = 128
SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"


def write_corpus(root: Path, samples: int, module: str = MODULE) -> None:
    """``samples`` seeded RGB PNGs of SIDE x SIDE with 0/255 masks under ``root/raw``, and the
    transforms ``module`` beside them as ``prep.py``."""
    rng = np.random.default_rng(0)
    (root / "raw/images").mkdir(parents=True)
    (root / "raw/masks").mkdir(parents=True)
    for i in range(samples):
        image = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
        mask = (rng.random((SIDE, SIDE)) > 0.5).astype(np.uint8) * 255
        Image.fromarray(image).save(root / f"raw/images/s{i:05d}.png", compress_level=1)
        Image.fromarray(mask).save(root / f"raw/masks/s{i:05d}.png", compress_level=1)
    (root / "prep.py").write_text(module)


def write_config(root: Path, name: str, transform: bool) -> Path:
    image: dict[str, object] = {"kind": "image", "shape": [3, SIDE, SIDE]}
    if transform:
        image["transform"] = [{"call": "prep:invert"}]
    config = {
        "name": name,
        "output": f"out-{name}",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "fields": {"image": image, "mask": {"kind": "mask", "shape": [1, SIDE, SIDE]}},
        "storage": {"chunk_samples": 16, "compression": "lzf"},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def timed(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[float, float, str]:
    """(wall, CPU seconds of the child and its workers, its output) of one run of ``command``;
    smoke runs: an ``h5etl`` command of this tree in this process (its CPU counted too)."""
    here = SMOKE and command[1:3] == ["-m", "h5etl"] and env in (None, os.environ)
    before = _cpu(here)
    started = time.perf_counter()
    if here:
        text = io.StringIO()
        with contextlib.chdir(cwd), contextlib.redirect_stdout(text):
            h5etl_here(command[3:])
        out = text.getvalue()
    else:
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=cwd, env=env)
        out = done.stdout
    return time.perf_counter() - started, _cpu(here) - before, out


def _cpu(here: bool) -> float:
    """CPU seconds of the reaped children, and of this process if ``here``."""
    whose = (
        (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF) if here else (resource.RUSAGE_CHILDREN,)
    )
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, whose))


def timed_build(
    root: Path, config: Path, jobs: int, tree: str | None = None
) -> tuple[float, float]:
    """(wall, CPU seconds of the child and its workers) of one full build; ``tree``: the
    source tree it runs (PYTHONPATH), else this process's."""
    env = dict(os.environ) if tree is None else {**os.environ, "PYTHONPATH": tree}
    shutil.rmtree(root / f"out-{config.stem}", ignore_errors=True)
    command = [sys.executable, "-m", "h5etl", "build", str(config), "-j", str(jobs), "-q"]
    wall, cpu, _ = timed(command, root, env)
    return wall, cpu


def work_limit(root: Path) -> float:
    """Seconds per sample of the transform alone, called on decoded images here."""
    images = [np.asarray(Image.open(p)) for p in sorted((root / "raw/images").glob("*.png"))]
    started = time.perf_counter()
    for image in images:
        np.subtract(255, image, dtype=image.dtype)
    return (time.perf_counter() - started) / len(images)


def honest_rounds(corpus: Path, repeats: int, jobs: int) -> None:
    """Print the build with the invert transform against the honest limit doing the same."""
    spec = yaml.safe_load((corpus / "lzf.yaml").read_text())
    spec["fields"]["image"]["transform"] = [{"call": "prep:invert"}]
    spec["output"] = "releases/lzf-invert"
    (corpus / "prep.py").write_text(MODULE)
    inverted = corpus / "lzf-invert.yaml"
    inverted.write_text(yaml.safe_dump(spec, sort_keys=False))
    honest = [sys.executable, str(Path(__file__).with_name("honest_limit.py"))]
    honest += ["--corpus", str(corpus), "--codec", "lzf", "--jobs", str(jobs)]
    build = [sys.executable, "-m", "h5etl", "build", "-j", str(jobs), "-q", "--full"]
    contenders = {
        "h5etl build, image inverted (user transform)": [*build, str(inverted)],
        "honest limit, image inverted": [*honest, "--invert"],
    }
    walls: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, command in contenders.items():
            # a first build each time, as the limit's: the releases of the rounds before
            # would be its parent (read for the change label and the loss guards)
            shutil.rmtree(corpus / spec["output"], ignore_errors=True)
            walls[name].append(timed(command, corpus)[0])
    samples = len(list((corpus / "images").glob("*.png")))
    median = {name: statistics.median(found) for name, found in walls.items()}
    print(f"{corpus.name}: {samples} pairs, lzf, -j {jobs}, {repeats} rounds (medians)\n")
    print("| contender | wall s | samples/s |")
    print("|---|---:|---:|")
    for name, wall in median.items():
        print(f"| {name} | {wall:.2f} | {samples / wall:.0f} |")
    ratio = median["honest limit, image inverted"] / median[next(iter(median))]
    print(f"\nh5etl / honest limit, image inverted: **{ratio:.3f}x** (target >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--old-tree", help="another source tree (main's): its build without a transform too"
    )
    parser.add_argument("--corpus", type=Path, help="a corpus.py corpus: against the honest limit")
    args = parser.parse_args()
    if os.environ.get("H5ETL_BENCH_SMOKE"):
        args.samples, args.repeats = 12, 1
    if args.corpus:
        honest_rounds(args.corpus, args.repeats, args.jobs)
        return
    # every tree's modules compiled first: under PYTHONDONTWRITEBYTECODE a tree without .pyc
    # files compiles its sources in every build (0.3 CPU-s, not what is measured here)
    byte_compile([args.old_tree] if args.old_tree else [])
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_corpus(root, args.samples)
        plain = write_config(root, "plain", False)
        configs: dict[str, tuple[Path, str | None]] = {
            "without a transform": (plain, None),
            "with prep:invert": (write_config(root, "invert", True), None),
        }
        if args.old_tree:
            configs["old tree, without a transform"] = (plain, args.old_tree)
        found: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, (config, tree) in configs.items():  # interleaved: each once a round
                found[name].append(timed_build(root, config, args.jobs, tree))
        limit = work_limit(root)
    print(f"{args.samples} samples of {SIDE}x{SIDE} RGB + mask, -j {args.jobs},")
    print(f"{args.repeats} rounds (medians); the transform alone: {limit * 1e6:.1f} µs/sample\n")
    print("| contender | wall s | CPU s | samples/s | CPU µs per sample |")
    print("|---|---:|---:|---:|---:|")
    medians = {}
    for name, runs in found.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        medians[name] = (wall, cpu)
        rate = args.samples / wall
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {rate:.0f} | {cpu / args.samples * 1e6:.0f} |")
    (wall0, cpu0), (wall1, cpu1) = medians["without a transform"], medians["with prep:invert"]
    per_sample = (cpu1 - cpu0) / args.samples * 1e6
    print(
        f"\noverhead of the transform: {per_sample:+.0f} CPU µs per sample "
        f"(the function alone: {limit * 1e6:.0f} µs); throughput {wall0 / wall1:.3f}x"
    )
    if args.old_tree:
        old_wall, old_cpu = medians["old tree, without a transform"]
        print(
            f"this tree against the old one, no transform: wall {wall0 / old_wall:.3f}x, "
            f"CPU {cpu0 / old_cpu:.3f}x"
        )


if __name__ == "__main__":
    main()
