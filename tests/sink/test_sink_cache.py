"""The sink hands the page cache back what its syncs made durable (``sink_disk``):
advice to the kernel only, so the release is the same file byte for byte."""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig

import h5etl
from h5etl.history import clock
from h5etl.sink import disk as sink_disk

EPOCH = "1700000000"


def _build(config: Path, **kwargs: object) -> bytes:
    report = h5etl.build(h5etl.load_spec(config), full=True, **kwargs)  # type: ignore[arg-type]
    assert report.path is not None
    return report.path.read_bytes()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux's")
def test_durable_pages_are_dropped_and_the_file_is_unchanged(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = []
    for name in ("plain", "dropping"):  # the same project twice: each its first release
        make_raw(tmp_path / name, n=20, broken=["truncated"])
        configs.append(write_config(tmp_path / name, storage={"chunk_samples": 2}))
    monkeypatch.setenv(clock.ENV, EPOCH)
    plain = _build(configs[0], jobs=1)  # no checkpoint before the end: nothing dropped

    advised: list[tuple[int, int, int]] = []
    fadvise = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((offset, length, advice))
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(sink_disk, "CACHE_KEEP_BYTES", 0)
    monkeypatch.setattr(os, "posix_fadvise", spy)
    dropping = _build(configs[1], jobs=1, checkpoint_seconds=0)  # a sync after every task

    assert dropping == plain
    assert advised, "no sync handed pages back"
    assert {advice for _, _, advice in advised} == {os.POSIX_FADV_DONTNEED}
    assert all(offset == 0 and length > 0 for offset, length, _ in advised)
    lengths = [length for _, length, _ in advised]
    assert lengths == sorted(lengths)  # each sync covers the file as it has grown
    assert max(lengths) <= len(plain)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_written_bytes_start_to_reach_the_disk_before_the_end_and_the_file_is_unchanged(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = []
    for name in ("plain", "written_back"):
        make_raw(tmp_path / name, n=20, broken=["truncated"])
        configs.append(write_config(tmp_path / name, storage={"chunk_samples": 2}))
    monkeypatch.setenv(clock.ENV, EPOCH)
    plain = _build(configs[0], jobs=1)

    ranges: list[tuple[int, int]] = []
    original = sink_disk.start_writeback

    def spy(path: Path, start: int) -> int:
        end = original(path, start)
        ranges.append((start, end))
        return end

    monkeypatch.setattr(sink_disk, "WRITEBACK_BYTES", 1)  # after every batch
    monkeypatch.setattr(sink_disk, "start_writeback", spy)
    real_note = sink_disk.Writeback.note

    def note_when_done(self: sink_disk.Writeback, nbytes: int) -> None:
        # one writeback per batch: on a loaded machine the first one's thread could still
        # run through every later batch (each skips while one runs), leaving one range
        self.wait()
        real_note(self, nbytes)

    monkeypatch.setattr(sink_disk.Writeback, "note", note_when_done)
    written_back = _build(configs[1], jobs=1)

    assert written_back == plain
    assert len(ranges) > 1
    # each writeback starts where the one before ended, and none reaches past the file; a
    # build whose decoding rejected a sample writes its file a second time (the splits are
    # settled on the samples stored), whose writebacks start at 0 again
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] or b[0] == 0 for a, b in itertools.pairwise(ranges)), ranges
    assert all(start <= end <= len(plain) for start, end in ranges)


def test_a_writeback_of_a_file_that_is_gone_is_no_error(tmp_path: Path) -> None:
    assert sink_disk.start_writeback(tmp_path / "gone.h5", 42) == 42


def test_one_thread_starts_every_writeback_of_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "release.h5"
    starts: list[int] = []
    original = sink_disk.start_writeback

    def spy(where: Path, start: int) -> int:
        starts.append(start)
        return original(where, start)

    monkeypatch.setattr(sink_disk, "WRITEBACK_BYTES", 10)
    monkeypatch.setattr(sink_disk, "start_writeback", spy)
    writeback = sink_disk.Writeback(path)

    def threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "h5etl-writeback"]

    with path.open("wb") as file:
        for _ in range(5):
            file.write(b"x" * 10)
            file.flush()
            writeback.note(10)
            writeback.wait()
            assert len(threads()) == 1
    writeback.close()
    assert threads() == []
    assert starts == [0, 10, 20, 30, 40]  # each where the one before ended
