"""Files that change after the folder was listed, and steps that fail in ways nobody planned:
each is a reject of its own sample, never a hang or a crash of the build.

A FIFO swapped in for an image between planning and decoding blocked ``open()`` in a decode
worker (and in the header probe of a dry run) until someone wrote to it: the build hung.
The swap is made from the build's progress hook, which the pipeline calls as each stage
opens; every build runs in a thread with a deadline, and a build that blocks is released by
writing to the FIFO, so a regression fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, read_release

from h5etl.config.load import load_spec
from h5etl.dataflow import Reject
from h5etl.errors import RejectError
from h5etl.history.build_report import BuildReport
from h5etl.inputs import opening as inputs
from h5etl.inputs import pixels
from h5etl.inputs import raster as images
from h5etl.kinds import mask_values
from h5etl.pipeline.run import build

T = TypeVar("T")
DEADLINE = 60.0  # seconds; a healthy build of these folders takes well under one
SWAPPED = "s002"


def _release_blocked_reader(fifo: Path) -> None:
    """Open the FIFO for writing and close it: a reader blocked in open() then reads EOF."""
    with contextlib.suppress(OSError):  # ENXIO: nobody is waiting on it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _run_with_deadline(fifo: Path, run: Callable[[], T]) -> T:
    """``run()`` in a thread; fail if it is still running after ``DEADLINE`` seconds."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["report"] = run()
        except BaseException as exc:  # handed to the test's thread below
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    blocked = thread.is_alive()
    while thread.is_alive():  # let it finish, so that no worker stays stuck on the FIFO
        _release_blocked_reader(fifo)
        thread.join(0.5)
    assert not blocked, f"blocked on the FIFO {fifo} for {DEADLINE:.0f} s"
    if "error" in outcome:
        raise outcome["error"]
    result: T = outcome["report"]
    return result


def _swap_for_fifo_when(stage: str, path: Path) -> Callable[[str, int, int | None], None]:
    """A progress hook that replaces ``path`` by a FIFO as ``stage`` opens."""

    def hook(name: str, advance: int, total: int | None) -> None:
        if name == stage and advance == 0 and not path.is_fifo():
            path.unlink()
            os.mkfifo(path)

    return hook


def _by_reason(report: BuildReport) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for reject in report.rejects:
        out.setdefault(reject.reason, set()).add(Path(reject.path).name)
    return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_file_swapped_for_a_fifo_before_decoding_is_a_reject(
    jobs: int, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    spec = load_spec(write_config(tmp_path))
    fifo = raw.image(SWAPPED)
    hook = _swap_for_fifo_when("decode+write", fifo)

    report = _run_with_deadline(fifo, lambda: build(spec, jobs=jobs, progress=hook))

    rejected = [r for r in report.rejects if r.key == SWAPPED]
    assert {Path(r.path) for r in rejected} == {fifo, raw.mask(SWAPPED)}  # with its partner
    assert {r.reason for r in rejected} == {"not_a_file"}
    (own,) = (r for r in rejected if Path(r.path) == fifo)
    assert own.stage == "decode"
    assert "named pipe (FIFO)" in own.detail
    assert sum(report.samples.values()) == 5  # the build went on and published the rest
    assert report.path is not None
    assert report.path.is_file()


def test_a_file_swapped_for_a_fifo_before_the_header_probe_is_a_reject(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a dry run probes headers: Image.open(path) blocked on the FIFO the same way
    raw = make_raw(tmp_path, n=6)
    spec = load_spec(write_config(tmp_path))
    fifo = raw.image(SWAPPED)
    hook = _swap_for_fifo_when("probe", fifo)

    report = _run_with_deadline(fifo, lambda: build(spec, dry_run=True, progress=hook))

    assert _by_reason(report) == {"not_a_file": {f"{SWAPPED}.png"}}
    assert {r.key for r in report.rejects} == {SWAPPED}
    assert sum(report.samples.values()) == 5


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_reading_a_file_that_is_not_regular_is_a_reject(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "odd.png"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    for step in (images.probe, inputs.read_file):
        with pytest.raises(RejectError) as got:
            _run_with_deadline(path, functools.partial(step, str(path)))
        assert got.value.reason == "not_a_file", step
        assert got.value.path == str(path)


@pytest.mark.parametrize("size", [0, 1, 70_000, 300_000])
def test_a_file_is_read_whole_even_when_it_grew_after_its_fstat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    # read_file reads with plain system calls, sized by the fstat of what it opened: bytes
    # written after that fstat (a file still being copied in) are read too, not cut off
    path = tmp_path / "growing.png"
    data = np.random.default_rng(size).bytes(size)
    path.write_bytes(data)
    assert inputs.read_file(str(path)) == data
    real = os.fstat

    def stale(fd: int) -> os.stat_result:
        info = real(fd)
        return os.stat_result((info.st_mode, *info[1:6], info.st_size // 3, *info[7:]))

    monkeypatch.setattr(os, "fstat", stale)
    assert inputs.read_file(str(path)) == data
    missing = tmp_path / "gone.png"
    with pytest.raises(RejectError) as got:
        inputs.read_file(str(missing))
    assert got.value.reason == "unreadable"


class _Hostile(Exception):
    """What no step of decoding expects: a library's own error for a crafted file."""


def _one_sample_rejected(report: BuildReport, key: str) -> list[Reject]:
    rejected = [r for r in report.rejects if r.key == key]
    assert rejected, f"{key} was not rejected"
    assert {r.reason for r in rejected} == {"decode_error"}
    assert all(f"{__name__}._Hostile: crafted input" in r.detail for r in rejected)
    return rejected


def test_a_resize_that_raises_rejects_only_its_sample(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pillow's resize ran outside the decoder's catch-all: its error ended the whole build
    make_raw(tmp_path, n=4, broken={"big1": "oversize", "big2": "oversize"})
    spec = load_spec(write_config(tmp_path, pad={"oversize": "resize"}))
    real, calls = pixels.resize_to, []

    def resize(array: np.ndarray, size: tuple[int, int], filter: Any) -> np.ndarray:
        calls.append(array.shape)
        if len(calls) == 1:  # the first oversize image only
            raise _Hostile("crafted input")
        return real(array, size, filter)

    monkeypatch.setattr(pixels, "resize_to", resize)

    report = build(spec, jobs=1)

    (key,) = {r.key for r in report.rejects}
    assert key in {"big1", "big2"}
    rejected = _one_sample_rejected(report, key)
    assert len(rejected) == 2  # the image and its mask, once each
    assert {r.stage for r in rejected} == {"decode"}
    assert all(r.detail.startswith("cannot resize") for r in rejected)
    assert sum(report.samples.values()) == 5  # the other one was resized and stored
    assert report.path is not None
    stored = read_release(report.path)
    assert sum(len(v) for k, v in stored.items() if k.endswith("/image")) == 5


def test_a_mask_check_that_raises_rejects_only_its_sample(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # validate.check_mask ran outside the decoder's catch-all as well
    raw = make_raw(tmp_path, n=5)
    spec = load_spec(write_config(tmp_path))
    victim = str(raw.mask("s001"))
    real = mask_values.check_mask

    def check_mask(mask: np.ndarray, values: tuple[int, ...], *, path: str) -> np.ndarray:
        if path == victim:
            raise _Hostile("crafted input")
        return real(mask, values, path=path)

    monkeypatch.setattr(mask_values, "check_mask", check_mask)

    report = build(spec, jobs=1)

    rejected = _one_sample_rejected(report, "s001")
    own = [r for r in rejected if r.path == victim]
    assert len(own) == 1
    assert own[0].detail.startswith("cannot check the mask")
    assert sum(report.samples.values()) == 4
    assert report.path is not None
    assert report.path.is_file()
