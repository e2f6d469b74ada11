"""Builds into ``output: s3://...`` against the tests' S3 server (moto), compared with local
builds of the same inputs: upload + pointer, companions, the lock, incremental builds that take
their parent (and its carry record) from the bucket, and the faults of a publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig, add_pairs, dataset_digests
from s3_server import Bucket

from h5etl import build, load_spec
from h5etl.history.build_report import BuildReport


def built(config: Path, **kw: object) -> BuildReport:
    return build(load_spec(config), **kw)  # type: ignore[arg-type]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The local work folder of builds into a bucket (never the user's ~/.cache)."""
    folder = tmp_path / "work"
    monkeypatch.setenv("H5ETL_WORK_DIR", str(folder))
    return folder


def download(s3: Bucket, key: str, to: Path) -> Path:
    to.write_bytes(s3.get(key))
    return to


def test_a_build_into_a_bucket_publishes_what_a_local_build_stores(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6, broken=["truncated"])
    local = built(write_config(tmp_path, config_name="local.yaml"))
    remote = built(write_config(tmp_path, output=f"s3://{s3.name}/releases"))

    assert remote.url == f"s3://{s3.name}/releases/cells-v0001.h5"
    keys = s3.keys()
    assert keys == [
        "releases/.cells-v0001.h5.carry.json",
        "releases/cells-v0001.build.json",
        "releases/cells-v0001.h5",
        "releases/cells-v0001.rejects.jsonl",
        "releases/cells.h5.json",
    ]  # the lock object is gone
    pointer = json.loads(s3.get("releases/cells.h5.json"))
    assert (pointer["file"], pointer["version"]) == ("cells-v0001.h5", 1)
    got = download(s3, "releases/cells-v0001.h5", tmp_path / "got.h5")
    assert local.path is not None
    assert dataset_digests(got) == dataset_digests(local.path)
    rejects = s3.get("releases/cells-v0001.rejects.jsonl").decode().splitlines()
    assert [json.loads(r)["reason"] for r in rejects] == [r.reason for r in local.rejects]
