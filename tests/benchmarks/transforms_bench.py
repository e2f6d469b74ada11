"""Transforms benchmark: what running a transform through ``h5etl.transforms`` costs per
sample, against calling the same function directly (the work limit of a transform).

A trivial numpy transform (an 8-bit invert) on 256 x 256 RGB images, in this process: the
chain is resolved once, then every sample goes through ``apply_transforms`` (function lookup,
arguments, the output check against the field's expectation) or straight into the function.
Interleaved repeats; the table shows medians of microseconds per sample and the ratio.

    python tests/benchmarks/transforms_bench.py                # 2000 samples, 5 repeats
    python tests/benchmarks/transforms_bench.py --samples 200 --repeats 1

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): 20 samples, 1 repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from h5etl.transforms.apply import Expectation, FieldChain, Transforms, apply_transforms
from h5etl.transforms.loading import Loader, function_of

MODULE = """import numpy as np

def invert(value):
    return np.subtract(255, value, dtype=value.dtype)
"""
SHAPE = (256, 256, 3)


def _contenders(folder: Path) -> dict[str, Callable[[str, np.ndarray], object]]:
    (folder / "prep.py").write_text(MODULE)
    spec = Loader(folder).resolve("prep:invert")
    transforms = Transforms(
        0,
        chains=(FieldChain("image", (spec,)),),
        expect=(("image", Expectation(dtype="uint8", max_shape=SHAPE)),),
    )
    invert = function_of(spec)
    return {
        "work limit: the function called directly": lambda key, value: invert(value),
        "apply_transforms (chain of 1, output checked)": lambda key, value: apply_transforms(
            transforms, key, {"image": value}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if os.environ.get("H5ETL_BENCH_SMOKE"):
        args.samples, args.repeats = 20, 1
    images = np.random.default_rng(0).integers(0, 256, (16, *SHAPE), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as folder:
        contenders = _contenders(Path(folder))
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeats):
            for name, run in contenders.items():  # interleaved: each contender once a round
                started = time.perf_counter()
                for i in range(args.samples):
                    run(f"s{i}", images[i % len(images)])
                times[name].append((time.perf_counter() - started) / args.samples * 1e6)
    limit = statistics.median(next(iter(times.values())))
    print(f"{args.samples} samples of {SHAPE} uint8, {args.repeats} repeats (medians)\n")
    print("| contender | µs per sample | throughput vs work limit |")
    print("|---|---:|---:|")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"| {name} | {median:.1f} | {limit / median:.3f}x |")


if __name__ == "__main__":
    main()
