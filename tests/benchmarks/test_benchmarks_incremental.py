"""The incremental benchmark runs end to end on a tiny corpus, so it cannot rot; no timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent  # the scripts beside these tests
SMOKE_ENV = {**os.environ, "H5ETL_BENCH_SMOKE": "1"}  # no figure meant: every build in-process


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One corpus for both tests (it is cached; each run links its own work folder)."""
    return tmp_path_factory.mktemp("incremental")


def test_incremental_bench_prints_every_build_and_both_ratios(bench_dir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "incremental.py"),
            "--dir",
            str(bench_dir),
            "--samples",
            "20",
            "--repeats",
            "1",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=SMOKE_ENV,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert rows["full"].split(" | ")[1:4] == ["v0001", "20", "0"]
    assert rows["unchanged"].split(" | ")[1:4] == ["v0001 (up to date)", "20", "0"]
    assert rows["copy"].split(" | ")[1:4] == ["v0002", "20", "20"]  # every sample carried
    assert rows["add 5%"].split(" | ")[1:3] == ["v0003", "22"]
    assert rows["full 5%"].split(" | ")[1:4] == ["v0004", "22", "0"]
    assert any(line.startswith("| unchanged / full (<= 10%)") for line in lines)
    assert any(line.startswith("| copy / full (none)") for line in lines)
    assert any(line.startswith("| add 5% / full 5% (<= 15%)") for line in lines)


TINY = ("--samples", "20", "--repeats", "1", "--jobs", "1", "--in-process")


def test_the_in_process_variant_prints_the_same_rows(bench_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "incremental.py"), "--dir", str(bench_dir), *TINY],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("in one process: ")
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")
        for line in done.stdout.splitlines()
        if line.startswith("| ")
    }
    assert rows["unchanged"][1:4] == ["v0001 (up to date)", "20", "0"]
    assert rows["copy"][1:4] == ["v0002", "20", "20"]
    assert rows["add 5%"][1:3] == ["v0003", "22"]
