"""The build's timeline (``H5ETL_TIMELINE``): every process of a real build notes its steps."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig

from h5etl import timeline

PARENT_STEPS = [
    "fork server starting",  # before the command line's imports (h5etl.cli.early)
    "cli: command parsed (the CLI's imports done)",
    "config loaded",
    "pipeline imported",
    "planned",
    "sink created",
    "first task submitted",
    "last result written",
    "sink finished",
    "published",
    "status written",
    "cli: summary printed",
]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_build_notes_each_step_of_the_cli_and_of_its_workers(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    marks = tmp_path / "timeline.txt"
    launched = timeline.now()
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config), "-j", "2", "--quiet"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, timeline.ENV: str(marks)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for line in marks.read_text().splitlines():
        stamp, pid, event = line.split(" ", 2)
        steps[int(pid)].append((float(stamp), event))
    # each process's first line is its start, on the clock this process reads too
    for noted in steps.values():
        assert noted[0][1] == timeline.START
        assert launched - 1 < noted[0][0] <= noted[1][0]
    by_event = {event: at for noted in steps.values() for at, event in noted}
    parent = next(pid for pid, noted in steps.items() if noted[1][1] == PARENT_STEPS[0])
    in_parent = [event for _, event in steps[parent]]
    # all, in this order; but the first task goes out beside the sink's creation (a thread
    # submits the first tasks while the sink is made): either may come first
    ordered = [step for step in PARENT_STEPS if step != "first task submitted"]
    assert [e for e in in_parent if e in ordered] == ordered
    assert in_parent.count("first task submitted") == 1
    first_task = in_parent.index("first task submitted")
    assert in_parent.index("planned") < first_task < in_parent.index("last result written")
    assert by_event["cli: summary printed"] < timeline.now()
    workers = [noted for pid, noted in steps.items() if pid != parent]
    assert workers  # -j2: the tasks ran in other processes, which noted them
    assert all(
        any(e == "worker: first task started" for _, e in noted)
        for noted in workers
        if any(e == "worker: task sent" for _, e in noted)
    )


def test_without_the_variable_nothing_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(timeline.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    timeline.mark("nothing")
    assert list(tmp_path.iterdir()) == []
