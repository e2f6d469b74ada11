"""Transform redo benchmark: an incremental build after one field's transform changed,
against a ``--full`` build of the same config (issue 28 item 5).

A corpus of RGB PNGs with masks (written once, seeded) is built once as the parent, with a
transform on each field beside the config: ``prep:blur`` on the image (a 3x3 box blur in
numpy, ``PASSES`` times: the expensive one) and ``prep:flip`` on the mask. Then, from a copy
of that parent each time, child processes build, interleaved (each contender once a round,
``--repeats`` rounds): the image's ``blur`` with other arguments incrementally (the image
made again, the mask copied), the mask's ``flip`` with other arguments incrementally (the
mask made again, the image copied), the image's change with ``--full`` (every sample
decoded), and the parent's own config (nothing changed: start-up and planning). The table
shows medians of wall and CPU seconds (user + sys of the child and its workers) and, per
sample, what each costs over the build that finds nothing changed.

    python tests/benchmarks/transform_redo.py                  # 600 samples, 3 rounds
    python tests/benchmarks/transform_redo.py --samples 200 --repeats 1 --jobs 1

``H5ETL_BENCH_SMOKE=1`` (no figure meant): 12 samples, 1 round, each build in this process
(``transform_build.timed``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from transform_build import SIDE, timed, write_corpus

MODULE = """import numpy as np


def blur(value, *, passes):
    out = value.astype(np.float32)
    for _ in range(passes):
        padded = np.pad(out, ((1, 1), (1, 1), (0, 0)), mode="edge")
        out = sum(
            padded[i : i + out.shape[0], j : j + out.shape[1]] for i in range(3) for j in range(3)
        ) / 9
    return out.round().astype(np.uint8)


def flip(value, *, times):
    return value[::-1] if times % 2 else value
"""
PASSES = 4  # of the blur in the parent: the image's transform costs about its decode


def write_config(root: Path, passes: int, times: int) -> Path:
    config = {
        "name": "redo",
        "output": "out",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "fields": {
            "image": {
                "kind": "image",
                "shape": [3, SIDE, SIDE],
                "transform": [{"call": "prep:blur", "args": {"passes": passes}}],
            },
            "mask": {
                "kind": "mask",
                "shape": [1, SIDE, SIDE],
                "transform": [{"call": "prep:flip", "args": {"times": times}}],
            },
        },
        "storage": {"chunk_samples": 16, "compression": "lzf"},
    }
    path = root / "redo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build(root: Path, jobs: int, *extra: str) -> tuple[float, float, str]:
    """(wall, CPU seconds of the child and its workers, its output) of one build."""
    command = [sys.executable, "-m", "h5etl", "build", "redo.yaml", "-j", str(jobs), *extra]
    return timed(command, root)


CONTENDERS = {
    "incremental, the image's transform changed": ((PASSES + 1, 0), ()),
    "incremental, the mask's transform changed": ((PASSES, 1), ()),
    "--full, the image's transform changed": ((PASSES + 1, 0), ("--full",)),
    "nothing changed (up to date: start-up and planning)": ((PASSES, 0), ()),
}
FLOOR = "nothing changed (up to date: start-up and planning)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get("H5ETL_BENCH_SMOKE"):
        args.samples, args.repeats = 12, 1
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    said: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_corpus(root, args.samples, MODULE)
        write_config(root, PASSES, 0)
        build(root, args.jobs, "-q")
        shutil.copytree(root / "out", root / "parent", symlinks=True)
        for _ in range(args.repeats):
            for name, ((passes, times), extra) in CONTENDERS.items():
                shutil.rmtree(root / "out")
                shutil.copytree(root / "parent", root / "out", symlinks=True)
                write_config(root, passes, times)
                wall, cpu, out = build(root, args.jobs, *extra)
                found[name].append((wall, cpu))
                said[name] = next((ln for ln in out.splitlines() if "made again" in ln), "")
    print(f"{args.samples} samples of {SIDE}x{SIDE} RGB + mask, -j {args.jobs},")
    print(f"{args.repeats} rounds (medians), each from a copy of the same parent\n")
    print("| contender | wall s | CPU s | wall ms per sample | CPU ms per sample |")
    print("|---|---:|---:|---:|---:|")
    medians = {}
    for name, runs in found.items():
        medians[name] = (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
        )
    floor_wall, floor_cpu = medians[FLOOR]
    per = 1e3 / args.samples
    for name, (wall, cpu) in medians.items():
        if name == FLOOR:  # the others per sample over it: what the samples cost
            print(f"| {name} | {wall:.2f} | {cpu:.2f} | | |")
            continue
        over = f"{(wall - floor_wall) * per:.2f} | {(cpu - floor_cpu) * per:.2f}"
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {over} |")
    print("\n(per sample: over the up-to-date build, which starts, plans and stops)")
    full_wall, full_cpu = medians["--full, the image's transform changed"]
    for name in list(CONTENDERS)[:2]:
        wall, cpu = medians[name]
        ratio_wall = (full_wall - floor_wall) / max(wall - floor_wall, 1e-9)
        ratio_cpu = (full_cpu - floor_cpu) / max(cpu - floor_cpu, 1e-9)
        print(f"\n{name}: per sample {ratio_wall:.2f}x less wall, {ratio_cpu:.2f}x less CPU")
        print(f"  the build said: {said[name].strip() or '(nothing made again)'}")


if __name__ == "__main__":
    main()
