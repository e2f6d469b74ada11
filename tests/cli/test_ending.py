"""The ``h5etl`` command ends without the interpreter's teardown only where that loses nothing
(``h5etl.cli.ending``): it succeeded, no thread is left to join, no HDF5 file is open."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import pytest
from conftest import MakeRaw, WriteConfig

from h5etl.cli import ending

# the console script, as ``h5etl`` runs it, after ``prelude`` (a process that has done
# something of its own first); ``ENDED`` tells how it ended
SCRIPT = """
import atexit, sys
import h5etl.cli.ending as ending
exit_now = ending.exit_now
def told(code):
    print("fast" if code in (0, None) and ending._nothing_to_lose() else "usual", file=sys.stderr)
    exit_now(code)
ending.exit_now = told
atexit.register(lambda: print("exit handler ran", flush=True))
{prelude}
sys.argv = ["h5etl", *{args!r}]
from h5etl.cli import main
main()
"""


def _run(args: list[str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(prelude=prelude, args=args)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_build_that_succeeds_ends_at_once_with_its_output_and_exit_handlers(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    done = _run(["build", str(config), "-j", "2"])
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "fast"
    assert "release:" in done.stdout + done.stderr  # the summary, flushed before the end
    assert done.stdout.rstrip().endswith("exit handler ran")
    release = next((tmp_path / "releases").glob("*-v0001.h5"))
    with h5py.File(release, "r") as handle:  # published whole
        assert handle["train/image"].shape[0] + handle["valid/image"].shape[0] == 6


def test_an_open_hdf5_file_ends_the_usual_way_and_is_flushed(tmp_path: Path) -> None:
    path = tmp_path / "open.h5"
    prelude = f"import h5py\nheld = h5py.File({str(path)!r}, 'w')\nheld['x'] = [1, 2, 3]"
    done = _run(["--version"], prelude)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "usual"
    assert "exit handler ran" in done.stdout
    with h5py.File(path, "r") as handle:  # HDF5's own close flushed it at the exit
        assert list(handle["x"][...]) == [1, 2, 3]


def test_a_dataset_whose_file_handle_is_gone_ends_the_usual_way(tmp_path: Path) -> None:
    # HDF5's weak close: the file stays open (unflushed) while a dataset of it is
    path = tmp_path / "open.h5"
    prelude = (
        f"import h5py\nf = h5py.File({str(path)!r}, 'w')\n"
        "held = f.create_dataset('x', data=[1, 2, 3])\ndel f"
    )
    done = _run(["--version"], prelude)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "usual"
    with h5py.File(path, "r") as handle:
        assert list(handle["x"][...]) == [1, 2, 3]


def test_a_command_whose_stdout_was_closed_still_succeeds() -> None:
    code = SCRIPT.format(prelude="", args=["--version"])
    done = subprocess.run(  # fd 1 closed before the interpreter starts: sys.stdout is None
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "fast"


def test_a_failed_command_ends_the_usual_way(tmp_path: Path) -> None:
    done = _run(["build", str(tmp_path / "missing.yaml")])
    assert done.returncode == 2
    assert "missing.yaml" in done.stderr
    assert "fast" not in done.stderr.splitlines()
    assert "exit handler ran" in done.stdout


def test_a_thread_left_to_join_or_a_file_open_is_something_to_lose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = threading.enumerate
    own: list[threading.Thread] = []  # this process's other threads (the test runner's) aside
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread(), *own])
    assert ending._nothing_to_lose()
    release = threading.Event()
    own.append(threading.Thread(target=release.wait))
    own[0].start()
    try:
        assert own[0] in running()
        assert not ending._nothing_to_lose()
    finally:
        release.set()
        own[0].join()
    assert ending._nothing_to_lose()  # ended
    waiting = threading.Event()
    own.append(threading.Thread(target=waiting.wait, daemon=True))  # dropped at exit anyway
    own[1].start()
    try:
        assert own[1].is_alive()
        assert ending._nothing_to_lose()
    finally:
        waiting.set()
        own[1].join()
    with h5py.File(tmp_path / "f.h5", "w"):
        assert not ending._nothing_to_lose()
    assert ending._nothing_to_lose()


@pytest.mark.parametrize("code", [1, 2, "an error"])
def test_exit_now_returns_for_a_failure(code: object) -> None:
    ending.exit_now(code)  # returned: this process goes on
