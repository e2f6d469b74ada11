"""Sources on object storage (issue 29 item 1): ``dir: s3://...`` against the moto server.

A cells-like raw folder is uploaded to the bucket; a build from it must store exactly what a
build from the same files on local disk stores (the datasets, the lineage digests), each
worker reading the objects itself; an incremental build decodes only a changed object; an
object replaced during a build is rejected, never mixed in; a missing bucket or refused
credentials stop before anything is built, in one line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from conftest import MakeRaw, RawFolder, WriteConfig, png_bytes, read_release
from s3_server import Bucket
from typer.testing import CliRunner

from h5etl import build, load_spec
from h5etl.cli.app import app
from h5etl.errors import ClusterError
from h5etl.execute import pool
from h5etl.inputs import remote_files

pytest.importorskip("s3fs", reason="needs the cloud extra: pip install 'h5etl[cloud]'")


def _upload(raw: RawFolder, bucket: Bucket) -> None:
    """The raw folder's files as objects ``raw/images/...``, ``raw/masks/...``."""
    for folder in (raw.images, raw.masks):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                bucket.put(path.relative_to(raw.root).as_posix(), path.read_bytes())


def _remote_config(write_config: WriteConfig, root: Path, bucket: Bucket, **overrides: Any) -> Path:
    sources = {
        "image": {"dir": f"s3://{bucket.name}/raw/images"},
        "mask": {"dir": f"s3://{bucket.name}/raw/masks"},
    }
    return write_config(root, sources=sources, **overrides)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_build_from_the_bucket_stores_what_a_local_build_stores(
    s3: Bucket, make_raw: MakeRaw, write_config: WriteConfig, tmp_path: Path, jobs: int
) -> None:
    local_root, remote_root = tmp_path / "local", tmp_path / "remote"
    local_root.mkdir()
    remote_root.mkdir()
    raw = make_raw(local_root, n=10)
    _upload(raw, s3)
    local = build(load_spec(write_config(local_root)), jobs=1)
    remote = build(load_spec(_remote_config(write_config, remote_root, s3)), jobs=jobs)
    assert local.path is not None
    assert remote.path is not None
    ours, theirs = read_release(local.path), read_release(remote.path)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert remote.samples == local.samples


def test_workers_import_the_object_readers_while_the_parent_plans(
    s3: Bucket, make_raw: MakeRaw, write_config: WriteConfig, tmp_path: Path
) -> None:
    from h5etl.inputs.urls import REMOTE_READING
    from h5etl.plan.kind_registry import worker_modules

    local_root, remote_root = tmp_path / "local", tmp_path / "remote"
    local_root.mkdir()
    remote_root.mkdir()
    _upload(make_raw(local_root, n=2), s3)
    local = worker_modules(load_spec(write_config(local_root)))
    remote = worker_modules(load_spec(_remote_config(write_config, remote_root, s3)))
    assert remote == (*local, *REMOTE_READING)  # a local build's workers never load them
    assert not set(local) & set(REMOTE_READING)


def _parent_facts(path: Path) -> dict[str, Any]:
    with h5py.File(path, "r") as handle:
        facts: dict[str, Any] = json.loads(handle.attrs["parent"])
        return facts


def _lineage(path: Path) -> dict[str, list[str]]:
    """Each stored sample's lineage digests (one per source file), by sample key."""
    out = {}
    with h5py.File(path, "r") as handle:
        for split in (s for s in handle if s != "diagnostics"):
            keys = handle[f"{split}/sample_key"].asstr()[...]
            lineage = handle[f"{split}/source_sha256"][...]
            for key, row in zip(keys, lineage, strict=True):
                out[str(key)] = [bytes(d).decode() for d in row]
    return out


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return png_bytes(rng.integers(0, 255, (20, 23, 3), dtype=np.uint8))  # s003's size


@pytest.fixture
def remote_project(
    s3: Bucket, make_raw: MakeRaw, write_config: WriteConfig, tmp_path: Path
) -> Path:
    """A config whose sources are the bucket's ``raw/images`` and ``raw/masks`` (10 pairs)."""
    raw = make_raw(tmp_path / "upload", n=10)
    _upload(raw, s3)
    root = tmp_path / "project"
    root.mkdir()
    return _remote_config(write_config, root, s3)


def test_an_incremental_build_decodes_only_the_changed_object(
    s3: Bucket, remote_project: Path
) -> None:
    spec = load_spec(remote_project)
    first = build(spec, jobs=1)
    assert first.path is not None
    # the same bytes again: the same ETag, nothing to do (an mtime would have changed)
    s3.put("raw/images/s003.png", s3.get("raw/images/s003.png"))
    same = build(load_spec(remote_project), jobs=1)
    assert same.path == first.path
    changed = _png(7)
    s3.put("raw/images/s003.png", changed)
    second = build(load_spec(remote_project), jobs=1)
    assert second.path is not None
    assert second.path != first.path
    facts = _parent_facts(second.path)
    # its block of chunk rows at most (4; the valid split's partial block is decoded anyway)
    assert 0 < facts["samples_decoded"] <= 4
    assert facts["samples_reused"] >= sum(first.samples.values()) - 4 - 2
    lineage = _lineage(second.path)
    assert lineage["s003"][0] == hashlib.sha256(changed).hexdigest()
    assert {k: v for k, v in lineage.items() if k != "s003"} == {
        k: v for k, v in _lineage(first.path).items() if k != "s003"
    }


def _replacing_after_listing(
    monkeypatch: pytest.MonkeyPatch, bucket: Bucket, key: str, data: bytes
) -> None:
    """Upload ``data`` to ``key`` right after discover lists the images (before any read)."""
    listed = remote_files.list_folder

    def list_then_replace(folder: str) -> list[Any]:
        found = listed(folder)
        if folder.endswith("/images"):
            bucket.put(key, data)
        return found

    monkeypatch.setattr(remote_files, "list_folder", list_then_replace)


# the workers' GETs through obstore (when installed) and through s3fs: both send If-Match
CLIENTS = [pytest.param("obstore", id="obstore"), pytest.param("s3fs", id="s3fs")]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("jobs", [1, 2])
def test_an_object_replaced_during_the_build_is_rejected_never_mixed(
    s3: Bucket, remote_project: Path, monkeypatch: pytest.MonkeyPatch, jobs: int, client: str
) -> None:
    monkeypatch.setenv("H5ETL_S3_CLIENT", client)
    _replacing_after_listing(monkeypatch, s3, "raw/images/s003.png", _png(8))
    report = build(load_spec(remote_project), jobs=jobs)
    assert report.path is not None
    rejected = {(r.path, r.reason) for r in report.rejects}
    url = f"s3://{s3.name}/raw"
    assert rejected == {
        (f"{url}/images/s003.png", "changed_during_build"),
        (f"{url}/masks/s003.png", "changed_during_build"),
    }
    assert "s003" not in _lineage(report.path)
    assert sum(report.samples.values()) == 9


@pytest.mark.parametrize("client", CLIENTS)
def test_a_versioned_bucket_reads_the_listed_version(
    s3_versioned: Bucket,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    client: str,
) -> None:
    monkeypatch.setenv("H5ETL_S3_CLIENT", client)
    raw = make_raw(tmp_path / "upload", n=4)
    _upload(raw, s3_versioned)
    root = tmp_path / "project"
    root.mkdir()
    config = _remote_config(write_config, root, s3_versioned, splits={"train": 1.0})
    _replacing_after_listing(monkeypatch, s3_versioned, "raw/images/s001.png", _png(9))
    report = build(load_spec(config), jobs=1)
    assert report.path is not None
    assert report.rejects == []
    listed = hashlib.sha256(raw.image("s001").read_bytes()).hexdigest()
    assert _lineage(report.path)["s001"][0] == listed


def _cli(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.strip().splitlines()


@pytest.mark.parametrize("missing", ["image", "mask"])
def test_a_missing_bucket_is_one_line_as_a_missing_folder(
    s3: Bucket, write_config: WriteConfig, tmp_path: Path, make_raw: MakeRaw, missing: str
) -> None:
    # the sources are listed at once: the error is the source's whose listing failed
    _upload(make_raw(tmp_path / "raw", n=2), s3)
    sources = {
        "image": {"dir": f"s3://{s3.name}/raw/images"},
        "mask": {"dir": f"s3://{s3.name}/raw/masks"},
    }
    url = f"s3://h5etl-no-such-bucket/raw/{missing}s"
    sources[missing] = {"dir": url}
    config = write_config(tmp_path, sources=sources)
    code, lines = _cli("build", str(config), "-j", "1", "-q")
    assert code == 2
    assert len(lines) == 1, lines
    assert url in lines[0]
    assert "no such bucket 'h5etl-no-such-bucket'" in lines[0]
    assert not (tmp_path / "releases").exists()


def test_refused_credentials_are_one_line_without_the_secret(
    s3_auth: Bucket, remote_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "wrong-secret-never-shown-5d1f"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    code, lines = _cli("build", str(remote_project), "-j", "1", "-q")
    assert code == 2
    assert len(lines) == 1, lines
    assert f"s3://{s3_auth.name}/raw/images" in lines[0]
    assert "refused the credentials" in lines[0]
    assert secret not in lines[0]
    assert not (remote_project.parent / "releases").exists()


def test_without_the_cloud_extra_one_line_names_it(
    s3: Bucket, remote_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs fails
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # no file system opened before
    code, lines = _cli("validate", str(remote_project))
    assert code == 2
    assert len(lines) == 1, lines
    assert "pip install 'h5etl[cloud]'" in lines[0]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"entries": "folders"}, "entries: folders is not supported"),
    ],
)
def test_what_object_storage_cannot_hold_yet_is_refused_at_validate(
    s3: Bucket, remote_project: Path, override: dict[str, str], named: str
) -> None:
    data = yaml.safe_load(remote_project.read_text())
    data["sources"]["image"].update(override)
    remote_project.write_text(yaml.safe_dump(data))
    code, lines = _cli("validate", str(remote_project))
    assert code == 2
    assert any(named in line for line in lines), lines


def test_the_release_records_the_url_and_no_credential(s3: Bucket, remote_project: Path) -> None:
    report = build(load_spec(remote_project), jobs=1)
    assert report.path is not None
    data = report.path.read_bytes()
    assert f"s3://{s3.name}/raw/images".encode() in data
    assert s3.server.secret.encode() not in data
    assert s3.server.key_id.encode() not in data


def _local_cluster() -> Any:
    distributed = pytest.importorskip("distributed")
    return distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0"
    )


def test_dask_workers_read_the_sources_from_the_server_only(
    s3: Bucket, make_raw: MakeRaw, write_config: WriteConfig, tmp_path: Path
) -> None:
    local_root, remote_root = tmp_path / "local", tmp_path / "remote"
    remote_root.mkdir()
    raw = make_raw(local_root, n=10)
    _upload(raw, s3)
    local = build(load_spec(write_config(local_root)), jobs=1)
    assert local.path is not None
    expected = read_release(local.path)
    shutil.rmtree(raw.root / "raw")  # no copy of the inputs on any disk: only the server's
    spec = load_spec(_remote_config(write_config, remote_root, s3))
    with _local_cluster() as cluster:
        remote = build(spec, scheduler=cluster.scheduler_address)
    assert remote.path is not None
    got = read_release(remote.path)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_dask_worker_without_credentials_fails_in_one_line(
    s3: Bucket, remote_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_id, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for
    with _local_cluster() as cluster:  # its workers start without credentials
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        with pytest.raises(ClusterError) as failed:
            build(load_spec(remote_project), scheduler=cluster.scheduler_address)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("worker tcp://127.0.0.1:"), message
    assert f"cannot read the source s3://{s3.name}/raw/" in message
    assert "no s3 credentials found" in message
    assert secret not in message
    assert not (remote_project.parent / "releases" / "cells.h5").exists()


def test_workers_started_before_the_credentials_were_set_are_replaced(
    s3: Bucket, remote_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    pool.warm_up(2)  # a build before, in this process: its workers have no credentials
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    report = build(load_spec(remote_project), jobs=2)
    assert report.rejects == []
    assert sum(report.samples.values()) == 10


def _nifti_project(root: Path, ct: str, masks: str) -> Path:
    data: dict[str, Any] = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {
            "ct": {"dir": ct, "glob": "*.nii.gz"},
            "mask": {"dir": masks, "glob": "*.nii.gz"},
        },
        "splits": {"train": 1.0},
        "seed": 1,
        "fields": {
            "ct": {"slice_shape": [8, 8]},
            "mask": {"slice_shape": [8, 8], "values": [0, 1, 2]},
        },
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def test_nifti_volumes_on_the_server_are_stored_as_from_local_disk(
    s3: Bucket, tmp_path: Path
) -> None:
    volumes = pytest.importorskip("h5etl.examples.volumes")
    pytest.importorskip("nibabel")
    rng = np.random.default_rng(4)
    raw = tmp_path / "raw"
    for index in range(3):
        ct, labels = volumes.ct_case(rng, (int(rng.integers(3, 6)), 8, 8))
        affine = volumes.series_affine((2.5, 0.8, 0.7))
        volumes.write_nifti(raw / "ct" / f"case_{index}.nii.gz", ct, affine=affine)
        volumes.write_nifti(raw / "masks" / f"case_{index}.nii.gz", labels, affine=affine)
    for path in sorted(raw.rglob("*.nii.gz")):
        s3.put(path.relative_to(tmp_path).as_posix(), path.read_bytes())
    local = build(
        load_spec(_nifti_project(tmp_path / "local", str(raw / "ct"), str(raw / "masks")))
    )
    url = f"s3://{s3.name}/raw"
    remote = build(
        load_spec(_nifti_project(tmp_path / "remote", f"{url}/ct", f"{url}/masks")), jobs=2
    )
    assert local.path is not None
    assert remote.path is not None
    assert remote.rejects == local.rejects == []
    ours, theirs = read_release(local.path), read_release(remote.path)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


@pytest.mark.parametrize(("url", "backend"), [("gs://lab/raw", "gcsfs"), ("az://lab/raw", "adlfs")])
def test_another_store_without_its_backend_is_one_line_naming_the_extra(
    write_config: WriteConfig, tmp_path: Path, url: str, backend: str
) -> None:
    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed here")
    sources = {"image": {"dir": f"{url}/images"}, "mask": {"dir": f"{url}/masks"}}
    code, lines = _cli("validate", str(write_config(tmp_path, sources=sources)))
    assert code == 2
    assert len(lines) == 1, lines
    assert f"sources.image.dir: {url}/images" in lines[0]
    assert f"needs {backend}" in lines[0]
    assert "pip install 'h5etl[cloud]'" in lines[0]


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("s3://KEY:SECRET@lab/raw", "must not carry credentials"),
        ("https://lab.example.org/raw?X-Amz-Signature=abc", "query string is not accepted"),
        ("s3://Lab_Bucket/raw", "not a valid S3 bucket name"),
        ("ftp://lab/raw", "unknown URL scheme"),
    ],
)
def test_a_url_the_build_cannot_use_is_refused_at_validate(
    write_config: WriteConfig, tmp_path: Path, url: str, refused: str
) -> None:
    sources = {"image": {"dir": url}, "mask": {"dir": url}}
    code, lines = _cli("validate", str(write_config(tmp_path, sources=sources)))
    assert code == 2
    assert any(refused in line for line in lines), lines
    assert not any("SECRET" in line or "abc" in line for line in lines), lines


def test_a_dry_run_probes_the_objects_headers(s3: Bucket, remote_project: Path) -> None:
    s3.put("raw/images/s004.png", b"not a png at all")
    code, lines = _cli("build", str(remote_project), "--dry-run", "-j", "2")
    assert code == 0, lines
    text = "\n".join(lines)
    assert "unreadable" in text
    assert not (remote_project.parent / "releases" / "cells.h5").exists()


def test_a_label_table_on_object_storage_is_refused_at_validate(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    table = {"table": "s3://lab/labels.csv", "key": "file", "column": "label"}
    label = {"kind": "label", "from": table}
    config = write_config(tmp_path, fields={"label": label})
    code, lines = _cli("validate", str(config))
    assert code == 2
    assert len(lines) == 1, lines
    assert "fields.label.from.table" in lines[0]
    assert "a table on object storage is not supported yet" in lines[0]


def test_a_series_field_on_object_storage_is_refused_at_validate(tmp_path: Path) -> None:
    root = Path(__file__).parents[2]
    data = yaml.safe_load((root / "configs" / "vibration.yaml").read_text())
    data["sources"]["recording"] = {"dir": "s3://lab/raw/recordings", "glob": "*.npy"}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    code, lines = _cli("validate", str(config))
    assert code == 2
    text = "\n".join(lines)
    assert "a series field cannot read a source on object storage yet" in text, text
