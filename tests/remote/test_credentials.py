"""Credentials stay in the environment: never in a Location, its pickle or repr, a record, a
pointer or an error; wrong credentials and a missing bucket are one line each, exit code 2."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from s3_server import Bucket

from h5etl.remote import Location, list_objects, parse_location, read_bytes, stat_object
from h5etl.remote import publish as remote_publish
from h5etl.remote.errors import RemoteAccessDenied, RemoteUsageError
from h5etl.remote.filesystem import scrub
from h5etl.remote.lock import RemoteLock


@pytest.mark.parametrize(
    ("url", "want"),
    [
        pytest.param("s3://bucket/raw/images/", Location("s3", "bucket", "raw/images"), id="s3"),
        pytest.param("s3://bucket", Location("s3", "bucket", ""), id="bucket-only"),
        pytest.param("gs://b/x//y", Location("gs", "b", "x/y"), id="gs"),
        pytest.param("gcs://b/x", Location("gs", "b", "x"), id="gcs-alias"),
        pytest.param("az://container/x", Location("az", "container", "x"), id="az"),
        pytest.param(
            "https://host.org/d/a.png", Location("https", "host.org", "d/a.png"), id="https"
        ),
        pytest.param("/data/raw", Location("file", "", "/data/raw"), id="path"),
        pytest.param("file:///data/raw", Location("file", "", "/data/raw"), id="file-url"),
    ],
)
def test_urls_and_paths_parse_into_locations(url: str, want: Location) -> None:
    got = parse_location(url)
    assert got == want
    assert pickle.loads(pickle.dumps(got)) == got


@pytest.mark.parametrize(
    ("url", "says"),
    [
        pytest.param(
            "s3://AKIAEXAMPLE:wJalrSECRET@bucket/x", "must not carry credentials", id="userinfo"
        ),
        pytest.param(
            "https://h.org/a.h5?X-Amz-Signature=wJalrSECRET&X-Amz-Credential=AKIAEXAMPLE",
            "query string",
            id="presigned",
        ),
        pytest.param("ftp://h.org/x", "unknown URL scheme", id="scheme"),
        pytest.param("s3://Bad_Bucket/x", "not a valid S3 bucket name", id="bucket-name"),
    ],
)
def test_a_bad_url_is_one_line_that_repeats_no_credential(url: str, says: str) -> None:
    with pytest.raises(RemoteUsageError, match=says) as caught:
        parse_location(url)
    text = str(caught.value)
    assert "\n" not in text
    assert "SECRET" not in text
    assert "AKIAEXAMPLE" not in text
    assert caught.value.exit_code == 2


def test_no_credential_in_a_location_a_record_or_a_pointer(s3: Bucket, tmp_path: Path) -> None:
    s3.put("raw/a.bin", b"x")
    (obj,) = list_objects(s3.location("raw"))
    local = tmp_path / "cells.h5"
    local.write_bytes(b"not checked here")
    pointer = remote_publish.publish(local, s3.location("out"), "cells")
    secret, key_id = s3.server.secret, s3.server.key_id
    for text in (
        repr(obj),
        pickle.dumps(obj),
        repr(obj.location),
        pickle.dumps(obj.location),
        obj.stamp,
        pointer.to_json(),
        repr(pointer),
    ):
        blob = text if isinstance(text, bytes) else text.encode()
        assert secret.encode() not in blob
        assert key_id.encode() not in blob


def test_wrong_credentials_are_one_line_naming_the_url_and_no_secret(
    s3_auth: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_auth.put("raw/a.bin", b"x")
    obj = stat_object(s3_auth.location("raw/a.bin"))  # the right key works
    assert read_bytes(obj) == b"x"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    for call in (lambda: list_objects(s3_auth.location("raw")), lambda: read_bytes(obj)):
        with pytest.raises(RemoteAccessDenied, match="refused the credentials") as caught:
            call()
        text = str(caught.value)
        assert text.startswith(f"s3://{s3_auth.name}/raw")
        assert "\n" not in text
        assert "wrong-secret" not in text
        assert s3_auth.server.key_id not in text
        assert caught.value.exit_code == 2


def test_a_missing_bucket_is_one_line(s3: Bucket) -> None:
    with pytest.raises(RemoteUsageError, match="no such bucket 'h5etl-no-such-bucket'") as caught:
        list_objects(parse_location("s3://h5etl-no-such-bucket/raw"))
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_an_empty_prefix_lists_nothing(s3: Bucket) -> None:
    assert list_objects(s3.location("nothing/here")) == []


def test_no_credentials_at_all_is_one_line_saying_where_they_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("s3fs", reason="needs the cloud extra: pip install 'h5etl[cloud]'")
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never asked: no key to sign
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(RemoteAccessDenied, match="no s3 credentials found") as caught:
        list_objects(parse_location("s3://bucket/raw"))
    assert str(caught.value).startswith("s3://bucket/raw: ")
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)
    assert caught.value.exit_code == 2


def test_publishing_to_a_missing_bucket_is_one_line(s3: Bucket, tmp_path: Path) -> None:
    local = tmp_path / "cells.h5"
    local.write_bytes(b"a finished release")
    output = parse_location("s3://h5etl-no-such-bucket/releases")
    for call in (
        lambda: remote_publish.publish(local, output, "cells"),
        lambda: RemoteLock(output, "cells").held().__enter__(),
    ):
        with pytest.raises(RemoteUsageError, match="no such bucket 'h5etl-no-such-bucket'") as e:
            call()
        assert str(e.value).startswith("s3://h5etl-no-such-bucket/releases")
        assert "\n" not in str(e.value)


def test_scrub_masks_what_a_backend_may_echo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzE-token")
    text = (
        "denied wJalrXUtnFEMI-secret with FwoGZXIvYXdzE-token at "
        "http://minio:pa55w0rd@minio.lab:9000/b?X-Amz-Credential=AKIAEXAMPLE%2F2026&"
        "X-Amz-Signature=abc123"
    )
    scrubbed = scrub(text)
    for secret in ("wJalrXUtnFEMI", "FwoGZXIvYXdzE", "pa55w0rd", "AKIAEXAMPLE", "abc123"):
        assert secret not in scrubbed
    assert "minio.lab:9000" in scrubbed  # where, still said


@pytest.mark.parametrize(
    ("environment", "want"),
    [
        pytest.param({}, {"max_attempts": 3, "mode": "standard"}, id="default"),
        pytest.param({"AWS_MAX_ATTEMPTS": "1"}, {"mode": "standard"}, id="attempts"),
        pytest.param({"AWS_RETRY_MODE": "adaptive"}, {"max_attempts": 3}, id="mode"),
    ],
)
def test_the_environment_sets_botocores_retries_as_for_every_aws_tool(
    s3: Bucket, monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], want: object
) -> None:
    # What h5etl passes to botocore, which takes what is left out from the environment. A
    # new file system: botocore rewrites the dict of one it made a client for.
    from h5etl.remote.filesystem import _open

    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert _open(s3.location("raw")).config_kwargs["retries"] == want
