"""cluster faults on real worker and scheduler processes: each is one line, none loses data.

A worker that sees the sources otherwise (an empty mount point, made with a mount namespace of
its own), a worker without h5etl, a scheduler address that cannot work, and the scheduler
killed mid-build, which ``--resume`` then continues. One scheduler with one worker serves the
module (``LocalCluster``); each test adds the ``dask worker`` processes it needs and stops
them. The killed scheduler is a ``dask scheduler`` process of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import MakeRaw, WriteConfig, dataset_digests, read_release, save
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.errors import ConfigError, UsageError
from h5etl.format import journal
from h5etl.pipeline import run as pipeline
from h5etl.plan import tasks

distributed = pytest.importorskip("distributed")

STARTED_SECONDS = 120.0  # a deadline for processes to come up on a loaded machine, not a measure


@pytest.fixture(scope="module")
def scheduler() -> Iterator[Any]:
    """A scheduler in this process with one healthy worker process; tests add their own."""
    with (
        distributed.LocalCluster(
            n_workers=1,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as local,
        distributed.Client(local, set_as_default=False) as client,
    ):
        yield client


def _env(*first: str) -> dict[str, str]:
    """This process's environment, with ``first`` and then this process's import path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*first, *sys.path])}


def _wait(what: str, done: Any, process: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + STARTED_SECONDS
    while not done():
        if process is not None and process.poll() is not None:
            said = process.stderr.read() if process.stderr is not None else ""
            pytest.fail(f"{what}: the process ended with {process.returncode}: {said}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {STARTED_SECONDS:.0f} s")
        time.sleep(0.05)


def _scheduler_address(path: Path, process: subprocess.Popen[Any]) -> str:
    """The address a ``dask scheduler`` process writes to its scheduler file ``path``.

    Waited for until the file parses, not until it exists: the scheduler writes it in place
    (``open(path, "w")``, then ``json.dump``), so for a moment it exists empty."""
    found: list[str] = []

    def written() -> bool:
        with contextlib.suppress(FileNotFoundError, ValueError):
            found.append(json.loads(path.read_text())["address"])
        return bool(found)

    _wait("the scheduler", written, process)
    return found[0]


def _named(client: Any, name: str) -> str | None:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return next((address for address, w in workers.items() if w["name"] == name), None)


@contextlib.contextmanager
def _process(command: Sequence[str], cwd: Path, env: dict[str, str]) -> Iterator[Any]:
    """A process in a session of its own, killed with everything it started at the end."""
    with open(cwd / "process.log", "ab") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def _worker(
    client: Any,
    cwd: Path,
    name: str,
    *,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    preload: Path | None = None,
) -> Iterator[str]:
    """A ``dask worker`` process joined to ``client``'s scheduler; yields its address."""
    address = client.scheduler.address
    command = [*prefix, sys.executable, "-m", "distributed.cli.dask_worker", address]
    command += ["--name", name, "--nthreads", "1", "--no-nanny", "--no-dashboard"]
    command += ["--preload", str(preload)] if preload is not None else []
    with _process(command, cwd, env or _env()) as process:
        _wait(f"worker {name}", lambda: _named(client, name) is not None, process)
        try:
            yield str(_named(client, name))
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            _wait(f"worker {name} gone", lambda: _named(client, name) is None)


def _cli(config: Path, *options: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``h5etl build CONFIG -q OPTIONS`` in a process of its own (``prelude`` run first)."""
    script = textwrap.dedent(prelude) + "import sys\nfrom h5etl.cli.app import main\nmain()\n"
    command = [sys.executable, "-c", script, "build", str(config), "-q", *options]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), check=False)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _nothing_left(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["cells.status.json"]


def _mount_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], check=False).returncode == 0


@pytest.mark.skipif(not _mount_namespaces(), reason="needs root and unshare -m")
def test_a_worker_on_which_the_share_did_not_mount_fails_the_build_before_decoding(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, scheduler: Any
) -> None:
    # the share was an empty mount point on one host: a third of the samples became
    # per-file `unreadable` rejects and the release published with exit 0
    raw = make_raw(tmp_path, n=12)
    config = write_config(tmp_path)
    masks = str(raw.masks)
    # that host: its own mount namespace, where an empty file system hides the masks
    empty_mount = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$@"', masks]
    with _worker(scheduler, tmp_path, "unmounted", prefix=empty_mount) as address:
        cli = _cli(config, "--scheduler", scheduler.scheduler.address)
    assert cli.returncode == 1, cli.stderr
    line = _one_line(cli.stderr)
    assert f"worker {address} on host " in line, line
    assert f"sees the source folder {masks} empty where this build sees 12 entries" in line
    _nothing_left(tmp_path / "releases")  # nothing published, no temp file: nothing decoded
    status = json.loads((tmp_path / "releases" / "cells.status.json").read_text())
    assert status["state"] == "failed"
    assert status["samples"] == {}  # it failed before planning


def _nested(root: Path, folders: Sequence[str], per: int = 6) -> Path:
    """Image-only inputs under ``root/raw/nested/<folder>/`` (``per`` PNGs in each) and a
    config reading them all; ``max_rejects: null``, so only the source check stops a build
    that would lose them."""
    rng = np.random.default_rng(5)
    for folder in folders:
        for i in range(per):
            image = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
            save(root / "raw" / "nested" / folder / f"img_{i}.png", image)
    depth = "*/" * (folders[0].count("/") + 1)
    data = {
        "name": "cells",
        "output": "releases",
        "sources": {"image": {"dir": "raw/nested", "glob": f"{depth}*.png"}},
        "splits": {"train": 0.75, "valid": 0.25},
        "seed": 0,
        "fields": {"image": {"kind": "image", "shape": [3, 8, 8], "mode": "RGB"}},
        "storage": {"chunk_samples": 2, "compression": "lzf"},
        "max_rejects": None,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


@pytest.mark.skipif(not _mount_namespaces(), reason="needs root and unshare -m")
@pytest.mark.parametrize(
    ("folders", "said"),
    [
        # the first level holds the class folders, each empty there: named by that level
        pytest.param(
            ("a", "b"),
            "sees the folder {raw}/a empty where this build sees files in it",
            id="class-folders",
        ),
        # a level deeper: the first level looks alike, a planned input file is named
        pytest.param(
            ("p1/x", "p2/x"),
            "does not see {raw}/p1/x/img_0.png, an input of this build (it sees the folder "
            "{raw}/p1/x empty",
            id="deeper",
        ),
    ],
)
def test_a_worker_whose_share_holds_only_empty_folders_fails_before_decoding(
    tmp_path: Path, scheduler: Any, folders: tuple[str, ...], said: str
) -> None:
    # issue 25, B3: a worker whose root holds the class folders a/, b/ but empty passed the
    # check of the first level; the build made a per-file `unreadable` reject of every
    # file it was handed, and with max_rejects null would publish
    config = _nested(tmp_path, folders)
    raw = str(tmp_path / "raw" / "nested")
    made_again = 'mount -t tmpfs none "$0" && cd "$0" && mkdir -p ' + " ".join(folders)
    unmounted = ["unshare", "-m", "sh", "-c", made_again + ' && exec "$@"', raw]
    with _worker(scheduler, tmp_path, "made-again", prefix=unmounted) as address:
        cli = _cli(config, "--scheduler", scheduler.scheduler.address)
    assert cli.returncode == 1, cli.stderr
    line = _one_line(cli.stderr)
    assert f"worker {address} on host " in line, line
    assert said.format(raw=raw) in line, line
    assert not list((tmp_path / "releases").glob("cells*.h5")), "nothing published or decoded"
    assert not (tmp_path / "releases" / "cells.h5").exists()


def test_a_worker_without_h5etl_is_named_in_one_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, scheduler: Any
) -> None:
    # Dask wrapped the worker's ImportError in a plain Exception and a traceback reached
    # the user
    make_raw(tmp_path, n=3)
    config = write_config(tmp_path)
    hidden = tmp_path / "hidden" / "h5etl"
    hidden.mkdir(parents=True)
    # as a worker without h5etl says it: the message ends with a quote, which stays
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'h5etl'\")\n")
    env = _env(str(hidden.parent))
    with _worker(scheduler, tmp_path, "without-h5etl", env=env) as address:
        cli = _cli(config, "--scheduler", scheduler.scheduler.address)
    assert cli.returncode == 1, cli.stderr
    line = _one_line(cli.stderr)
    assert f"the Dask worker {address} cannot run h5etl" in line, line
    assert "(ModuleNotFoundError: No module named 'h5etl')" in line
    assert "pip install 'h5etl[dask]==" in line
    _nothing_left(tmp_path / "releases")


runner = CliRunner()


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        pytest.param("tpc://127.0.0.1:8786", "unknown scheme 'tpc'", id="scheme-typo"),
        pytest.param("tcp://127.0.0.1", "not a scheduler address", id="no-port"),
        pytest.param("tcp://127.0.0.1:87860", "not a scheduler address", id="port-too-big"),
        pytest.param("tcp://a host:8786", "not a scheduler address", id="space"),
    ],
)
def test_a_scheduler_address_that_cannot_work_is_a_usage_error_before_connecting(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, address: str, problem: str
) -> None:
    # a typo in the scheme waited 20 s, then printed a 98-line traceback
    make_raw(tmp_path, n=1)
    config = write_config(tmp_path)
    result = runner.invoke(app, ["build", str(config), "-q", "--scheduler", address])
    assert result.exit_code == 2, result.output
    line = _one_line(result.output)
    assert line.startswith(f"h5etl: error: --scheduler: {problem}"), line
    assert repr(address) in line
    with pytest.raises(ConfigError, match=rf"decode\.scheduler: {problem}"):
        load_spec(write_config(tmp_path, config_name="bad.yaml", decode={"scheduler": address}))
    with pytest.raises(UsageError, match=rf"scheduler: {problem}"):
        pipeline.build(load_spec(config), scheduler=address)
    _nothing_left(tmp_path / "releases")


def test_an_inproc_address_is_no_scheduler_for_the_command_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    command = ["build", str(write_config(tmp_path)), "-q", "--scheduler", "inproc://10.0.0.1/4/1"]
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    assert "names a scheduler inside another process" in _one_line(result.output)


def test_good_scheduler_addresses_are_accepted(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    for address in ("local", "tcp://10.0.0.1:8786", "node7:8786", "tls://[::1]:8786"):
        assert load_spec(write_config(tmp_path, decode={"scheduler": address})).decode


# A worker that decodes its first two tasks and then holds every other one until it is killed:
# the build has checkpointed what it stored when the scheduler dies, and cannot have finished.
HOLD = """
import threading

import h5etl.decode.task

if not hasattr(h5etl.decode.task, "held_tasks"):  # dask may import a preload file twice
    h5etl.decode.task.held_tasks = []
    _decode = h5etl.decode.task.decode_batch

    def _held(task, recipe):
        if len(h5etl.decode.task.held_tasks) >= 2:
            threading.Event().wait()
        h5etl.decode.task.held_tasks.append(task.start)
        return _decode(task, recipe)

    h5etl.decode.task.decode_batch = _held
"""
# The build as the CLI runs it, with tasks of 4 samples and a checkpoint after each
SMALL_TASKS = """
import functools
import h5etl.pipeline.run, h5etl.plan.tasks
h5etl.plan.tasks.TASK_SAMPLES = 4
h5etl.pipeline.run.build = functools.partial(h5etl.pipeline.run.build, checkpoint_seconds=0)
"""


def _checkpointed(folder: Path) -> int:
    """Samples the journal of the build writing in ``folder`` holds (0: none yet)."""
    for path in folder.glob(".cells.partial-*.journal"):
        state = journal.read(path)
        if state is not None and state.samples:
            return int(state.samples)
    return 0


def test_a_scheduler_killed_mid_build_is_one_line_and_resume_continues(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    scheduler: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 33 lines with a traceback, and "--resume continues from the last checkpoint" while the
    # temp file was gone: --resume started from zero
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        make_raw(root, n=30, broken=["mask_128"])
    config = write_config(killed)
    (tmp_path / "hold.py").write_text(HOLD)
    command = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    command += ["--port", "0", "--no-dashboard", "--scheduler-file", str(tmp_path / "s.json")]
    with _process(command, tmp_path, _env()) as dying:
        address = _scheduler_address(tmp_path / "s.json", dying)
        holding = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads"]
        holding += ["1", "--no-nanny", "--no-dashboard", "--preload", str(tmp_path / "hold.py")]
        with _process(holding, tmp_path, _env()):
            script = textwrap.dedent(SMALL_TASKS) + "from h5etl.cli.app import main\nmain()\n"
            build = [sys.executable, "-c", script, "build", str(config), "-q"]
            with subprocess.Popen(
                [*build, "--scheduler", address], stderr=subprocess.PIPE, text=True, env=_env()
            ) as cli:
                _wait("two checkpoints", lambda: _checkpointed(killed / "releases") >= 8, cli)
                os.kill(dying.pid, signal.SIGKILL)
                _, stderr = cli.communicate(timeout=STARTED_SECONDS)
    assert cli.returncode == 1, stderr
    line = _one_line(stderr)
    assert line.startswith(f"h5etl: error: lost the Dask scheduler at {address} mid-build"), line
    assert line.endswith("nothing was published: --resume continues from the last checkpoint")
    stored = _checkpointed(killed / "releases")
    assert stored == 8  # two tasks of 4
    assert not (killed / "releases" / "cells.h5").exists()

    monkeypatch.setattr(tasks, "TASK_SAMPLES", 4)  # cut as the killed build did
    spec = load_spec(config)
    resumed = pipeline.build(spec, scheduler=scheduler.scheduler.address, resume=True)
    assert resumed.resumed == stored  # it continued; it did not start from zero
    reference = pipeline.build(load_spec(write_config(clean)), jobs=1)
    assert resumed.path is not None
    assert reference.path is not None
    assert dataset_digests(resumed.path) == dataset_digests(reference.path)
    stored_rows, expected_rows = read_release(resumed.path), read_release(reference.path)
    assert sorted(stored_rows) == sorted(expected_rows)
    for name, rows in expected_rows.items():
        assert (stored_rows[name] == rows).all(), name
    assert sorted(p.name for p in (killed / "releases").glob(".cells.partial-*")) == []


# A worker that holds every task until it is killed, saying so in the file MARKER (dask runs
# a copy of a preload file): no checkpoint is ever written
HOLD_ALL = """
import pathlib
import threading

import h5etl.decode.task


def _held(task, recipe):
    pathlib.Path(MARKER).touch()
    threading.Event().wait()


h5etl.decode.task.decode_batch = _held
"""


@pytest.mark.parametrize("shards", [(), ("--shards", "2")], ids=["one-writer", "sharded"])
def test_a_scheduler_killed_before_the_first_checkpoint_promises_no_resume(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, shards: tuple[str, ...]
) -> None:
    # it said "--resume continues from the last checkpoint": there was none, and --resume
    # built from the start
    make_raw(tmp_path, n=8)
    config = write_config(tmp_path)
    marker = tmp_path / "holding"
    (tmp_path / "hold.py").write_text(HOLD_ALL.replace("MARKER", repr(str(marker))))
    command = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    command += ["--port", "0", "--no-dashboard", "--scheduler-file", str(tmp_path / "s.json")]
    with _process(command, tmp_path, _env()) as dying:
        address = _scheduler_address(tmp_path / "s.json", dying)
        holding = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads"]
        holding += ["1", "--no-nanny", "--no-dashboard", "--preload", str(tmp_path / "hold.py")]
        with _process(holding, tmp_path, _env()):
            build = [sys.executable, "-m", "h5etl", "build", str(config), "-q", *shards]
            with subprocess.Popen(
                [*build, "--scheduler", address], stderr=subprocess.PIPE, text=True, env=_env()
            ) as cli:
                _wait("a task held", marker.is_file, cli)
                os.kill(dying.pid, signal.SIGKILL)
                _, stderr = cli.communicate(timeout=STARTED_SECONDS)
    assert cli.returncode == 1, stderr
    line = _one_line(stderr)
    assert line.startswith(f"h5etl: error: lost the Dask scheduler at {address} mid-build"), line
    assert "--resume continues" not in line
    assert line.endswith(
        "nothing was published (no checkpoint had been written yet: the next build starts "
        "from the start)"
    )
    if shards:  # a sharded build's shard files stay (--resume checks and reuses them)
        assert not list((tmp_path / "releases").glob("cells*.h5"))
    else:
        _nothing_left(tmp_path / "releases")
