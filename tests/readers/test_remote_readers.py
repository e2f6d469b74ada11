"""Readers over object storage: releases built by h5etl, published to the test S3 server (moto,
a real process on localhost) and read back by every reader through the pointer.

Every test compares what a remote reader yields with the same release read locally by h5py.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

import h5py
import numpy as np
import pytest
import yaml
from s3_server import Bucket
from test_kind_series import LENGTHS, make_recordings, series_config
from test_kind_series import build as build_series
from test_kind_volume import build as build_volume
from test_kind_volume import ct_config, make_ct
from test_readers import FIELDS, build_release, direct

import h5etl
from h5etl.readers import ReaderError, Release, _source, iter_batches
from h5etl.readers.series import SeriesReader
from h5etl.readers.volumes import SliceSampler, Volumes
from h5etl.remote import publish, reading, stat_object
from h5etl.remote.cache import DiskCache
from h5etl.remote.errors import RemoteReadFailed
from h5etl.remote.reading import RemoteFile


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release of 22 samples in chunks of 4, Blosc (decoded outside HDF5); the real file."""
    return build_release(tmp_path_factory.mktemp("remote"), 22, compression="blosc").resolve()


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same samples written with ``storage.page_size`` (HDF5's paged file space)."""
    root = tmp_path_factory.mktemp("paged")
    build_release(root, 22, compression="blosc")
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["storage"]["page_size"] = 64 * 1024
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(root / "config.yaml"), jobs=1)
    assert report.path is not None
    return report.path


def url(bucket: Bucket, key: str = "releases/cells.h5") -> str:
    return f"s3://{bucket.name}/{key}"


def assert_same(got: dict[str, Any], truth: dict[str, Any], rows: np.ndarray) -> None:
    for field in FIELDS:
        np.testing.assert_array_equal(got[field], truth[field][rows])
    assert [str(n) for n in got["filename"]] == [truth["filename"][r] for r in rows]


def test_release_reads_a_published_release_as_the_local_file(s3: Bucket, built: Path) -> None:
    publish.publish(built, s3.location("releases"), "cells")
    truth = direct(built)
    reader = Release(url(s3), "train", batch_size=4)
    assert reader.path == url(s3, "releases/cells-v0001.h5")  # the pointer, resolved
    assert reader.source.sha256 == hashlib.sha256(built.read_bytes()).hexdigest()
    rows = np.arange(len(reader))[::-1]
    assert_same(reader.read(rows), truth, rows)
    assert reader._stores  # the Blosc chunks decoded outside HDF5, from range reads
    batches = list(iter_batches(url(s3), "train", 5, shuffle=False))
    assert_same({k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, truth, rows[::-1])
    reader.close()


def test_a_reader_stays_on_its_version_while_another_is_published(
    s3: Bucket, built: Path, tmp_path: Path
) -> None:
    output = s3.location("releases")
    publish.publish(built, output, "cells")
    first = Release(url(s3), "train")  # the pointer read once: version 1, pinned
    other = build_release(tmp_path, 9, prefix="t").resolve()  # other samples
    publish.publish(other, output, "cells")

    rows = np.arange(len(first))
    assert len(first) == 22
    assert_same(first.read(rows), direct(built), rows)
    second = Release(url(s3), "train")
    assert second.path == url(s3, "releases/cells-v0002.h5")
    assert_same(second.read(np.arange(9)), direct(other), np.arange(9))
    first.close()
    second.close()


def test_torch_dataloader_workers_read_through_their_own_handles(
    s3: Bucket, built: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    publish.publish(built, s3.location("releases"), "cells")
    truth = direct(built)
    dataset = H5Dataset(url(s3), "train", batch_size=4, cache_dir=tmp_path / "cache")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=dataset.batch_sampler(4, shuffle=True, seed=1),
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda samples: samples,
    )
    seen = []
    for batch in loader:
        for sample in batch:
            row = truth["row"][str(sample["filename"])]
            for field in FIELDS:
                np.testing.assert_array_equal(sample[field], truth[field][row])
            seen.append(row)
    assert sorted(seen) == list(range(22))
    assert any((tmp_path / "cache").rglob("*-0"))  # the workers filled the shared disk cache


def test_keras_volume_and_series_readers_open_a_url(
    s3: Bucket, built: Path, tmp_path: Path
) -> None:
    pytest.importorskip("keras")
    from h5etl.readers import KerasDataset

    publish.publish(built, s3.location("releases"), "cells")
    truth = direct(built)
    keras = KerasDataset(url(s3), "train", x="image", y="mask", batch_size=8, shuffle=False)
    got = np.concatenate([np.asarray(keras[i][0]) for i in range(len(keras))])
    np.testing.assert_array_equal(got, truth["image"])

    cases = make_ct(tmp_path, cases=2, seed=4)
    volume = build_volume(ct_config(tmp_path, splits={"train": 1.0}), jobs=1).path
    assert volume is not None
    publish.publish(volume, s3.location("volumes"), "ct")
    with Volumes(url(s3, "volumes/ct.h5"), "train", "ct", mask="mask") as remote:
        assert len(remote) == 2
        expected = {c["uid"]: c for c in cases.values()}
        for case in remote:
            np.testing.assert_array_equal(case["image"], expected[case["series_uid"]]["ct"])
            np.testing.assert_array_equal(case["mask"], expected[case["series_uid"]]["mask"])
    slices = SliceSampler(url(s3, "volumes/ct.h5"), "train", "ct", shuffle=False)
    assert sum(1 for _ in slices) == sum(len(c["ct"]) for c in cases.values())

    make_recordings(tmp_path / "series", LENGTHS)
    recorded = build_series(series_config(tmp_path / "series"), jobs=1).path
    assert recorded is not None
    publish.publish(recorded, s3.location("series"), "rec")
    local, remote_series = SeriesReader(recorded), SeriesReader(url(s3, "series/rec.h5"))
    assert len(remote_series) == len(local)
    for index in range(len(local)):
        want, have = local[index], remote_series[index]
        assert want.keys() == have.keys()
        for key in want:
            np.testing.assert_array_equal(have[key], want[key])


def test_a_paged_release_reads_as_the_default_one(s3: Bucket, built: Path, paged: Path) -> None:
    publish.publish(paged, s3.location("releases"), "cells")
    reader = Release(url(s3), "train")
    with reader.source.open() as handle:  # what the sink wrote: HDF5's paged file space
        plist = handle.id.get_create_plist()
        assert plist.get_file_space_strategy()[0] == h5py.h5f.FSPACE_STRATEGY_PAGE
        assert plist.get_file_space_page_size() == 64 * 1024
    rows = np.arange(22)[::-1]
    assert_same(reader.read(rows), direct(built), rows)  # the same samples as the default
    reader.close()


def test_the_disk_cache_serves_a_reopened_release_without_requests(
    s3: Bucket, built: Path, tmp_path: Path
) -> None:
    publish.publish(built, s3.location("releases"), "cells")
    cache = DiskCache(tmp_path / "cache")
    rows = np.arange(22)
    first = Release(url(s3), "train", cache_dir=cache)
    first.read(rows)
    first.close()
    key = hashlib.sha256(built.read_bytes()).hexdigest()
    assert [p.parent.name for p in (tmp_path / "cache").rglob("*-*")] == [key]  # by content
    misses = cache.misses
    again = Release(url(s3), "train", cache_dir=cache)
    assert_same(again.read(rows), direct(built), rows)
    assert cache.misses == misses
    assert cache.hits > 0
    again.close()


def test_the_disk_cache_stays_bounded_and_evicts_the_least_recent(
    s3: Bucket, tmp_path: Path
) -> None:
    data = np.random.default_rng(1).bytes(64 * 1024)
    s3.put("blob.bin", data)
    obj = stat_object(s3.location("blob.bin"))
    cache = DiskCache(tmp_path, max_bytes=16 * 1024)
    remote = RemoteFile(obj, block_size=1024, max_blocks=1, cache=cache, key="k")
    assert remote.read() == data
    held = sum(p.stat().st_size for p in (tmp_path / "k").iterdir())
    assert held <= 16 * 1024 + 16 * 1024 // 8  # the bound, and what one look lets past it
    assert not (tmp_path / "k" / "1024-0").exists()  # the first blocks read went first
    assert (tmp_path / "k" / "1024-63").exists()


def _read_through(obj: Any, cache_root: str, queue: Any) -> None:
    remote = RemoteFile(
        obj, block_size=2048, max_blocks=2, cache=DiskCache(Path(cache_root)), key="k"
    )
    queue.put(hashlib.sha256(remote.read()).hexdigest())


def test_two_processes_share_one_disk_cache(s3: Bucket, tmp_path: Path) -> None:
    data = np.random.default_rng(2).bytes(40 * 1024)
    s3.put("blob.bin", data)
    obj = stat_object(s3.location("blob.bin"))
    context = multiprocessing.get_context("spawn")  # no fsspec loop thread to inherit
    queue = context.Queue()
    workers = [
        context.Process(target=_read_through, args=(obj, str(tmp_path), queue)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    digests = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert digests == [hashlib.sha256(data).hexdigest()] * 2
    assert not list(tmp_path.rglob(".tmp-*"))  # atomic writes: no temp file left
    cache = DiskCache(tmp_path)
    remote = RemoteFile(obj, block_size=2048, cache=cache, key="k")
    assert remote.read() == data
    assert remote.requests == 0
    assert cache.hits == 20


class Proxy:
    """A TCP forwarder to the S3 server that a test can stop (the server unreachable, open
    connections cut) and start again on the same port, the server's objects kept."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            upstream = socket.create_connection(self.target)
            self._open += [client, upstream]
            for one, other in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(one, other), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxied(s3: Bucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    """The environment pointed at a proxy to the S3 server (``s3``'s bucket behind it)."""
    proxy = Proxy(s3.server.endpoint)
    proxy.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setattr(_source, "REMOTE_BLOCK_SIZE", 4096)  # rows still to fetch later
    try:
        yield proxy
    finally:
        proxy.stop()


def test_a_server_stopped_mid_read_fails_the_read_in_one_line(
    s3: Bucket, proxied: Proxy, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr(reading, "DEFAULT_ATTEMPTS", 2)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own tries: 3, seconds apart
    publish.publish(built, s3.location("releases"), "cells")
    reader = Release(url(s3), "train")
    reader.read([0])
    proxied.stop()
    with pytest.raises(ReaderError) as caught:
        reader.read(np.arange(22)[::-1])
    assert isinstance(caught.value, RemoteReadFailed)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(url(s3, "releases/cells-v0001.h5") + ": cannot read bytes")
    assert "2 attempts" in text
    reader.close()


def test_a_read_retried_while_the_server_is_back_gets_its_bytes(
    s3: Bucket,
    proxied: Proxy,
    built: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(reading, "FIRST_PAUSE_S", 0.2)  # sent again at +0.2, +0.6, +1.4 s
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # h5etl's own retries, not botocore's
    publish.publish(built, s3.location("releases"), "cells")
    reader = Release(url(s3), "train")
    reader.read([0])
    proxied.stop()
    timer = threading.Timer(0.5, proxied.start)  # back between the second try and the third
    timer.start()
    try:
        rows = np.arange(22)[::-1]
        assert_same(reader.read(rows), direct(built), rows)  # retried until it was back
    finally:
        timer.join()
        reader.close()
    assert any("attempt 1 failed, again in" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("releases/none.h5", "no release published there (no pointer none.h5.json)"),
        ("releases/cells-v0009.h5", "no such object"),
    ],
)
def test_a_missing_release_is_one_line(s3: Bucket, where: str, said: str) -> None:
    with pytest.raises(
        ReaderError, match=rf"^s3://{s3.name}/{re.escape(where)}: .*{re.escape(said)}"
    ) as caught:
        Release(url(s3, where), "train")
    assert "\n" not in str(caught.value)


def test_a_missing_bucket_or_refused_credentials_are_one_line(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ReaderError, match=r"no such bucket 'h5etl-no-such-bucket'"):
        Release("s3://h5etl-no-such-bucket/releases/cells.h5", "train")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-123")
    from s3_server import _authentication

    _authentication(s3.server, 0)
    try:
        with pytest.raises(ReaderError, match=r"refused the credentials") as caught:
            Release(url(s3), "train")
    finally:
        _authentication(s3.server, float("inf"))
    assert "\n" not in str(caught.value)
    assert "wrong-secret-123" not in str(caught.value)
