"""Publishing releases to a real S3-compatible server: upload, pointer, read back, a killed
upload, rollback and prune (``h5etl.remote.publish``, ``h5etl.remote.catalog``)."""

from __future__ import annotations

import hashlib
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from s3_server import PART_MIN, Bucket

from h5etl.errors import ReleaseUsageError
from h5etl.release import naming
from h5etl.remote import catalog, publish, read_bytes
from h5etl.remote import s3 as requests
from h5etl.remote.lock import RemoteLock
from h5etl.remote.publish import Pointer


def release_file(path: Path, seed: int, rows: int = 64) -> Path:
    """A small HDF5 release (a few KiB: several multipart parts of PART_MIN bytes)."""
    with h5py.File(path, "w") as f:
        f["train/image"] = np.random.default_rng(seed).integers(0, 255, (rows, 8, 8), "u1")
    return path


def multipart_etag(data: bytes, part: int) -> str:
    """The ETag S3 gives a multipart upload: MD5 of the parts' MD5s, then -<parts>."""
    md5s = [hashlib.md5(data[i : i + part]).digest() for i in range(0, len(data), part)]
    return f"{hashlib.md5(b''.join(md5s)).hexdigest()}-{len(md5s)}"


def test_a_published_release_reads_back_through_its_pointer(s3: Bucket, tmp_path: Path) -> None:
    local = release_file(tmp_path / "cells.h5", seed=1)
    data = local.read_bytes()
    output = s3.location("releases")

    pointer = publish.publish(local, output, "cells", part_size=PART_MIN)

    assert pointer.version == 1
    assert pointer.file == "cells-v0001.h5"
    assert pointer.sha256 == hashlib.sha256(data).hexdigest()
    assert pointer.size == len(data)
    assert pointer.etag == multipart_etag(data, PART_MIN)  # uploaded in parts
    assert s3.keys() == ["releases/cells-v0001.h5", "releases/cells.h5.json"]
    # a reader: one GET of the pointer, then the file it names
    stored = json.loads(s3.get("releases/cells.h5.json"))
    assert stored["file"] == "cells-v0001.h5"
    assert stored["h5etl"] == "release-pointer"
    body = s3.get(f"releases/{stored['file']}")
    assert hashlib.sha256(body).hexdigest() == stored["sha256"]
    head = s3.client.head_object(Bucket=s3.name, Key="releases/cells-v0001.h5")
    assert head["Metadata"]["sha256"] == stored["sha256"]
    with h5py.File(io.BytesIO(body), "r") as got, h5py.File(local, "r") as want:
        np.testing.assert_array_equal(got["train/image"][()], want["train/image"][()])
    assert publish.read_pointer(output, "cells") == pointer


def test_a_small_release_goes_up_in_one_request(s3: Bucket, tmp_path: Path) -> None:
    local = release_file(tmp_path / "cells.h5", seed=2, rows=1)
    pointer = publish.publish(local, s3.location("out"), "cells")  # 64 MiB parts
    assert pointer.etag == hashlib.md5(local.read_bytes()).hexdigest()


def test_the_next_build_gets_the_next_version(s3: Bucket, tmp_path: Path) -> None:
    output = s3.location("releases")
    for seed in (1, 2, 3):
        publish.publish(
            release_file(tmp_path / f"{seed}.h5", seed), output, "cells", part_size=PART_MIN
        )
    assert [r.version for r in catalog.releases(output, "cells")] == [1, 2, 3]
    assert [r.current for r in catalog.releases(output, "cells")] == [False, False, True]
    # the names are the local release folder's
    assert publish.release_filename("cells", 12) == naming.release_filename("cells", 12)


def test_a_build_killed_before_the_pointer_publishes_nothing(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = s3.location("releases")
    first = publish.publish(release_file(tmp_path / "1.h5", 1), output, "cells")
    pointer_before = s3.get("releases/cells.h5.json")

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the process dies between the upload and the pointer

    with monkeypatch.context() as patched:
        patched.setattr(publish, "write_pointer", killed)
        with pytest.raises(KeyboardInterrupt):
            publish.publish(release_file(tmp_path / "2.h5", 2), output, "cells")

    assert s3.get("releases/cells.h5.json") == pointer_before
    assert publish.read_pointer(output, "cells") == first
    listed = catalog.releases(output, "cells")
    assert [(r.version, r.current) for r in listed] == [(1, True), (2, False)]
    # the next build works, and takes the next free version
    third = publish.publish(release_file(tmp_path / "3.h5", 3), output, "cells")
    assert third.version == 3
    assert publish.read_pointer(output, "cells") == third


def test_an_upload_failing_midway_leaves_no_object_and_no_upload(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = s3.location("releases")
    publish.publish(release_file(tmp_path / "1.h5", 1), output, "cells")
    pointer_before = s3.get("releases/cells.h5.json")
    sent = requests.send_part

    def dies_at_part_3(location: object, upload_id: str, number: int, chunk: bytes) -> str:
        if number == 3:
            raise ConnectionResetError("the server went away")
        return sent(location, upload_id, number, chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(requests, "send_part", dies_at_part_3)
    with pytest.raises(ConnectionResetError):
        publish.publish(release_file(tmp_path / "2.h5", 2), output, "cells", part_size=PART_MIN)

    assert s3.keys() == ["releases/cells-v0001.h5", "releases/cells.h5.json"]
    assert s3.get("releases/cells.h5.json") == pointer_before
    assert s3.client.list_multipart_uploads(Bucket=s3.name).get("Uploads", []) == []


def test_rollback_points_at_an_older_version(s3: Bucket, tmp_path: Path) -> None:
    output = s3.location("releases")
    files = [release_file(tmp_path / f"{seed}.h5", seed) for seed in (1, 2)]
    for local in files:
        publish.publish(local, output, "cells")

    pointer = publish.rollback(output, "cells", 1)

    assert pointer.version == 1
    stored = Pointer.from_json(s3.get("releases/cells.h5.json"), output)
    assert stored.file == "cells-v0001.h5"
    assert stored.sha256 == hashlib.sha256(files[0].read_bytes()).hexdigest()
    with pytest.raises(ReleaseUsageError, match=r"no version 9 of 'cells'.*versions: 1, 2\)"):
        publish.rollback(output, "cells", 9)


def test_prune_keeps_the_newest_and_the_pointed_at_version(s3: Bucket, tmp_path: Path) -> None:
    output = s3.location("releases")
    for seed in (1, 2, 3, 4):
        publish.publish(release_file(tmp_path / f"{seed}.h5", seed), output, "cells")
    publish.rollback(output, "cells", 1)

    planned = catalog.prune(output, "cells", keep=2)
    assert [(r.version, r.kept) for r in planned] == [
        (1, "current"),
        (2, ""),
        (3, "newest 2"),
        (4, "newest 2"),
    ]
    assert len(s3.keys()) == 5  # a dry run deletes nothing

    catalog.prune(output, "cells", keep=2, apply=True)
    assert s3.keys() == [
        "releases/cells-v0001.h5",
        "releases/cells-v0003.h5",
        "releases/cells-v0004.h5",
        "releases/cells.h5.json",
    ]
    assert publish.read_pointer(output, "cells").version == 1  # type: ignore[union-attr]


KILLED_MIDWAY = """
import os, sys
from pathlib import Path
from h5etl.remote import parse_location, publish, s3

sent = s3.send_part

def dies(location, upload_id, number, chunk):
    if number == 2:
        os.kill(os.getpid(), 9)  # SIGKILL: no except, no finally, no abort
    return sent(location, upload_id, number, chunk)

s3.send_part = dies
publish.publish(Path(sys.argv[1]), parse_location(sys.argv[2]), "cells", part_size=int(sys.argv[3]))
"""


def test_a_build_killed_mid_upload_publishes_nothing_and_the_next_one_works(
    s3: Bucket, tmp_path: Path
) -> None:
    output = s3.location("releases")
    first = publish.publish(release_file(tmp_path / "1.h5", 1), output, "cells")
    pointer_before = s3.get("releases/cells.h5.json")

    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_MIDWAY,
            str(release_file(tmp_path / "2.h5", 2)),
            output.url,
            str(PART_MIN),
        ],
        capture_output=True,
        text=True,
        check=False,
    )

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert s3.keys() == ["releases/cells-v0001.h5", "releases/cells.h5.json"]
    assert s3.get("releases/cells.h5.json") == pointer_before
    # what it leaves: one incomplete multipart upload, invisible to readers (a bucket's
    # lifecycle rule aborts such uploads)
    uploads = s3.client.list_multipart_uploads(Bucket=s3.name).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["releases/cells-v0002.h5"]
    assert publish.read_pointer(output, "cells") == first
    again = publish.publish(release_file(tmp_path / "3.h5", 3), output, "cells")
    assert again.version == 2
    assert publish.read_pointer(output, "cells") == again


def test_a_reader_resolves_the_pointer_once_and_keeps_its_release(
    s3: Bucket, tmp_path: Path
) -> None:
    output = s3.location("releases")
    first = release_file(tmp_path / "1.h5", 1)
    publish.publish(first, output, "cells")

    pinned = publish.resolve(s3.location("releases/cells.h5"))
    assert pinned.location == s3.location("releases/cells-v0001.h5")
    publish.publish(release_file(tmp_path / "2.h5", 2), output, "cells")  # published meanwhile

    assert read_bytes(pinned) == first.read_bytes()  # the reader's release, whole
    newer = publish.resolve(s3.location("releases/cells.h5"))
    assert newer.location.name == "cells-v0002.h5"
    assert publish.resolve(s3.location("releases/cells-v0001.h5")).etag == pinned.etag
    with pytest.raises(ReleaseUsageError, match=r"no release published there"):
        publish.resolve(s3.location("releases/nuclei.h5"))


def test_a_versioned_bucket_publishes_pins_and_prunes_alike(
    s3_versioned: Bucket, tmp_path: Path
) -> None:
    bucket = s3_versioned
    output = bucket.location("releases")
    for seed in (1, 2, 3):
        publish.publish(release_file(tmp_path / f"{seed}.h5", seed), output, "cells")
    pointer = publish.read_pointer(output, "cells")
    assert pointer is not None
    head = bucket.client.head_object(Bucket=bucket.name, Key="releases/cells-v0003.h5")
    assert pointer.version_id == head["VersionId"]

    catalog.prune(output, "cells", keep=1, apply=True)

    # a delete in a versioned bucket leaves a delete marker: the listing must not show it
    assert [r.version for r in catalog.releases(output, "cells")] == [3]
    assert bucket.keys() == ["releases/cells-v0003.h5", "releases/cells.h5.json"]
    for _ in range(2):  # the lock's delete markers do not keep the next build out
        with RemoteLock(output, "cells").held():
            pass
