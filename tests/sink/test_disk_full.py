"""A disk that fills up during a build: one line, exit 1, temp files gone, nothing published.

Each build runs through the real CLI (``python -m h5etl build``) in a child process, onto a
small tmpfs mounted for the test, from a folder with decode-time rejects (files truncated near
their end, masks with a stray value): rejects once sent the writer down the re-chunk path,
where the write failed, and then ``File.close()`` failed again with a traceback. Where no tmpfs
can be mounted (not root), the child instead gets a file-size limit (``RLIMIT_FSIZE``, with
SIGXFSZ ignored), which makes the same writes fail for real with EFBIG. A launcher can fill
the disk at a chosen moment (the finish, its final flush, the close, the journal, a
checkpoint), so each place a write can first fail is tried.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import _make_raw, base_config, merge, random_pair, save

from h5etl.config.load import load_spec
from h5etl.config.spec import Spec
from h5etl.errors import ReleaseError, SinkError
from h5etl.format.journal import JournalWriter
from h5etl.pipeline.run import build
from h5etl.release import durable

MIB = 2**20
SIDE = 256  # 256 KiB of noise per pair: 88 pairs make a release of about 22 MiB
PAIRS = 88
LATE = ("s007", "s021", "s040", "s066")  # truncated near their end: caught only at decode
MASK_128 = ("s013", "s052")  # one mask pixel of 128: caught only at decode
SMALL_GLOB = "s00[0-3].png"  # the previous release: 4 pairs, about 1 MiB
# What the child's build fails with, on each medium.
NO_ROOM = {"tmpfs": "no space left on device", "rlimit": "file too large"}

LAUNCHER = textwrap.dedent(
    """
    import os, resource, runpy, signal, sys

    import h5py
    from h5etl.pipeline import run as pipeline
    from h5etl.sink import writer as sink
    from h5etl.format import journal

    stage = os.environ["H5ETL_TEST_FILL"]
    medium = os.environ["H5ETL_TEST_MEDIUM"]
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]


    def fill():
        if medium == "rlimit":
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
            return
        with open(os.path.join(os.environ["H5ETL_TEST_DISK"], "ballast-late"), "ab", 0) as out:
            size = 1 << 20
            while size:  # down to the last byte, so that no write needing a block succeeds
                try:
                    out.write(bytes(size))
                except OSError:
                    size //= 2


    def before(owner, name, test=lambda *args: True):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if test(*args):
                fill()
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)


    if stage == "start":
        fill()
    elif stage == "finish":
        before(sink.Sink, "finish")
    elif stage == "flush":  # the flush at the end of finish, after its own room check
        finish = sink.Sink.finish

        def finish_then_fill_at_flush(*args, **kwargs):
            before(h5py.File, "flush")
            return finish(*args, **kwargs)

        sink.Sink.finish = finish_then_fill_at_flush
    elif stage == "close":
        before(h5py.File, "close", lambda f: f.id.valid and ".partial-" in f.filename)
    elif stage == "journal":
        before(journal.JournalWriter, "__init__")
    elif stage == "checkpoint":
        pipeline.build.__kwdefaults__["checkpoint_seconds"] = 0.0  # one after every batch
        before(sink.Sink, "checkpoint")
    sys.argv = ["h5etl", *sys.argv[1:]]
    runpy.run_module("h5etl", run_name="__main__", alter_sys=True)
    """
)


def _can_mount() -> bool:
    if os.environ.get("H5ETL_TEST_NO_MOUNT"):  # to try the fallback on a machine that mounts
        return False
    return os.geteuid() == 0 and shutil.which("mount") is not None


@dataclass
class Disk:
    """The output folder's file system: a tmpfs of ``size`` bytes, or a file-size limit."""

    root: Path
    medium: str
    size: int

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    def leave_free(self, nbytes: int) -> None:
        """Fill the disk with a ballast file until ``nbytes`` stay free (tmpfs only)."""
        if self.medium == "tmpfs":
            free = shutil.disk_usage(self.root).free
            (self.root / "ballast").write_bytes(bytes(max(free - nbytes, 0)))


@pytest.fixture
def make_disk(tmp_path: Path) -> Iterator[Callable[[str, int], Disk]]:
    """Factory: ``make_disk(medium, size)``; a tmpfs is unmounted at the end, whatever happens."""
    mounted: list[Path] = []

    def make(medium: str, size: int) -> Disk:
        root = tmp_path / f"disk{len(mounted)}-{medium}"
        root.mkdir()
        if medium == "tmpfs":
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, f"mount failed: {done.stderr.strip()}"
            mounted.append(root)
        return Disk(root, medium, size)

    try:
        yield make
    finally:
        for root in mounted:
            if subprocess.run(["umount", str(root)], check=False).returncode:
                subprocess.run(["umount", "-l", str(root)], check=False)


# The medium of the stage tests: a real full disk where this machine can mount one.
MEDIUM = "tmpfs" if _can_mount() else "rlimit"


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """88 pairs of 256x256 noise, six of them rejected only at decode."""
    root = tmp_path_factory.mktemp("messy")
    folder = _make_raw(root, n=PAIRS, sizes=[(SIDE, SIDE)])
    rng = np.random.default_rng(7)
    for key in LATE:
        path = folder.image(key)
        path.write_bytes(path.read_bytes()[:-40])
    for key in MASK_128:
        image, mask = random_pair(rng, (SIDE, SIDE))
        mask[1, 1] = 128
        save(folder.image(key), image)
        save(folder.mask(key), mask)
    return folder.root / "raw"


def _config(folder: Path, raw: Path, output: Path, glob: str = "*.png") -> Path:
    data = merge(
        base_config(),
        {
            "output": str(output),
            "sources": {
                "image": {"dir": str(raw / "images"), "glob": glob},
                "mask": {"dir": str(raw / "masks"), "glob": glob},
            },
            "fields": {"image": {"shape": [3, SIDE, SIDE]}, "mask": {"shape": [1, SIDE, SIDE]}},
        },
    )
    path = folder / f"config-{glob.replace('*', 'all').replace('[', '').replace(']', '')}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory, raw: Path) -> Path:
    """A folder holding the previous release (v0001, 4 pairs), its report and the link."""
    root = tmp_path_factory.mktemp("previous")
    done = _cli(_config(root, raw, root / "releases", SMALL_GLOB))
    assert done.returncode == 0, done.stderr
    return root / "releases"


def _cli(
    config: Path, *, fill_at: str | None = None, disk: Disk | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m h5etl build CONFIG`` in a child; ``fill_at`` runs it through the launcher.

    On the ``rlimit`` medium the child starts under a 10 MiB file-size limit, or with none if
    the launcher is to set one.
    """
    args = ["build", str(config), "--quiet", "--jobs", "2"]
    command = [sys.executable, "-m", "h5etl", *args]
    env = dict(os.environ)
    if fill_at is not None:
        command = [sys.executable, "-c", LAUNCHER, *args]
        assert disk is not None
        env.update(H5ETL_TEST_FILL=fill_at, H5ETL_TEST_DISK=str(disk.root))
        env.update(H5ETL_TEST_MEDIUM=disk.medium)
    limit = 10 * MIB if fill_at is None else resource.RLIM_INFINITY

    def file_size_limit() -> None:  # in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        below = hard == resource.RLIM_INFINITY or 0 <= limit <= hard
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit if below else hard, hard))

    rlimit = disk is not None and disk.medium == "rlimit"
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        preexec_fn=file_size_limit if rlimit else None,
    )


def _snapshot(folder: Path) -> dict[str, str]:
    """Every name in ``folder``: a link's target, a file's SHA-256."""
    out = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.endswith(".status.json"):
            continue  # the build status: it records each build's outcome (see _fail_build)
        if entry.is_symlink():
            out[entry.name] = "-> " + os.readlink(entry)
        else:
            out[entry.name] = hashlib.sha256(entry.read_bytes()).hexdigest()
    return out


def _fail_build(
    disk: Disk, raw: Path, previous: Path, tmp_path: Path, fill_at: str | None = None
) -> None:
    """Build the 22 MiB release onto ``disk`` beside the previous one; it must fail cleanly."""
    shutil.copytree(previous, disk.releases, symlinks=True)
    before = _snapshot(disk.releases)
    earlier = (disk.releases / "cells.status.json").read_text("utf-8")
    done = _cli(_config(tmp_path, raw, disk.releases), fill_at=fill_at, disk=disk)

    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback, no "Exception ignored", no HDF5 dump
    (line,) = lines
    assert line.startswith(f"h5etl: error: {disk.releases}"), line  # names the file
    assert NO_ROOM[disk.medium] in line, line
    assert _snapshot(disk.releases) == before  # no temp file or journal left, link unmoved
    # the build status says how it ended, is gone if even that could not be written, or is
    # the previous build's if this one stopped before its lock (its first write)
    status = disk.releases / "cells.status.json"
    if status.exists() and status.read_text("utf-8") != earlier:
        ended = json.loads(status.read_text("utf-8"))
        assert ended["state"] == "failed"
        assert ended["result"]["error"] == line.removeprefix("h5etl: error: ")


def test_a_disk_that_fills_while_writing(
    make_disk: Callable[[str, int], Disk], raw: Path, previous: Path, tmp_path: Path
) -> None:
    # 20 MiB, 10 MiB of it free: the 22 MiB release fails part-way, after decode-time rejects
    disk = make_disk(MEDIUM, 20 * MIB)
    disk.leave_free(10 * MIB)
    _fail_build(disk, raw, previous, tmp_path)


def test_a_file_size_limit_while_writing(
    make_disk: Callable[[str, int], Disk], raw: Path, previous: Path, tmp_path: Path
) -> None:
    # EFBIG, the other way a write runs out of room (FAT32, ``ulimit -f``), on any machine
    _fail_build(make_disk("rlimit", 0), raw, previous, tmp_path)


def test_a_disk_already_full(
    make_disk: Callable[[str, int], Disk], raw: Path, previous: Path, tmp_path: Path
) -> None:
    # the first write of a build is the lock file's: on a full disk it failed with a traceback
    _fail_build(make_disk(MEDIUM, 20 * MIB), raw, previous, tmp_path, fill_at="start")


@pytest.mark.parametrize("stage", ["finish", "flush", "close", "journal", "checkpoint"])
def test_a_disk_that_fills_at(
    stage: str,
    make_disk: Callable[[str, int], Disk],
    raw: Path,
    previous: Path,
    tmp_path: Path,
) -> None:
    # room for the whole release, until the disk fills just before that step
    _fail_build(make_disk(MEDIUM, 64 * MIB), raw, previous, tmp_path, fill_at=stage)


JOURNAL_CHILD = textwrap.dedent(
    """
    import os, resource, signal, sys
    from pathlib import Path

    from h5etl.errors import SinkError
    from h5etl.format.journal import JournalWriter

    path = sys.argv[1]
    journal = JournalWriter(Path(path), config_sha256="c", plan_sha256="p")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path), hard))
    try:
        journal.checkpoint({"lineage": {"train": [["0" * 64] * 2] * 100}})
    except SinkError as exc:
        print("raised", exc)
    journal.close()
    print("closed")
    """
)


def test_a_journal_write_that_fails_is_one_error(tmp_path: Path) -> None:
    # the buffered journal wrote its failed line again in close(): a second OSError, raw,
    # hid the first. A file-size limit makes the append fail for real, in a child process.
    path = tmp_path / "j.journal"
    done = subprocess.run(
        [sys.executable, "-c", JOURNAL_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"raised {path}: writing the resume journal failed: file too large; "
        "the file system or `ulimit -f` caps the file size; write the release elsewhere",
        "closed",
    ]
    # and /dev/full fails every write with ENOSPC: the header already
    with pytest.raises(SinkError, match="/dev/full: writing the resume journal failed: no space"):
        JournalWriter(Path("/dev/full"), config_sha256="c", plan_sha256="p")


def _published(spec: Spec) -> dict[str, str]:
    return _snapshot(spec.output_path)


@pytest.mark.parametrize("fails", ["symlink", "fsync_after_link"])
def test_a_publish_that_fails_takes_its_names_back(
    fails: str, tmp_path: Path, raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the link's new target (and the new report) stayed under release names when the disk
    # filled between naming the release and moving the link
    spec = load_spec(_config(tmp_path, raw, tmp_path / "releases", SMALL_GLOB))
    build(spec)
    before = _published(spec)
    no_room = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if fails == "symlink":

        def symlink(*args: object, **kwargs: object) -> None:
            raise no_room

        monkeypatch.setattr(os, "symlink", symlink)
    else:
        real = durable.fsync_dir

        def fsync_dir(folder: Path) -> None:
            real(folder)
            if (spec.output_path / f"{spec.name}.h5").resolve().name.endswith("v0002.h5"):
                raise no_room

        monkeypatch.setattr(durable, "fsync_dir", fsync_dir)
    with pytest.raises(ReleaseError, match="publishing failed: no space left on device"):
        build(spec, full=True)  # the same inputs: else up to date, nothing to publish
    monkeypatch.undo()
    assert _published(spec) == before
