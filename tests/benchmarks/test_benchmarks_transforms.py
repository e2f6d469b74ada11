"""The transforms benchmark runs end to end, so it cannot rot; no timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "transforms_bench.py"


def test_the_transforms_benchmark_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "H5ETL_BENCH_SMOKE": "1"},
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == [
        "work limit: the function called directly",
        "apply_transforms (chain of 1, output checked)",
    ]


def test_the_transform_build_benchmark_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("transform_build.py"))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "H5ETL_BENCH_SMOKE": "1"},
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == [
        "without a transform",
        "with prep:invert",
    ]
    assert "overhead of the transform" in done.stdout


def test_the_transform_redo_benchmark_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("transform_redo.py"))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "H5ETL_BENCH_SMOKE": "1"},
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == [
        "incremental, the image's transform changed",
        "incremental, the mask's transform changed",
        "--full, the image's transform changed",
        "nothing changed (up to date: start-up and planning)",
    ]
    assert "made again for those samples (their transform changed): image" in done.stdout
    assert "made again for those samples (their transform changed): mask" in done.stdout


def test_the_transform_build_against_the_honest_limit_prints_its_ratio(tmp_path: Path) -> None:
    env = {**os.environ, "H5ETL_BENCH_SMOKE": "1"}
    corpus = [sys.executable, str(SCRIPT.with_name("corpus.py")), "--dir", str(tmp_path)]
    made = subprocess.run(
        [*corpus, "--samples", "8"], capture_output=True, text=True, check=True, env=env
    )
    root = Path(made.stdout.split("corpus: ", 1)[1].split()[0])  # "corpus: <folder> (...)"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("transform_build.py")), "--corpus", str(root)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == [
        "h5etl build, image inverted (user transform)",
        "honest limit, image inverted",
    ]
    assert "h5etl / honest limit, image inverted: **" in done.stdout
