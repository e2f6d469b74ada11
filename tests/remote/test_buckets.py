"""What a build asks of a bucket before listing it is asked once (``h5etl.remote.buckets``):
one check of the bucket (obstore's listing of one key, else s3fs's HeadBucket) and one
GetBucketVersioning for the config's check and the listings of two sources in one bucket,
against a real S3-compatible server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from s3_server import Bucket

from h5etl.remote import buckets, direct, list_objects
from h5etl.remote import objects as objects_module
from h5etl.remote.filesystem import filesystem
from h5etl.remote.objects import reachable


class _Asked:
    """Counts the requests asking for a bucket."""

    def __init__(self, fail: int = 0, wait: float = 0.0):
        self.calls = 0
        self.fail = fail  # the first ``fail`` requests raise
        self.wait = wait

    def of(self, bucket: str) -> Callable[[], None]:
        def ask() -> None:
            self.calls += 1
            time.sleep(self.wait)
            if self.calls <= self.fail:
                raise PermissionError(f"refused: {bucket}")

        return ask


def test_a_bucket_is_asked_for_once_until_forgotten() -> None:
    buckets.forget()
    asked = _Asked()
    buckets.check_exists("one", asked.of("one"))
    buckets.check_exists("one", asked.of("one"))
    buckets.check_exists("two", asked.of("two"))
    assert asked.calls == 2
    buckets.forget()
    buckets.check_exists("one", asked.of("one"))
    assert asked.calls == 3


def test_an_answer_goes_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    buckets.forget()
    asked = _Asked()
    buckets.check_exists("stale", asked.of("stale"))
    monkeypatch.setattr(buckets, "FRESH_SECONDS", 0.0)
    time.sleep(0.01)
    buckets.check_exists("stale", asked.of("stale"))
    assert asked.calls == 2


def test_a_failed_request_keeps_nothing() -> None:
    buckets.forget()
    asked = _Asked(fail=1)
    with pytest.raises(PermissionError, match="refused: gone"):
        buckets.check_exists("gone", asked.of("gone"))
    buckets.check_exists("gone", asked.of("gone"))  # asked again, and answered
    assert asked.calls == 2


def test_callers_asking_at_once_share_one_request() -> None:
    buckets.forget()
    asked = _Asked(wait=0.2)
    threads = [
        threading.Thread(target=buckets.check_exists, args=("shared", asked.of("shared")))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert asked.calls == 1


def test_two_sources_in_one_bucket_ask_it_once(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch, s3_client: str
) -> None:
    buckets.forget()
    for key in ("images/a.png", "images/b.png", "masks/a.png", "masks/b.png"):
        s3.put(key, b"x")
    fs = filesystem(s3.location("images"))
    asked: list[str] = []

    def counting(what: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            asked.append(what)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(direct, "any_key", counting("list one", direct.any_key))
    monkeypatch.setattr(fs, "info", counting("head", fs.info))
    monkeypatch.setattr(
        objects_module, "_versioned", counting("versioning", objects_module._versioned)
    )
    for folder in ("images", "masks"):  # the config's check
        reachable(s3.location(folder))
    listed = [list_objects(s3.location(folder)) for folder in ("images", "masks")]
    assert [len(found) for found in listed] == [2, 2]
    if s3_client == "obstore":  # the bucket asked for by a listing of one key; its versioning
        assert asked == ["list one", "versioning"]
    else:
        assert asked == ["head"]


def test_versioning_is_asked_of_the_bucket(s3: Bucket, s3_versioned: Bucket) -> None:
    buckets.forget()
    assert not objects_module._versioned(s3.location())
    assert objects_module._versioned(s3_versioned.location())


def test_a_listing_told_to_stop_stops(s3: Bucket) -> None:
    pytest.importorskip("obstore", reason="the optional fast listing: pip install obstore")
    s3.put("raw/a.png", b"a")
    assert direct.list_keys(s3.name, "raw/", stop=lambda: True) is None
    assert [key for key, _, _ in direct.list_keys(s3.name, "raw/") or []] == ["raw/a.png"]
