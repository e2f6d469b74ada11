"""Failure modes lose nothing: kills, Ctrl-C, concurrent builds, full disks, crashing workers,
hostile inputs, resume. Each test observes the folder after the failure: link target, the
previous release's bytes, and which files are left."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, dataset_digests, random_pair, save
from PIL import Image

import h5etl
import h5etl.sink.array_writer
from h5etl.config.load import load_spec
from h5etl.dataflow import BatchResult, DecodeTask
from h5etl.decode import task as decode
from h5etl.decode.recipe import DecodeRecipe
from h5etl.errors import BuildFailed, LockHeld, SinkError
from h5etl.execute import assembly, schedule
from h5etl.plan import tasks
from h5etl.release.folder import OutputFolder

CELLS = "cells"
PUBLISHED_V1 = [
    "cells-v0001.build.json",
    "cells-v0001.h5",
    "cells-v0001.rejects.jsonl",
    "cells.h5",
]


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def folder_state(folder: Path) -> dict[str, Any]:
    """What a failure left behind: the link target and every file name."""
    link = folder / f"{CELLS}.h5"
    return {
        "link": os.readlink(link) if link.is_symlink() else None,
        # the build status and each release's carry record stay by design (test_status.py,
        # test_incremental.py): no leftovers
        "files": sorted(
            p.name for p in folder.iterdir() if not p.name.endswith((".status.json", ".carry.json"))
        ),
    }


def release_named(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f"{CELLS}-v"))


# Decode tasks of 2 samples (and 2 reserves), in this process and in the scripts below, so a
# build of 24 pairs has many batches for a kill to land between.
TASK_SAMPLES = 2


@pytest.fixture
def project(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A raw folder of 24 good pairs and a config with small chunks, so builds have many batches."""
    monkeypatch.setattr(tasks, "TASK_SAMPLES", TASK_SAMPLES)
    make_raw(tmp_path, n=24)
    return write_config(tmp_path, storage={"chunk_samples": 2})


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(load_spec(config), **kwargs)


def run_script(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh interpreter and session (so it can be killed for real).

    Output goes to a file, not a pipe: worker processes of a killed build would hold a pipe
    open; the whole session is killed afterwards so none of them outlives the test.
    """
    with open(os.devnull, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, code, "", "")


# A build that SIGKILLs itself after `after` samples went through the sink, or from inside the
# sink in the middle of storing chunks (`where=sink`).
KILLED_BUILD = f"""
    import os, signal, sys
    import h5etl, h5etl.plan.tasks, h5etl.sink.array_writer
    h5etl.plan.tasks.TASK_SAMPLES = {TASK_SAMPLES}
    from h5etl.config.load import load_spec
    config, after, jobs, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    seen = 0
    def hook(stage, advance, total):
        global seen
        if stage == "decode+write" and total is None:
            seen += advance
            if where == "decode" and seen >= after:
                os.kill(os.getpid(), signal.SIGKILL)
    stores = 0
    original = h5etl.sink.array_writer.ArrayWriter._store
    def store(self, row, chunks):
        global stores
        stores += 1
        if where == "sink" and stores == after:
            # half of this batch's chunks are on disk, the rest never will be
            original(self, row, chunks[: len(chunks) // 2 or 1])
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, row, chunks)
    h5etl.sink.array_writer.ArrayWriter._store = store
    resume = sys.argv[5:] == ["resume"]
    # full: decode everything, as a build without a release to carry from does
    h5etl.build(
        load_spec(config), jobs=jobs, progress=hook, checkpoint_seconds=0, resume=resume, full=True
    )
"""


# `h5etl build CONFIG` through the CLI, slowed down so that a signal lands mid-build: about
# 10 s of decoding (24 pairs), so that a poller starved on a loaded machine still finds it
# mid-build; the test stops it at once, so this costs nothing when all is well.
# The CLI build, its first decode held until the build's handler has recorded the Ctrl-C (at
# most 120 s): the signal lands mid-build however late a loaded machine lets the test send it.
# It was a 0.2 s sleep per decode, a window of about 10 s.
SLOW_CLI_BUILD = """
    import sys, time
    import h5etl.inputs.raster
    from h5etl.pipeline import interrupts
    original = h5etl.inputs.raster.decode_field  # what the kinds decode with
    calls = [0]
    def slow(*args, **kwargs):
        calls[0] += 1
        deadline = time.monotonic() + 120
        while calls[0] == 1 and not interrupts.requested() and time.monotonic() < deadline:
            time.sleep(0.01)  # in the main thread, the Ctrl-C raises in here
        return original(*args, **kwargs)
    h5etl.inputs.raster.decode_field = slow
    from h5etl.cli.app import main
    sys.argv = ["h5etl", "build", sys.argv[1], "--jobs", "1", "--quiet", "--full"]
    main()
"""


@pytest.mark.parametrize(
    ("after", "jobs", "where"),
    [
        pytest.param(4, 2, "decode", id="while-workers-decode"),
        pytest.param(7, 1, "sink", id="while-sink-writes"),
    ],
)
def test_sigkill_leaves_previous_release_and_link(
    project: Path, after: int, jobs: int, where: str
) -> None:
    first = build(project)
    folder = first.path.parent if first.path else Path()
    before = file_sha(folder / "cells-v0001.h5")

    killed = run_script(KILLED_BUILD, str(project), str(after), str(jobs), where)

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    state = folder_state(folder)
    assert state["link"] == "cells-v0001.h5"
    assert file_sha(folder / "cells-v0001.h5") == before
    assert release_named(folder) == [
        "cells-v0001.build.json",
        "cells-v0001.h5",
        "cells-v0001.rejects.jsonl",
    ]
    leftovers = [f for f in state["files"] if f.startswith(".cells.partial-")]
    assert leftovers, "a killed build leaves a recognisable temp file"

    # no --resume: starts clean and removes the leftovers (full, as the killed one: the same
    # inputs as v0001's would otherwise be up to date)
    second = build(project, full=True)

    assert second.version == 2
    assert second.resumed == 0
    assert folder_state(folder)["link"] == "cells-v0002.h5"
    assert not [f for f in os.listdir(folder) if ".partial-" in f or f.endswith(".lock")]
    assert file_sha(folder / "cells-v0001.h5") == before


@pytest.mark.parametrize(
    ("after", "jobs", "where"),
    [
        pytest.param(2, 1, "decode", id="after-first-batch"),
        pytest.param(12, 2, "decode", id="midway-jobs2"),
        pytest.param(20, 1, "decode", id="near-the-end"),
        pytest.param(6, 1, "sink", id="inside-the-sink"),
    ],
)
def test_resume_after_kill_matches_uninterrupted_build(
    project: Path, tmp_path: Path, after: int, jobs: int, where: str
) -> None:
    reference = build(project, jobs=1)
    assert reference.path is not None
    expected = dataset_digests(reference.path)
    reference.path.unlink()
    (reference.path.parent / "cells.h5").unlink()

    killed = run_script(KILLED_BUILD, str(project), str(after), str(jobs), where)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    resumed = build(project, jobs=jobs, resume=True)

    assert resumed.path is not None
    assert resumed.resumed > 0, "the work written before the kill was reused"
    assert resumed.resumed < sum(resumed.samples.values())
    assert dataset_digests(resumed.path) == expected
    report = check_deep(resumed.path)
    assert report.ok, report.problems
    assert not [f for f in os.listdir(resumed.path.parent) if ".partial-" in f]


def test_resume_of_a_resumed_build_that_was_killed_again(project: Path, tmp_path: Path) -> None:
    # Undecodable images (valid header, truncated pixels) give decode rejects on both sides of
    # each kill; a resumed build must carry them, the rows and the lineage of the first part.
    for key in ("s003", "s011", "s019"):
        path = tmp_path / "raw" / "images" / f"{key}.png"
        path.write_bytes(path.read_bytes()[:-40])
    reference = build(project, jobs=1)
    assert reference.path is not None
    expected = dataset_digests(reference.path)
    with h5py.File(reference.path) as f:
        expected_fingerprint = f.attrs["source_fingerprint"]
    expected_rejects = sorted((r.path, r.reason) for r in reference.rejects)
    assert len(expected_rejects) == 6  # each image with its mask
    reference.path.unlink()
    (reference.path.parent / "cells.h5").unlink()

    first = run_script(KILLED_BUILD, str(project), "6", "1", "decode")
    second = run_script(KILLED_BUILD, str(project), "14", "1", "decode", "resume")
    assert (first.returncode, second.returncode) == (-signal.SIGKILL, -signal.SIGKILL)
    leftovers = sorted(p.suffix for p in reference.path.parent.glob(".cells.partial-*"))
    assert leftovers == [".h5", ".journal"], "the first build's files went once copied"

    resumed = build(project, jobs=2, resume=True)

    assert resumed.path is not None
    assert resumed.resumed >= 10, "the work of both killed builds was reused"
    assert dataset_digests(resumed.path) == expected
    with h5py.File(resumed.path) as f:
        assert f.attrs["source_fingerprint"] == expected_fingerprint
        for split in f:
            if split != "diagnostics":
                lengths = {len(f[split][name]) for name in f[split]}
                assert len(lengths) == 1, f"{split}: fields of different lengths {lengths}"
    assert sorted((r.path, r.reason) for r in resumed.rejects) == expected_rejects
    report = check_deep(resumed.path)
    assert report.ok, report.problems


def test_resume_skips_a_newer_journal_without_checkpoints(project: Path) -> None:
    reference = build(project, jobs=1)
    assert reference.path is not None
    expected = dataset_digests(reference.path)
    reference.path.unlink()
    (reference.path.parent / "cells.h5").unlink()
    killed = run_script(KILLED_BUILD, str(project), "10", "1", "decode")
    assert killed.returncode == -signal.SIGKILL
    folder = reference.path.parent
    (journal_path,) = folder.glob(".cells.partial-*.journal")
    # A later build killed before its first checkpoint: a header and nothing else.
    later = folder / ".cells.partial-1-abcdef.h5"
    later.write_bytes(b"")
    header = journal_path.read_text("utf-8").splitlines()[0]
    later.with_suffix(".journal").write_text(header + "\n", "utf-8")
    stamp = journal_path.stat().st_mtime_ns + 1_000_000_000
    os.utime(later.with_suffix(".journal"), ns=(stamp, stamp))

    resumed = build(project, resume=True)

    assert resumed.resumed > 0, "the older journal's work was reused"
    assert resumed.path is not None
    assert dataset_digests(resumed.path) == expected
    assert not [f for f in os.listdir(folder) if ".partial-" in f]


@pytest.mark.parametrize("jobs", [1, 2])
def test_resume_with_decode_rejects_matches_uninterrupted_build(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    jobs: int,
) -> None:
    # rejects at decode make tasks defer samples to later rounds: a resume must find the same
    # rounds, the same deferred samples and the same rejects in the journal
    monkeypatch.setattr(tasks, "TASK_SAMPLES", TASK_SAMPLES)
    broken = {f"bad{i}": "mask_128" for i in range(4)} | {"late": "truncated_late"}
    make_raw(tmp_path, n=24, broken=broken)
    project = write_config(tmp_path, storage={"chunk_samples": 2})
    reference = build(project, jobs=1)
    assert reference.path is not None
    expected = dataset_digests(reference.path)
    expected_rejects = sorted((r.path, r.reason) for r in reference.rejects)
    reference.path.unlink()
    (reference.path.parent / "cells.h5").unlink()

    killed = run_script(KILLED_BUILD, str(project), "14", str(jobs), "decode")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = build(project, jobs=jobs, resume=True)

    assert resumed.path is not None
    assert 0 < resumed.resumed < sum(resumed.samples.values())
    assert dataset_digests(resumed.path) == expected
    assert sorted((r.path, r.reason) for r in resumed.rejects) == expected_rejects
    assert check_deep(resumed.path).ok


def test_resume_passes_over_a_newer_journal_of_another_config(project: Path) -> None:
    killed = run_script(KILLED_BUILD, str(project), "10", "1", "decode")
    assert killed.returncode == -signal.SIGKILL
    folder = project.parent / "releases"
    (journal_path,) = folder.glob(".cells.partial-*.journal")
    other = folder / ".cells.partial-1-abcdef.h5"
    other.write_bytes(b"")
    header = {"format": 2, "config_sha256": "another", "plan_sha256": "another"}
    queue = {"consumed": 4, "deferred": [], "rounds": [8], "cut": [2, 2, 2]}
    delta: dict[str, Any] = {"queues": {"train": queue}, "rows": {"train": 4}}
    delta |= {"chunks": [], "blocks": {}, "texts": {}, "lineage": {}}
    delta |= {"fingerprint": [], "rejects": []}
    lines = [json.dumps(header), json.dumps(delta)]
    other.with_suffix(".journal").write_text("\n".join(lines) + "\n", "utf-8")
    stamp = journal_path.stat().st_mtime_ns + 1_000_000_000
    os.utime(other.with_suffix(".journal"), ns=(stamp, stamp))

    resumed = build(project, resume=True)

    assert resumed.resumed > 0, "the older journal of this config was used"
    assert resumed.path is not None
    assert check_deep(resumed.path).ok


def test_resume_refuses_inputs_edited_in_place(project: Path, tmp_path: Path) -> None:
    killed = run_script(KILLED_BUILD, str(project), "10", "1", "decode")
    assert killed.returncode == -signal.SIGKILL
    # One image is edited in place: same name and size in pixels, new pixels and a later
    # mtime. Its size and mtime are what a resume sees without reading the file.
    images = sorted((tmp_path / "raw" / "images").glob("*.png"))
    with Image.open(images[0]) as opened:
        edited = 255 - np.asarray(opened)
    save(images[0], edited)
    stamp = images[0].stat().st_mtime_ns + 1_000_000_000
    os.utime(images[0], ns=(stamp, stamp))

    report = build(project, resume=True)

    assert report.resumed == 0  # built from the start: no old pixels mixed in
    assert report.path is not None
    expected = build(project)
    assert expected.path is not None
    assert dataset_digests(report.path) == dataset_digests(expected.path)


def check_deep(path: Path) -> Any:
    from h5etl.check.health import check_release

    return check_release(path, deep=True)


def test_resume_refuses_a_changed_plan(project: Path, make_raw: MakeRaw, tmp_path: Path) -> None:
    killed = run_script(KILLED_BUILD, str(project), "10", "1", "decode")
    assert killed.returncode == -signal.SIGKILL
    extra = np.zeros((8, 8, 3), np.uint8)
    save(tmp_path / "raw" / "images" / "zz_new.png", extra)
    save(tmp_path / "raw" / "masks" / "zz_new.png", extra[..., 0])

    report = build(project, resume=True)

    assert report.resumed == 0  # inputs changed: built from the start, not mixed
    assert sum(report.samples.values()) == 25


def interrupt_slow_build(config: Path, folder: Path) -> tuple[bool, int, str]:
    """Run the CLI build held at its first decode, Ctrl-C it once it writes its temp file (or
    after 60 s).

    Returns whether it had started writing, its exit code and its stderr.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SLOW_CLI_BUILD), str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    started = False
    while not started and time.monotonic() < deadline:
        started = bool(list(folder.glob(".cells.partial-*.h5")))
        if not started:
            time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    return started, proc.returncode, stderr


def test_sigint_stops_cleanly_with_exit_130(project: Path) -> None:
    build(project)
    folder = project.parent / "releases"
    before = file_sha(folder / "cells-v0001.h5")

    started, returncode, stderr = interrupt_slow_build(project, folder)

    assert started, "the build never started writing"
    assert returncode == 130, stderr
    assert stderr.strip().splitlines() == ["h5etl: interrupted; nothing was published"], stderr
    assert folder_state(folder)["files"] == PUBLISHED_V1
    assert file_sha(folder / "cells-v0001.h5") == before


def test_second_build_refuses_while_lock_is_held(project: Path) -> None:
    spec = load_spec(project)
    output = OutputFolder(spec.output_path, spec.name)
    with output.locked(), pytest.raises(LockHeld) as caught:
        build(project)
    message = str(caught.value)
    assert f"pid {os.getpid()}" in message
    assert socket.gethostname() in message
    assert "started 20" in message
    assert not release_named(spec.output_path)


def dead_holder() -> str:
    """Lock file content naming a process of this host that has exited."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    lock = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2026-01-01"}
    return json.dumps(lock)


def test_stale_lock_of_a_dead_process_is_taken_over(project: Path) -> None:
    spec = load_spec(project)
    spec.output_path.mkdir(parents=True)
    (spec.output_path / ".cells.lock").write_text(dead_holder())

    report = build(project)

    assert report.version == 1
    assert not (spec.output_path / ".cells.lock").exists()


def test_a_held_lock_that_looks_stale_is_not_taken(project: Path) -> None:
    # Two builds that both judged a dead build's lock stale: the first took it over and
    # rewrote it, the second still reads the dead pid. It must not take the lock too.
    spec = load_spec(project)
    output = OutputFolder(spec.output_path, spec.name)
    with output.locked():
        (spec.output_path / ".cells.lock").write_text(dead_holder())
        with pytest.raises(LockHeld):
            build(project)
    assert not release_named(spec.output_path)
    assert build(project).version == 1  # and once released, the next build takes it


def test_a_lock_whose_holder_lives_on_without_flock_is_respected(project: Path) -> None:
    spec = load_spec(project)
    spec.output_path.mkdir(parents=True)
    alive = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2026-01-01"}
    (spec.output_path / ".cells.lock").write_text(json.dumps(alive))  # no flock held on it
    with pytest.raises(LockHeld) as caught:
        build(project)
    assert f"pid {os.getppid()}" in str(caught.value)


def test_a_dead_flock_holder_is_taken_over_whatever_its_pid_names(project: Path) -> None:
    # A killed build's lock file names a pid that now belongs to a live process (pid reuse);
    # it used flock, so the free flock already proves it dead.
    spec = load_spec(project)
    spec.output_path.mkdir(parents=True)
    reused = {"pid": os.getppid(), "host": "elsewhere", "started": "2026-01-01", "flock": True}
    (spec.output_path / ".cells.lock").write_text(json.dumps(reused))

    assert build(project).version == 1


def test_lock_without_flock_support_falls_back_to_the_pid(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NFS mounted with nolock, some FUSE file systems: flock fails with ENOLCK
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    spec = load_spec(project)
    output = OutputFolder(spec.output_path, spec.name)
    with output.locked():
        holder = json.loads((spec.output_path / ".cells.lock").read_text())
        assert (holder["pid"], holder["flock"]) == (os.getpid(), False)
    spec.output_path.mkdir(parents=True, exist_ok=True)
    alive = {"pid": os.getppid(), "host": socket.gethostname(), "started": "2026-01-01"}
    (spec.output_path / ".cells.lock").write_text(json.dumps({**alive, "flock": True}))
    with pytest.raises(LockHeld):  # without flock, a live pid holds the lock
        build(project)
    (spec.output_path / ".cells.lock").write_text(dead_holder())
    assert build(project).version == 1  # a dead one is taken over as before
    assert not (spec.output_path / ".cells.lock").exists()


def test_builds_of_different_configs_run_side_by_side(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    configs = []
    for name in ("left", "right"):
        root = tmp_path / name
        make_raw(root, n=12)
        configs.append(write_config(root, name=name, storage={"chunk_samples": 2}))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "h5etl", "build", str(c), "-j", "1", "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in configs
    ]
    outcomes = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outcomes
    for config in configs:
        assert (config.parent / "releases" / f"{config.parent.name}.h5").is_symlink()


def test_write_error_fails_cleanly_and_keeps_previous(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build(project)
    assert first.path is not None
    before = file_sha(first.path)
    calls = 0
    original = h5etl.sink.array_writer.ArrayWriter._store

    def failing_store(self: Any, row: int, chunks: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, row, chunks)

    monkeypatch.setattr(h5etl.sink.array_writer.ArrayWriter, "_store", failing_store)
    with pytest.raises(SinkError, match="no space left on device"):
        build(project, full=True)  # decoded and written again, not carried from v1

    folder = first.path.parent
    assert folder_state(folder)["files"] == PUBLISHED_V1
    assert file_sha(first.path) == before


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(
            "cannot mount a tmpfs here; the injected-OSError test covers the disk-full path"
        )
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_real_full_disk(
    tiny_disk: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=40, sizes=((24, 24),))
    config = write_config(tmp_path, output=str(tiny_disk), storage={"compression": "none"})
    with pytest.raises((SinkError, h5etl.ReleaseError, OSError)):
        build(config)
    left = sorted(os.listdir(tiny_disk))
    assert left in ([], ["cells.status.json"])  # the status says it failed, if it had room
    if left:
        assert json.loads((tiny_disk / left[0]).read_text("utf-8"))["state"] == "failed"


def segfault_on_s003(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """A decoder that crashes its process on one sample, like a buggy native codec."""
    if any(s.key == "s003" for s in task.samples):
        os.kill(os.getpid(), signal.SIGSEGV)
    return decode.decode_batch(task, recipe)


def test_crashing_worker_rejects_only_its_sample(project: Path) -> None:
    from joblib.externals.loky.backend.reduction import cloudpickle  # what loky pickles with

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spec = load_spec(project)
    from h5etl.plan import admit, discover

    plan = admit.plan(spec, discover.find_samples(spec).samples)
    recipe = assembly.recipe_of(plan)
    cutter = tasks.TaskCutter(plan, 2)
    results = []
    for result in schedule.run_tasks(cutter, recipe, jobs=2, worker=segfault_on_s003):
        cutter.note(result)  # its deferred samples come back in a later round
        results.append(result)

    rejects = [r for res in results for r in res.rejects]
    assert {r.reason for r in rejects} == {"worker_crashed"}
    assert {r.key for r in rejects} == {"s003"}
    assert sum(r.accepted for r in results) == plan.total - 1


def test_memory_error_and_decompression_bomb_are_rejects(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    big = np.zeros((20, 20, 3), np.uint8)
    save(tmp_path / "raw" / "images" / "bomb.png", big)
    save(tmp_path / "raw" / "masks" / "bomb.png", big[..., 0])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # 20x20 = 400 > 2x the limit
    original = h5etl.inputs.raster.decode_field

    def oom(data: bytes, **kwargs: Any) -> Any:
        if kwargs["path"].endswith("s005.png"):
            raise MemoryError
        return original(data, **kwargs)

    monkeypatch.setattr(h5etl.inputs.raster, "decode_field", oom)
    report = build(project, jobs=1)
    reasons = {Path(r.path).name: r.reason for r in report.rejects}
    assert reasons["bomb.png"] == "decompression_bomb"
    assert reasons["s005.png"] == "memory_error"


def test_on_error_fail_stops_without_release(project: Path, tmp_path: Path) -> None:
    (tmp_path / "raw" / "images" / "zz_broken.png").write_bytes(b"not a png")
    (tmp_path / "raw" / "masks" / "zz_broken.png").write_bytes(b"not a png")
    spec = load_spec(project).model_copy(update={"on_error": "fail"})
    with pytest.raises(BuildFailed, match="on_error: fail"):
        h5etl.build(spec)
    assert not release_named(spec.output_path)


@pytest.mark.parametrize("limit", [pytest.param(1, id="count"), pytest.param(0.05, id="fraction")])
def test_max_rejects_fails_with_tally(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, limit: float
) -> None:
    make_raw(tmp_path, n=10, broken=["empty", "text", "mask_128"])
    config = write_config(tmp_path, max_rejects=limit)
    with pytest.raises(BuildFailed) as caught:
        build(config)
    message = str(caught.value)
    assert "over max_rejects" in message
    assert "unreadable 4" in message  # two pairs: each image and its mask
    assert not (tmp_path / "releases" / "cells.h5").exists()


def test_max_rejects_allows_a_few(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=10, broken=["empty"])
    report = build(write_config(tmp_path, max_rejects=0.2))
    assert report.version == 1


def test_hostile_names_and_links(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    images, masks = tmp_path / "raw" / "images", tmp_path / "raw" / "masks"
    rng = np.random.default_rng(1)
    names = ["a\u2215b", "line\nbreak", "line_break", "x" * 240, "tab\there", "dot.dot", "一"]
    for name in names:
        image, mask = random_pair(rng, (9, 11))
        save(images / f"{name}.png", image)
        save(masks / f"{name}.png", mask)
    one_px = np.full((1, 1, 3), 200, np.uint8)
    save(images / "onepx.png", one_px)
    save(masks / "onepx.png", np.full((1, 1), 255, np.uint8))
    os.symlink("loop_b.png", images / "loop_a.png")
    os.symlink("loop_a.png", images / "loop_b.png")
    os.symlink(images, images / "dirloop")  # a folder link back to itself: never walked
    save(masks / "loop_a.png", np.zeros((4, 4), np.uint8))

    report = build(
        write_config(
            tmp_path, sources={"image": {"glob": "**/*.png"}, "mask": {"glob": "**/*.png"}}
        )
    )

    reasons = {Path(r.path).name: r.reason for r in report.rejects}
    assert reasons["loop_a.png"] == "symlink_loop"
    assert reasons["loop_b.png"] == "orphan"
    assert report.path is not None
    with h5py.File(report.path) as handle:
        stored = {n.decode() for s in ("train", "valid") for n in handle[s]["filename"][...]}
        renamed = list(handle["diagnostics"].attrs["renamed_keys"])
    assert {f"{n}.png" for n in names} | {"onepx.png"} <= stored
    assert any("line_break~2" in r for r in renamed), renamed


def test_reader_keeps_old_release_while_link_swaps(project: Path) -> None:
    first = build(project)
    link = project.parent / "releases" / "cells.h5"
    with h5py.File(link, "r") as old:
        before = old["train/image"][...]
        second = build(project, full=True)  # the same inputs: else up to date
        assert np.array_equal(old["train/image"][...], before)
        assert int(old.attrs["version"]) == 1
    with h5py.File(link, "r") as new:
        assert int(new.attrs["version"]) == 2
    assert first.version == 1
    assert second.version == 2


@pytest.mark.parametrize("came_out_as", [None, SystemError], ids=["swallowed", "SystemError"])
def test_a_ctrl_c_lost_or_turned_into_another_error_still_stops_the_build_before_it_publishes(
    project: Path, monkeypatch: pytest.MonkeyPatch, came_out_as: type[Exception] | None
) -> None:
    """A SIGINT raised inside a weakref callback is printed as "Exception ignored" and lost;
    the handler records it too, and the build raises it again before it publishes. CI: one
    that landed in h5py's attribute iteration came out as ``SystemError`` (its lock's
    ``__exit__``): the build printed a traceback and exit 1, not 130."""
    from h5etl.pipeline import interrupts

    build(project)
    folder = project.parent / "releases"
    before = file_sha(folder / "cells-v0001.h5")

    def hook(stage: str, advance: int, total: int | None) -> None:
        if stage == "decode+write" and advance:
            monkeypatch.setattr(interrupts, "_requested", True)  # as the handler leaves it
            if came_out_as is not None:
                raise came_out_as("FastRLock.__exit__ returned a result with an exception set")

    with pytest.raises(KeyboardInterrupt) as caught, interrupts.catching():
        build(project, jobs=1, full=True, progress=hook)
    if came_out_as is not None:
        assert isinstance(caught.value.__cause__, came_out_as)
    assert folder_state(folder)["files"] == PUBLISHED_V1
    assert file_sha(folder / "cells-v0001.h5") == before
    assert not interrupts._requested  # reset once the build is left
    status = json.loads((folder / "cells.status.json").read_text())
    assert status["state"] == "interrupted", status
    with pytest.raises(SystemError), interrupts.catching():  # without a Ctrl-C: our bug, shown
        raise SystemError("a real one")


def test_a_swallowed_ctrl_c_prints_no_traceback_and_other_lost_errors_still_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one line a Ctrl-C gets is the CLI's: the "Exception ignored" traceback of a
    KeyboardInterrupt lost in a weakref callback is not printed (``check`` raises it
    again); any other exception lost that way still is."""
    import weakref

    from h5etl.pipeline import interrupts

    class Thing:
        pass

    def lose(error: BaseException) -> None:
        def callback(_: object) -> None:
            raise error

        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs here; what it raises is "ignored"
        assert ref() is None

    printed: list[BaseException | None] = []  # what the hook before the build's is given
    monkeypatch.setattr(sys, "unraisablehook", lambda info: printed.append(info.exc_value))
    with interrupts.catching():
        with pytest.raises(KeyboardInterrupt):  # the handler records the request and raises
            interrupts._handler(signal.SIGINT, None)
        lose(KeyboardInterrupt())
        lose(ValueError("a real lost error"))
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    assert [type(e) for e in printed] == [ValueError]
    lose(KeyboardInterrupt())  # outside a build: printed as Python would
    assert [type(e) for e in printed] == [ValueError, KeyboardInterrupt]
