"""processes.pid_alive: a process that has ended is not alive, a zombie included."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5etl.processes import pid_alive


def test_this_process_is_alive() -> None:
    assert pid_alive(os.getpid())


def test_a_reaped_process_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_an_unreaped_process_that_ended_is_not() -> None:
    # a killed CLI under subprocess.run(capture_output=True) stays a zombie while its
    # workers hold the output pipes; its workers must see it as gone
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # not waited for: it ends as a zombie
        assert not pid_alive(child.pid)
        assert Path(f"/proc/{child.pid}").exists()  # still in the process table
    finally:
        child.wait()
