"""The workers' fork server starts from the bare arguments, before the command line loads
(``h5etl.cli.early``), and only for a build that surely decodes on local workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig

from h5etl.cli.early import builds_on_local_workers


@pytest.mark.parametrize(
    "args",
    [
        ["build", "c.yaml"],
        ["build", "c.yaml", "-j", "2"],
        ["build", "c.yaml", "-j2", "--quiet"],
        ["build", "--jobs=3", "c.yaml", "--dry-run"],
        ["-v", "build", "c.yaml", "--scheduler", "local"],
        ["build", "a.yaml", "b.yaml"],
        ["build", "--notes", "build.yaml", "--", "c.yaml"],
    ],
)
def test_a_build_on_local_workers_starts_them_early(args: list[str], tmp_path: Path) -> None:
    assert builds_on_local_workers(args, cores=2)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--version"],
        ["validate", "c.yaml"],
        ["build"],
        ["build", "--help"],
        ["build", "c.yaml", "-h"],
        ["build", "c.yaml", "-j", "1"],
        ["build", "c.yaml", "-j1"],
        ["build", "c.yaml", "--jobs"],
        ["build", "c.yaml", "--jobs", "two"],
        ["build", "c.yaml", "--scheduler", "tcp://host:8786"],
        ["build", "c.yaml", "--scheduler=tcp://host:8786"],
        ["build", "c.yaml", "--shards", "2"],
    ],
)
def test_anything_else_leaves_the_start_to_the_command(args: list[str]) -> None:
    assert not builds_on_local_workers(args, cores=2)


def test_one_core_starts_no_pool() -> None:
    assert not builds_on_local_workers(["build", "c.yaml"], cores=1)


def test_an_incremental_build_starts_its_workers_once_it_decodes(tmp_path: Path) -> None:
    config = tmp_path / "cells.yaml"
    config.write_text("name: cells\noutput: releases\n", encoding="utf-8")
    (tmp_path / "releases").mkdir()
    assert builds_on_local_workers(["build", str(config)], cores=2)  # no release yet
    (tmp_path / "releases" / "cells.h5").symlink_to("cells-v0001.h5")
    assert not builds_on_local_workers(["build", str(config)], cores=2)  # may be up to date
    assert builds_on_local_workers(["build", str(config), "--full"], cores=2)


FORK_SERVER_EXIT = """
import atexit
atexit.register(print, "torn down")  # as numpy's, h5py's handlers: registered before
import h5etl.execute.server_exit
print("imported", flush=True)
"""


def test_the_fork_server_exits_without_its_teardown() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK_SERVER_EXIT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported"]


PAUSED = """
import gc
from h5etl.cli import early
early.start(["validate", "c.yaml"])
print(gc.isenabled())
early.start(["-v", "build", "c.yaml", "-j", "1"])
print(gc.isenabled())
early.resume_collection()
print(gc.isenabled(), gc.get_freeze_count() > 0)
gc.disable()
early.resume_collection()  # resumed already: a collection paused by others stays so
print(gc.isenabled())
"""


def test_a_build_starts_without_collecting_garbage_and_resumes_once() -> None:
    # in a process of its own: freezing the heap of a test process hung a later test
    done = subprocess.run(
        [sys.executable, "-c", PAUSED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "False", "True True", "False"]


BUILT = """
import gc, sys
from h5etl import cli
from h5etl.cli import ending
ending.exit_now = lambda code: None  # the process goes on, to be looked at
sys.argv = ["h5etl", "build", sys.argv[1], "-j", "2", "--quiet"]
try:
    cli.main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(gc.isenabled(), gc.get_freeze_count() > 0)
"""


def test_the_cli_collects_garbage_again_once_the_build_decodes(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4)
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", BUILT, str(config)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "True True"
