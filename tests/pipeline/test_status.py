"""Live status: a build keeps ``<output>/<name>.status.json`` up to date, replaced atomically,
and ``h5etl status OUTPUT`` reads it from anywhere: a running build's stage, samples per
split, rate, ETA and rejects; after it, the outcome."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import pytest
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.errors import BuildFailed, LockHeld, ShardError
from h5etl.pipeline import status
from h5etl.release.folder import OutputFolder

runner = CliRunner()

# A build in its own process that stops decoding after ``open`` samples until ``gate``
# exists: the test reads its status while it waits, then lets it finish.
GATED_BUILD = """
    import sys, time
    from pathlib import Path
    import h5etl, h5etl.inputs.raster, h5etl.plan.tasks
    h5etl.plan.tasks.TASK_SAMPLES = 4
    config, gate, open_samples = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    original = h5etl.inputs.raster.decode_field  # what the kinds decode with
    calls = 0
    def gated(*args, **kwargs):
        global calls
        calls += 1
        while calls > 2 * open_samples and not gate.exists():  # an image and a mask each
            time.sleep(0.01)
        return original(*args, **kwargs)
    h5etl.inputs.raster.decode_field = gated
    h5etl.build(h5etl.load_spec(config), jobs=1)
"""


@pytest.fixture
def project(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> Path:
    make_raw(tmp_path, n=30, broken=["mask_128", "orphan_image"])
    return write_config(tmp_path)


@contextlib.contextmanager
def gated_build(
    config: Path, open_samples: int = 12
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    gate = config.parent / "gate"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(GATED_BUILD),
            str(config),
            str(gate),
            str(open_samples),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc, gate
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)


def read_status(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "cells.status.json").read_text("utf-8"))
    return data


def wait_for(folder: Path, done: Any, timeout: float = 90.0) -> dict[str, Any]:
    """The status once ``done(status)`` holds (the file may not exist yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            data = read_status(folder)
            if done(data):
                return data
        time.sleep(0.05)
    raise AssertionError(f"no such status within {timeout} s")


def waiting(data: dict[str, Any]) -> bool:
    """The gated build stored its first samples and waits at the gate."""
    samples = data.get("samples") or {}
    return data.get("stage") == "decode+write" and sum(s["stored"] for s in samples.values()) >= 8


def test_a_running_build_shows_its_progress_to_another_process(project: Path) -> None:
    folder = project.parent / "releases"
    with gated_build(project) as (proc, gate):
        data = wait_for(folder, waiting)
        assert data["state"] == "running"
        assert data["pid"] == proc.pid
        assert data["total"] == 31  # samples planned: 30 pairs and the one with a bad mask
        assert 8 <= data["done"] <= 12
        assert data["samples"]["train"]["planned"] + data["samples"]["valid"]["planned"] == 31
        assert data["rejects"]["reasons"].get("orphan") == 1  # found before decoding
        assert data["rate"] > 0
        assert data["eta_seconds"] >= 0
        result = runner.invoke(app, ["status", str(folder)])
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0].startswith(f"cells: running (pid {proc.pid} on ")
        assert lines[1].startswith("  stage: decode+write, ")
        assert " of 31 (" in lines[1]
        assert lines[2].startswith("  rate: ")
        assert "to go" in lines[2]
        assert lines[3].startswith("  samples stored/planned: train ")
        assert lines[4].startswith("  rejects: ")
        assert not (folder / "cells.h5").exists()  # nothing published while it waits
        gate.touch()
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    data = read_status(folder)
    assert data["state"] == "succeeded"
    assert data["result"]["version"] == 1
    with h5py.File(folder / "cells.h5", "r") as handle:
        for split in ("train", "valid"):
            assert data["samples"][split]["stored"] == len(handle[f"{split}/image"])
    assert data["rejects"] == {"total": 3, "reasons": {"mask_values": 2, "orphan": 1}}
    result = runner.invoke(app, ["status", str(folder / "cells.h5")])
    assert result.exit_code == 0
    assert result.output.startswith("cells: succeeded at ")
    assert "v0001 " in result.output.splitlines()[0]


def test_no_status_shows_a_batch_stored_before_its_progress(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the status thread could write between a batch's stored count and the progress advance
    # that follows it: a reader saw "stored 8" beside "done 4" (the live-status test above
    # failed so, `8 <= 4`, with the build paused there). Here a write is forced right there.
    from h5etl.history import provenance

    live: list[status.BuildStatus] = []
    written: list[dict[str, Any]] = []
    enter, lines, write = (
        status.BuildStatus.__enter__,
        provenance.fingerprint_lines,
        OutputFolder.write_status,
    )

    def entered(self: status.BuildStatus) -> status.BuildStatus:
        live.append(self)
        return enter(self)

    def between(result: Any) -> list[str]:  # the pipeline's step after storing a batch
        live[-1].write_now()
        return lines(result)

    def recorded(self: OutputFolder, data: dict[str, Any]) -> None:
        written.append(json.loads(json.dumps(data)))
        write(self, data)

    monkeypatch.setattr(status.BuildStatus, "__enter__", entered)
    monkeypatch.setattr(provenance, "fingerprint_lines", between)
    monkeypatch.setattr(OutputFolder, "write_status", recorded)
    h5etl.build(h5etl.load_spec(project), jobs=1)
    decoding = [d for d in written if d["stage"] == "decode+write" and d["state"] == "running"]
    assert len(decoding) > 1
    for data in decoding:  # a first build: every sample stored was settled (stored or not)
        assert sum(s["stored"] for s in data["samples"].values()) <= data["done"], data
    assert written[-1]["state"] == "succeeded"
    assert written[-1]["rejects"] == {"total": 3, "reasons": {"mask_values": 2, "orphan": 1}}


def test_samples_copied_from_a_killed_build_count_with_the_progress_that_follows(
    tmp_path: Path,
) -> None:
    # a resumed build set its stored counts, then read its parent's snapshot before the
    # progress advance: a status written in between showed stored ahead of done
    output = OutputFolder(tmp_path, "cells")
    with status.BuildStatus(output, config=None, jobs=1) as build_status:
        build_status("decode+write", 0, 20)
        build_status.resumed({"train": 6, "valid": 2})
        build_status.write_now()
        shown = read_status(tmp_path)
        assert (shown["done"], shown["samples"]) == (0, {})
        build_status("decode+write", 8, None)
        build_status.write_now()
        shown = read_status(tmp_path)
    assert shown["done"] == 8
    assert {split: counts["stored"] for split, counts in shown["samples"].items()} == {
        "train": 6,
        "valid": 2,
    }


def test_a_killed_build_is_shown_as_killed(project: Path) -> None:
    folder = project.parent / "releases"
    with gated_build(project) as (proc, _):
        wait_for(folder, waiting)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert read_status(folder)["state"] == "running"  # as it was left: its process is gone
    result = runner.invoke(app, ["status", str(folder)])
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first.startswith(f"cells: killed (pid {proc.pid} on ")
    assert "is gone" in first
    assert "nothing was published" in first
    shown = json.loads(runner.invoke(app, ["status", str(folder), "--json"]).output)
    assert [entry["state"] for entry in shown] == ["killed"]


def test_a_second_build_waiting_for_the_lock_leaves_the_status_alone(project: Path) -> None:
    folder = project.parent / "releases"
    with gated_build(project) as (proc, gate):
        before = wait_for(folder, waiting)
        with pytest.raises(LockHeld):
            h5etl.build(h5etl.load_spec(project))
        assert read_status(folder)["pid"] == proc.pid == before["pid"]
        gate.touch()
        proc.communicate(timeout=120)
    assert read_status(folder)["state"] == "succeeded"


def test_a_failed_build_leaves_its_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6, broken=["mask_128"])
    config = write_config(tmp_path, on_error="fail")
    with pytest.raises(BuildFailed) as failed:
        h5etl.build(h5etl.load_spec(config))
    folder = tmp_path / "releases"
    data = read_status(folder)
    assert data["state"] == "failed"
    assert data["result"] == {"error": str(failed.value).splitlines()[0], "exit_code": 1}
    result = runner.invoke(app, ["status", str(folder)])
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first.startswith("cells: failed at ")
    assert first.endswith(
        f"per-file reasons in {folder / 'cells.failed.rejects.jsonl'} "
        "(see docs/reference/rejects.md#mask_values) (exit code 1)"
    )


def test_an_error_without_words_still_leaves_a_status(tmp_path: Path) -> None:
    # it raised IndexError inside the handler and hid the build's own error
    output = OutputFolder(tmp_path, "cells")
    with status.BuildStatus(output, config=None, jobs=1) as build_status:
        build_status.failed(ShardError(""))
    assert read_status(tmp_path)["result"] == {"error": "ShardError", "exit_code": 1}


def test_a_dry_run_writes_no_status(project: Path) -> None:
    h5etl.build(h5etl.load_spec(project), dry_run=True)
    assert not (project.parent / "releases").exists()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        pytest.param(
            "releases", "no build status here: no build has run in this folder yet", id="empty"
        ),
        pytest.param(
            "nowhere",
            "not an output folder (nothing is there); give one, such as releases",
            id="missing",
        ),
    ],
)
def test_status_without_a_build_is_a_usage_error(tmp_path: Path, where: str, message: str) -> None:
    (tmp_path / "releases").mkdir()
    result = runner.invoke(app, ["status", str(tmp_path / where)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"h5etl: error: {tmp_path / where}: {message}"


def test_a_status_that_cannot_be_written_does_not_fail_the_build(
    project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(self: OutputFolder, data: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(OutputFolder, "write_status", full)
    with caplog.at_level(logging.INFO, logger="h5etl.pipeline.status"):
        report = h5etl.build(h5etl.load_spec(project))
    assert report.version == 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "h5etl.pipeline.status"]
    assert len(warnings) == 1  # once, not at every write; shown with --verbose
    assert "cannot write the build status" in warnings[0]
    assert not (project.parent / "releases" / "cells.status.json").exists()


def test_writes_are_throttled_and_atomic(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    writes = 0
    original = OutputFolder.write_status

    def counted(self: OutputFolder, data: Any) -> None:
        nonlocal writes
        writes += 1
        original(self, data)

    bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                text = output.status_path.read_text("utf-8")
                try:
                    json.loads(text)
                except ValueError:
                    bad.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    OutputFolder.write_status = counted  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        with status.BuildStatus(output, config=None, jobs=1) as build_status:
            build_status("decode+write", 0, 100_000)
            for _ in range(100_000):
                build_status("decode+write", 1, None)
            time.sleep(0.6)
            elapsed = time.monotonic() - started
    finally:
        OutputFolder.write_status = original  # type: ignore[method-assign]
        stop.set()
        thread.join()
    assert not bad, "a reader saw a half-written status"
    # the opening write, the stage's, then at most four a second (and one heartbeat)
    assert writes <= 3 + status.WRITES_PER_SECOND * (elapsed + 0.25)
    assert read_status(tmp_path)["done"] == 100_000  # the last progress was written
    assert not list(tmp_path.glob(".*tmp*")), "no temp file is left"


@pytest.mark.parametrize(
    ("lock", "state", "shown"),
    [
        pytest.param(False, "killed", "cells: killed (pid 7 on elsewhere is gone;", id="no-lock"),
        pytest.param(True, "running", "cells: running (pid 7 on elsewhere, started ", id="locked"),
    ],
)
def test_another_hosts_build_is_judged_by_its_lock_file(
    tmp_path: Path, lock: bool, state: str, shown: str
) -> None:
    output = OutputFolder(tmp_path, "cells")
    data = {**status.BuildStatus(output, config=None, jobs=1).data, "pid": 7, "host": "elsewhere"}
    output.write_status(data)
    if lock:
        output.lock_path.write_text(json.dumps({"pid": 7, "host": "elsewhere", "flock": True}))
    (view,) = status.read_statuses(tmp_path)
    assert view.state == state
    assert status.describe(view)[0].startswith(shown)
    if lock:
        assert "on another host: last update " in status.describe(view)[0]
