"""The transforms benchmarks run end to end, so they cannot rot; no timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent  # the scripts beside these tests
SMOKE = {**os.environ, "H5ETL_BENCH_SMOKE": "1"}


def _run(script: str, *args: str) -> str:
    """The stdout of a benchmark script's smoke run (it must succeed)."""
    command = [sys.executable, str(BENCH / script), *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=SMOKE).stdout


def _contenders(text: str) -> list[str]:
    """The first column of the printed table, below its header."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]]


def test_the_transforms_benchmark_prints_its_table() -> None:
    assert _contenders(_run("transforms_bench.py")) == [
        "work limit: the function called directly",
        "apply_transforms (chain of 1, output checked)",
    ]


def test_the_transform_build_benchmark_prints_its_table() -> None:
    text = _run("transform_build.py")
    assert _contenders(text) == ["without a transform", "with prep:invert"]
    assert "overhead of the transform" in text


def test_the_transform_redo_benchmark_prints_its_table() -> None:
    text = _run("transform_redo.py")
    assert _contenders(text) == [
        "incremental, the image's transform changed",
        "incremental, the mask's transform changed",
        "--full, the image's transform changed",
        "nothing changed (up to date: start-up and planning)",
    ]
    assert "made again for those samples (their transform changed): image" in text
    assert "made again for those samples (their transform changed): mask" in text


def test_the_transform_build_against_the_honest_limit_prints_its_ratio(tmp_path: Path) -> None:
    made = _run("corpus.py", "--dir", str(tmp_path), "--samples", "8", "-j", "1")  # no pool
    root = made.split("corpus: ", 1)[1].split()[0]  # "corpus: <folder> (...)"
    text = _run("transform_build.py", "--corpus", root)
    assert _contenders(text) == [
        "h5etl build, image inverted (user transform)",
        "honest limit, image inverted",
    ]
    assert "h5etl / honest limit, image inverted: **" in text
