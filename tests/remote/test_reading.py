"""A published release read through ``RemoteFile``: h5py opens the pinned object with range
reads, a replaced object is refused, and a pickled handle reads on its own."""

from __future__ import annotations

import gc
import io
import pickle
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from s3_server import Bucket
from test_publish import release_file

from h5etl.remote import publish, reading, stat_object
from h5etl.remote.errors import RemoteChanged
from h5etl.remote.objects import read_bytes
from h5etl.remote.reading import RemoteFile


def test_h5py_reads_a_published_release_through_range_reads(s3: Bucket, tmp_path: Path) -> None:
    local = release_file(tmp_path / "cells.h5", seed=5, rows=256)  # 16 KiB of pixels
    publish.publish(local, s3.location("releases"), "cells")
    pinned = publish.resolve(s3.location("releases/cells.h5"))

    remote = RemoteFile(pinned, block_size=4096, max_blocks=4)
    with h5py.File(remote, "r") as got, h5py.File(local, "r") as want:
        np.testing.assert_array_equal(got["train/image"][()], want["train/image"][()])
        np.testing.assert_array_equal(got["train/image"][7], want["train/image"][7])
    size = local.stat().st_size
    assert 0 < remote.requests <= 2 * (size // 4096 + 1)  # blocks, not a request per read

    copy = pickle.loads(pickle.dumps(remote))  # a DataLoader worker's own handle
    assert copy.requests == 0
    assert copy.read() == local.read_bytes()


def test_a_file_replaced_under_a_reader_is_refused(s3: Bucket, tmp_path: Path) -> None:
    s3.put("releases/cells-v0001.h5", b"0123456789" * 100)
    remote = RemoteFile(publish.resolve(s3.location("releases/cells-v0001.h5")), block_size=100)
    assert remote.read(5) == b"01234"
    s3.put("releases/cells-v0001.h5", b"x" * 1000)  # overwritten behind h5etl's back
    remote.seek(500)
    with pytest.raises(
        RemoteChanged, match=r"file changed while it was read .*open the release again"
    ):
        remote.read(10)


def test_seek_and_read_follow_the_file_protocol(s3: Bucket) -> None:
    data = bytes(range(256)) * 10
    s3.put("raw/blob.bin", data)
    remote = RemoteFile(stat_object(s3.location("raw/blob.bin")), block_size=64)
    buffered = io.BufferedReader(remote)
    assert buffered.read(3) == data[:3]
    assert remote.seek(-10, io.SEEK_END) == len(data) - 10
    assert remote.read() == data[-10:]
    assert remote.read() == b""
    remote.seek(100)
    assert remote.read(200) == data[100:300]


def test_no_garbage_is_collected_while_a_request_waits(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h5py calls ``readinto`` holding its global lock while the request waits for fsspec's
    loop thread; a collection there that freed an h5py object of a reference cycle needed
    the lock too, and both threads waited for ever. No collection runs while a request is
    in flight, from any thread, and collection comes back after the last one."""
    local = release_file(tmp_path / "cells.h5", seed=6, rows=64)
    publish.publish(local, s3.location("releases"), "cells")
    remote = RemoteFile(publish.resolve(s3.location("releases/cells.h5")), block_size=4096)
    enabled_during: list[bool] = []
    both_in_flight = threading.Barrier(2, timeout=30)

    def watched(*args: object) -> bytes:
        enabled_during.append(gc.isenabled())
        if threading.current_thread().name.startswith("pread"):
            both_in_flight.wait()  # the other thread's request is in flight too
            enabled_during.append(gc.isenabled())
        return read_bytes(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(reading, "read_bytes", watched)
    assert gc.isenabled()
    with h5py.File(remote, "r") as got:
        assert got["train/image"].shape[0] == 64
    fresh = RemoteFile(remote.obj, block_size=4096)  # no block read yet
    threads = [
        threading.Thread(target=fresh.pread, args=(offset, 10), name=f"pread-{offset}")
        for offset in (0, 5000)  # two blocks, two requests
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(enabled_during) >= 4
    assert not any(enabled_during)
    assert gc.isenabled()
