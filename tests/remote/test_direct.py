"""The workers' whole-object GETs (``read_ahead``, ``read_many``) through obstore and through
s3fs, against a real S3-compatible server: the same bytes, the same refusals, the same one-line
errors."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from s3_server import Bucket

from h5etl.remote import direct as direct_module
from h5etl.remote import filesystem as filesystem_module
from h5etl.remote import list_objects, stat_object
from h5etl.remote import objects as objects_module
from h5etl.remote.errors import RemoteAccessDenied, RemoteChanged, RemoteError
from h5etl.remote.objects import read_ahead, read_many


def test_read_many_returns_each_objects_bytes_in_order(s3: Bucket, s3_client: str) -> None:
    blobs = {f"raw/{i:03d}.bin": hashlib.sha256(bytes([i])).digest() * (i + 1) for i in range(20)}
    for key, data in blobs.items():
        s3.put(key, data)
    listed = list_objects(s3.location("raw"))
    assert read_many(listed, concurrency=4) == list(blobs.values())


def test_a_listing_through_obstore_is_the_one_s3fs_gives(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("obstore", reason="the optional fast listing: pip install obstore")
    keys = ["raw/a b.png", "raw/ü.png", "raw/50%.png", "raw/a+b.png", "raw/sub/x.png"]
    for index, key in enumerate(keys):
        s3.put(key, bytes([index]) * (10 + index))
    s3.put("rawer/y.png", b"not under raw/")
    asked: list[str] = []
    real = direct_module.list_keys
    monkeypatch.setattr(
        direct_module,
        "list_keys",
        lambda *a, **k: asked.append(a[1]) or real(*a, **k),  # type: ignore[func-returns-value]
    )
    quick = list_objects(s3.location("raw"), "*.png")
    assert asked == ["raw"]  # obstore listed it: the bucket never had versioning
    monkeypatch.setenv("H5ETL_S3_CLIENT", "s3fs")
    assert quick == list_objects(s3.location("raw"), "*.png")
    assert [o.location.key for o in quick] == sorted(keys)


def test_an_empty_object_sends_the_listing_back_to_s3fs(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """obstore drops a folder marker's trailing ``/`` (``raw/sub/`` comes as ``raw/sub``):
    with any empty object in its listing, the folder is listed by s3fs, as it always was."""
    pytest.importorskip("obstore", reason="the optional fast listing: pip install obstore")
    s3.put("raw/sub/", b"")
    s3.put("raw/sub/x.png", b"x")
    listed = list_objects(s3.location("raw"))
    monkeypatch.setenv("H5ETL_S3_CLIENT", "s3fs")
    assert listed == list_objects(s3.location("raw"))
    assert "raw/sub/x.png" in [o.location.key for o in listed]


def test_reads_ahead_are_taken_in_any_order_and_unsent_ones_dropped(
    s3: Bucket, s3_client: str
) -> None:
    blobs = {f"raw/{i:03d}.bin": bytes([i]) * (100 + i) for i in range(40)}
    for key, data in blobs.items():
        s3.put(key, data)
    listed = list_objects(s3.location("raw"))

    readings = read_ahead(listed, concurrency=2)
    assert [r.wait() for r in reversed(readings)] == list(reversed(blobs.values()))

    # a task that stops early (its worker cancelled) drops what it had not sent yet
    dropped = read_ahead(listed, concurrency=1)
    for reading in dropped:
        reading.cancel()
    if s3_client == "obstore":  # one GET thread: all but the first few were still queued
        assert sum(r._future is not None and r._future.cancelled() for r in dropped) >= 30
    else:  # s3fs read them all before read_ahead returned: nothing to drop
        assert [r.wait() for r in dropped] == list(blobs.values())
    assert read_many(listed[:3], concurrency=1) == list(blobs.values())[:3]


def test_a_changed_and_a_deleted_object_are_refused_the_others_read(
    s3: Bucket, s3_client: str
) -> None:
    for name in ("a", "b", "c"):
        s3.put(f"raw/{name}.png", name.encode() * 3)
    listed = list_objects(s3.location("raw"))
    s3.put("raw/a.png", b"replaced")  # another process uploads anew
    s3.client.delete_object(Bucket=s3.name, Key="raw/c.png")

    first, second, third = read_many(listed)

    assert second == b"bbb"
    for got, key in ((first, "a"), (third, "c")):
        assert isinstance(got, RemoteChanged), got
        assert str(got).startswith(f"s3://{s3.name}/raw/{key}.png: the object changed")


def test_a_versioned_bucket_serves_the_listed_version(s3_versioned: Bucket, s3_client: str) -> None:
    s3_versioned.put("raw/a.png", b"first")
    listed = list_objects(s3_versioned.location("raw"))
    s3_versioned.put("raw/a.png", b"second")
    assert read_many(listed) == [b"first"]


def test_refused_credentials_are_one_line_without_the_secret(
    s3_auth: Bucket, s3_client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_auth.put("raw/a.png", b"alpha")
    listed = [stat_object(s3_auth.location("raw/a.png"))]  # the right key works
    assert read_many(listed) == [b"alpha"]
    secret = "wrong-secret-never-shown-7c2e"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")

    (got,) = read_many(listed)

    assert isinstance(got, RemoteAccessDenied), got
    text = str(got)
    assert text.startswith(f"s3://{s3_auth.name}/raw/a.png: cannot read: ")
    assert "refused the credentials" in text
    assert secret not in text
    assert "\n" not in text


def test_a_server_without_versioned_listings_is_listed_without_versions(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # s3rver and Cloudflare R2 answer ListObjectVersions with 405/501: the listing falls back
    # to ListObjectsV2 and stamps the ETags alone (the reads still carry If-Match)
    monkeypatch.setenv("H5ETL_S3_CLIENT", "s3fs")  # s3fs's listing (obstore's has no versions)
    s3.put("raw/a.png", b"alpha")
    real = filesystem_module.filesystem

    def without_versions(location: Any, *, versioned: bool = True) -> Any:
        fs = real(location, versioned=versioned)
        if not versioned:
            return fs

        class Refusing:
            def __getattr__(self, name: str) -> Any:
                return getattr(fs, name)

            def find(self, *args: Any, **kwargs: Any) -> Any:
                from botocore.exceptions import ClientError

                error = {"Error": {"Code": "MethodNotAllowed", "Message": "not allowed"}}
                raise PermissionError("not allowed") from ClientError(error, "ListObjectVersions")

        return Refusing()

    monkeypatch.setattr(objects_module, "filesystem", without_versions)
    (obj,) = list_objects(s3.location("raw"))
    assert obj.etag == hashlib.md5(b"alpha").hexdigest()
    assert obj.version_id is None
    assert read_many([obj]) == [b"alpha"]


def test_another_error_is_not_taken_for_a_server_without_versions(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("H5ETL_S3_CLIENT", "s3fs")  # s3fs's listing (obstore's has no versions)
    real = filesystem_module.filesystem

    def failing(location: Any, *, versioned: bool = True) -> Any:
        fs = real(location, versioned=versioned)

        class Failing:
            def __getattr__(self, name: str) -> Any:
                return getattr(fs, name)

            def find(self, *args: Any, **kwargs: Any) -> Any:
                raise OSError("connection reset")

        return Failing()

    monkeypatch.setattr(objects_module, "filesystem", failing)
    with pytest.raises(RemoteError, match="cannot list: connection reset"):
        list_objects(s3.location("raw"))
