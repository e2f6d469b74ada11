"""The sink hands the page cache back what its syncs made durable (``sink_disk``):
advice to the kernel only, so the release is the same file byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig

import h5etl
from h5etl import reproducible, sink_disk

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
    monkeypatch.setenv(reproducible.ENV, EPOCH)
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
