"""Listing with stamps and reading bytes from a real S3-compatible server (``h5etl.remote``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from s3_server import Bucket

from h5etl.remote import list_objects, parse_location, read_bytes
from h5etl.remote.errors import RemoteChanged


def test_a_listing_gives_each_object_its_size_and_etag_never_an_mtime(s3: Bucket) -> None:
    s3.put("raw/images/a.png", b"alpha")
    s3.put("raw/images/sub/b.png", b"bravo!")
    s3.put("raw/images/c.txt", b"not an image")
    s3.put("raw/masks/a.png", b"elsewhere")

    listed = list_objects(s3.location("raw/images"), "*.png")

    assert [o.location.key for o in listed] == ["raw/images/a.png", "raw/images/sub/b.png"]
    assert [o.size for o in listed] == [5, 6]
    # a single-part upload's ETag is the MD5 of its bytes: computed here independently
    assert [o.etag for o in listed] == [
        hashlib.md5(b"alpha").hexdigest(),
        hashlib.md5(b"bravo!").hexdigest(),
    ]
    assert all(o.version_id is None and o.mtime_ns is None for o in listed)
    assert "mtime" not in listed[0].stamp


def test_a_versioned_bucket_stamps_the_version_too(s3_versioned: Bucket) -> None:
    s3_versioned.put("raw/a.bin", b"one")
    listed = list_objects(s3_versioned.location("raw"))
    head = s3_versioned.client.head_object(Bucket=s3_versioned.name, Key="raw/a.bin")
    assert listed[0].version_id == head["VersionId"]
    assert f"version={head['VersionId']}" in listed[0].stamp


def test_a_range_read_returns_those_bytes_only(s3: Bucket) -> None:
    data = bytes(range(256)) * 4
    s3.put("raw/blob.bin", data)
    (obj,) = list_objects(s3.location("raw"))
    assert read_bytes(obj) == data
    assert read_bytes(obj, 10, 20) == data[10:20]
    assert read_bytes(obj, 1000) == data[1000:]


def test_an_object_changed_between_listing_and_reading_is_refused(s3: Bucket) -> None:
    s3.put("raw/a.png", b"first")
    (obj,) = list_objects(s3.location("raw"))
    s3.put("raw/a.png", b"second")  # another process uploads anew
    with pytest.raises(RemoteChanged, match="changed during the build") as caught:
        read_bytes(obj, 0, 3)
    assert str(caught.value).startswith(f"s3://{s3.name}/raw/a.png: ")
    assert "\n" not in str(caught.value)


def test_a_versioned_bucket_reads_the_listed_version_after_a_change(
    s3_versioned: Bucket,
) -> None:
    s3_versioned.put("raw/a.png", b"first")
    (obj,) = list_objects(s3_versioned.location("raw"))
    s3_versioned.put("raw/a.png", b"second")
    # the listed version is still there: the build reads exactly what it listed
    assert read_bytes(obj) == b"first"


def test_a_local_folder_goes_through_the_same_api(tmp_path: Path) -> None:
    # no server: local paths keep working, stamped by size and mtime
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.png").write_bytes(b"bravo")
    (tmp_path / "a.png").write_bytes(b"alpha")
    (tmp_path / "c.txt").write_bytes(b"text")
    folder = parse_location(tmp_path)

    listed = list_objects(folder, "*.png")

    assert [folder.relative(o.location) for o in listed] == ["a.png", "sub/b.png"]
    assert read_bytes(listed[1], 1, 3) == b"ra"
    (tmp_path / "a.png").write_bytes(b"alpha, rewritten")
    with pytest.raises(RemoteChanged, match="changed during the build"):
        read_bytes(listed[0])
