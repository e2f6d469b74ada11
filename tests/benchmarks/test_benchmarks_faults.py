"""faults.py (the fault report) runs end to end: it had not run since the tests moved into
folders (its import of the reliability tests' scripts failed), and three of its modes had
rotted (a hand-written lock judged stale, a write error in a build that was up to date, a
resume cut otherwise than the killed build)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent


def test_the_fault_report_shows_every_failure_leaving_the_release_alone(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "faults.py"), "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {
        cells[1].strip(): [cell.strip() for cell in cells[2:-1]]
        for cells in (line.split("|") for line in done.stdout.splitlines()[2:])
        if len(cells) > 5
    }
    outcomes = {name: row[0] for name, row in rows.items()}
    assert outcomes["SIGKILL while workers decode"] == "exit -9"
    assert outcomes["SIGKILL inside the sink"] == "exit -9"
    assert outcomes["SIGINT (Ctrl-C)"] == "exit 130: h5etl: interrupted; nothing was published"
    assert outcomes["second build while locked"].startswith("refused: ")
    assert "no space left on device" in outcomes["write error (ENOSPC)"]
    assert outcomes["max_rejects exceeded"].startswith("failed: ")
    assert outcomes["SIGKILL, then --resume"].startswith("killed (exit -9), resumed: ")
    assert not outcomes["SIGKILL, then --resume"].startswith("killed (exit -9), resumed: 0 ")
    for name, (_, link, shas, _files) in rows.items():
        before, after = shas.split(" / ")
        assert before == after, name  # the previous release untouched, whatever happened
        expected = "cells-v0002.h5" if name == "SIGKILL, then --resume" else "cells-v0001.h5"
        assert link == expected, name
