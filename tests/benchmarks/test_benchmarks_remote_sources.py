"""remote_sources.py runs end to end on a tiny corpus (a moto server of its own), so it cannot
rot; no timings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent


def test_the_remote_sources_bench_prints_its_table(tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="needs moto's server: pip install 'moto[server]'")
    pytest.importorskip("s3fs", reason="needs the cloud extra: pip install 'h5etl[cloud]'")
    args = ["--dir", str(tmp_path), "--samples", "12", "--repeats", "1", "--jobs", "1"]
    pinned = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2
    args += ["--pin"] if pinned else []  # the server on a core of its own, the builds not
    done = subprocess.run(
        [sys.executable, str(BENCH / "remote_sources.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows = [
        line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")
    ]
    assert rows[:3] == ["sources", "local", "s3"], done.stdout
    assert rows[3:] in ([], ["s3, s3fs GETs"]), done.stdout  # the latter with obstore
    assert "s3 / local images/s:" in done.stdout
    assert ("server on core" in done.stdout) == pinned
