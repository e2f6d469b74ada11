"""A real S3-compatible server for the tests of ``h5etl.remote``: moto's server mode, started
once per test session (per xdist worker) as its own process on localhost, stopped at the end.

Credentials reach h5etl only through the environment, as in production: an IAM user with an
access key is made on the server, and ``s3_auth`` switches authentication on for a test
(``/moto-api/reset-auth``), so a wrong key is refused as AWS refuses it. (Not for every test:
moto 5.2 miscomputes the signature of ListObjectVersions, which a versioned listing sends, and
refuses it however right the key.) Each test gets a
fresh bucket (``s3``), and the environment points at the server (``AWS_ENDPOINT_URL``). Skipped
with the reason when moto's server or s3fs is not installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from h5etl.remote import parse_location
from h5etl.remote.location import Location

REGION = "us-east-1"
PART_MIN = 1024  # the server's smallest multipart part (S3's 5 MiB): multipart on tiny files


@dataclass(frozen=True)
class Server:
    endpoint: str
    key_id: str
    secret: str


@dataclass(frozen=True)
class Bucket:
    """A fresh bucket on the server, with the environment set for it and a boto3 client to
    check behind h5etl's back."""

    name: str
    client: Any
    server: Server

    def location(self, key: str = "") -> Location:
        return parse_location(f"s3://{self.name}/{key}")

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.name, Key=key)["Body"].read()
        return body

    def keys(self) -> list[str]:
        listed = self.client.list_objects_v2(Bucket=self.name).get("Contents", [])
        return sorted(str(o["Key"]) for o in listed)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_until_up(endpoint: str, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):
        if process.poll() is not None:
            pytest.fail(f"the moto server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    pytest.fail(f"the moto server did not answer within 30 s: {log.read_text()[-2000:]}")


def _admin_key(endpoint: str) -> tuple[str, str]:
    """An IAM user allowed everything, and its access key (made before auth is on)."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="h5etl-tests")
    everything = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    }
    iam.put_user_policy(
        UserName="h5etl-tests", PolicyName="all", PolicyDocument=json.dumps(everything)
    )
    key = iam.create_access_key(UserName="h5etl-tests")["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The moto server process, with authentication on; stopped when the session ends."""
    pytest.importorskip("moto.server", reason="needs moto's server: pip install 'moto[server]'")
    pytest.importorskip("s3fs", reason="needs the cloud extra: pip install 'h5etl[cloud]'")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["S3_UPLOAD_PART_MIN_SIZE"] = str(PART_MIN)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _wait_until_up(endpoint, process, log)
        key_id, secret = _admin_key(endpoint)
        yield Server(endpoint, key_id, secret)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _authentication(server: Server, after: float) -> None:
    """Ask for credentials after ``after`` more requests (``inf``: never)."""
    request = urllib.request.Request(  # a form content type would leave the body unread
        f"{server.endpoint}/moto-api/reset-auth",
        data=str(after).encode(),
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture
def s3_auth(s3: Bucket) -> Iterator[Bucket]:
    """``s3``, with the server checking every request's credentials during the test."""
    _authentication(s3.server, 0)
    try:
        yield s3
    finally:
        _authentication(s3.server, float("inf"))


def _environment(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    # no ~/.aws files of the machine running the tests
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)


def _bucket(monkeypatch: pytest.MonkeyPatch, server: Server, *, versioned: bool) -> Bucket:
    import boto3

    _environment(monkeypatch, server)
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name=REGION,
        aws_access_key_id=server.key_id,
        aws_secret_access_key=server.secret,
    )
    name = f"h5etl-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    if versioned:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return Bucket(name, client, server)


@pytest.fixture
def s3(s3_server: Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A fresh, unversioned bucket; the environment holds the server's credentials."""
    return _bucket(monkeypatch, s3_server, versioned=False)


@pytest.fixture
def s3_versioned(s3_server: Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """A fresh bucket with versioning on."""
    return _bucket(monkeypatch, s3_server, versioned=True)


@pytest.fixture(params=["obstore", "s3fs"])
def s3_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which S3 client the workers' GETs and the listings go through (``H5ETL_S3_CLIENT``):
    obstore, the optional fast one (skipped where it is not installed), or s3fs."""
    name: str = request.param
    if name == "obstore":
        pytest.importorskip("obstore", reason="the optional fast client: pip install obstore")
    monkeypatch.setenv("H5ETL_S3_CLIENT", name)
    return name
