"""prefetch: an iterator pulled by a thread, a few items ahead; and the builds that use it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, dataset_digests, random_pair, save

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.execute import assembly
from h5etl.execute.prefetch import Ahead


def test_items_come_out_in_order_and_the_thread_ends() -> None:
    with Ahead(iter(range(50)), depth=3) as ahead:
        assert list(ahead) == list(range(50))
        assert list(ahead) == []  # exhausted stays exhausted


def test_nothing_is_pulled_before_the_start_event_and_a_consumer_can_give_up_first() -> None:
    pulled: list[int] = []

    def source() -> Iterator[int]:
        for i in range(3):
            pulled.append(i)
            yield i

    start = threading.Event()
    with Ahead(source(), start=start) as ahead:
        time.sleep(0.2)
        assert pulled == []  # the thread waits for the event
        start.set()
        assert list(ahead) == [0, 1, 2]
    never = threading.Event()
    with Ahead(source(), start=never):
        pass  # leaving while the thread waits stops it (the exit joins it)
    assert pulled == [0, 1, 2]


def test_an_error_in_the_source_comes_out_of_next_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("broken task")

    with Ahead(source()) as ahead:
        assert next(ahead) == 1
        assert next(ahead) == 2
        with pytest.raises(ValueError, match="broken task"):
            next(ahead)


def test_it_stays_at_most_depth_items_ahead_and_closing_closes_the_source() -> None:
    pulled: list[int] = []
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            for i in range(1000):
                pulled.append(i)
                yield i
        finally:
            closed.set()  # a decoder cancels its pending tasks here

    ahead = Ahead(source(), depth=2)
    assert next(ahead) == 0
    ahead.close()
    assert closed.wait(5)
    # one consumed, two queued, one waiting to be queued: no more were pulled
    assert len(pulled) <= 4


def add(root: Path, keys: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for key in keys:
        image, mask = random_pair(rng, (9, 11))
        save(root / "raw" / "images" / f"{key}.png", image)
        save(root / "raw" / "masks" / f"{key}.png", mask)


def test_an_incremental_build_decoding_beside_the_copy_is_the_same_at_any_jobs(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # -j2 with blocks to copy: the workers decode while the writer copies (a thread pulls
    # their results); the same release as -j1, which decodes after copying
    pulled: list[int] = []

    class Counted(Ahead[object]):
        def __init__(
            self, source: Iterator[object], depth: int = 2, *, start: threading.Event | None = None
        ):
            pulled.append(depth)
            super().__init__(source, depth, start=start)

    monkeypatch.setattr(assembly, "Ahead", Counted)
    folders = []
    for jobs in (1, 2):
        root = tmp_path / f"j{jobs}"
        make_raw(root, n=30)
        config = write_config(root, storage={"chunk_samples": 4})
        build(load_spec(config), jobs=jobs)
        # a first build in worker processes pulls ahead too: they start before the file exists
        assert len(pulled) == jobs - 1
        pulled.clear()
        add(root, [f"new{i:02d}" for i in range(9)], seed=3)
        (root / "raw" / "images" / "s007.png").unlink()
        (root / "raw" / "masks" / "s007.png").unlink()
        report = build(load_spec(config), jobs=jobs)
        assert len(pulled) == jobs - 1  # only -j2 pulls ahead (-j1 decodes in this process)
        assert report.path is not None
        assert 0 < report.reused < 38
        assert check_release(report.path, deep=True).ok
        folders.append(report.path)
    assert dataset_digests(folders[0]) == dataset_digests(folders[1])
