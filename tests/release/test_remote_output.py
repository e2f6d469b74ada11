"""Builds into ``output: s3://...`` against the tests' S3 server (moto), compared with local
builds of the same inputs: upload + pointer, companions, the lock, incremental builds that take
their parent (and its carry record) from the bucket, and the faults of a publish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, add_pairs, dataset_digests
from s3_proxy import proxy
from s3_server import Bucket
from typer.testing import CliRunner

from h5etl import build, load_spec
from h5etl.cli.app import app
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

    from h5etl.readers import Release  # a reader of the link's URL reads what was built

    reader, truth = (
        Release(f"s3://{s3.name}/releases/cells.h5", "train"),
        Release(local.path, "train"),
    )
    rows = np.arange(len(truth))
    read, want = reader.read(rows), truth.read(rows)
    assert reader.path == remote.url
    for field in ("image", "mask"):
        np.testing.assert_array_equal(read[field], want[field])
    reader.close()
    truth.close()


def test_an_incremental_build_on_another_host_takes_its_parent_from_the_bucket(
    s3: Bucket,
    work: Path,
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = make_raw(tmp_path, n=8)
    local_config = write_config(tmp_path, config_name="local.yaml")
    remote_config = write_config(tmp_path, output=f"s3://{s3.name}/releases")
    built(local_config)
    built(remote_config)
    add_pairs(raw.root, ["t000", "t001", "t002"], seed=5)
    local = built(local_config)
    monkeypatch.setenv("H5ETL_WORK_DIR", str(tmp_path / "another-host"))  # nothing cached
    remote = built(remote_config)

    assert local.reused > 0  # carried from the parent, not decoded
    assert (remote.version, remote.reused, remote.change) == (2, local.reused, local.change)
    got = download(s3, "releases/cells-v0002.h5", tmp_path / "got.h5")
    assert local.path is not None
    assert dataset_digests(got) == dataset_digests(local.path)
    assert json.loads(s3.get("releases/cells.h5.json"))["file"] == "cells-v0002.h5"

    monkeypatch.setenv("H5ETL_WORK_DIR", str(tmp_path / "a-third-host"))
    again = built(remote_config)
    assert again.up_to_date
    assert again.version == 2
    assert "releases/cells-v0003.h5" not in list(s3.keys())


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5etl", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
        timeout=300,
    )


def test_the_server_stopped_mid_upload_publishes_nothing_and_the_next_build_works(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    config = write_config(tmp_path, output=f"s3://{s3.name}/releases")
    built(config)
    add_pairs(raw.root, ["t000", "t001"], seed=3)
    upload = f"PUT /{s3.name}/releases/cells-v0002.h5".encode()
    with proxy(s3.server.endpoint, stop_on=upload) as server:
        done = cli("build", config, env={"AWS_ENDPOINT_URL": server.endpoint, **NO_RETRIES})
        assert server.stopped.is_set()  # it stopped during the upload, not before
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, done.stderr
    assert "cells-v0002.h5" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    keys = s3.keys()
    assert "releases/cells-v0002.h5" not in keys
    assert json.loads(s3.get("releases/cells.h5.json"))["file"] == "cells-v0001.h5"
    assert keys.count("releases/.cells.lock") == 1  # the dead build's: taken by the next

    again = built(config)
    assert again.version == 2
    assert again.reused > 0
    assert json.loads(s3.get("releases/cells.h5.json"))["file"] == "cells-v0002.h5"
    assert ".cells.lock" not in " ".join(s3.keys())


NO_RETRIES = {"AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}


def error_of(*args: str | Path) -> tuple[int, str]:
    """The exit code and the one error line of an h5etl command run here."""
    result = CliRunner().invoke(app, [str(a) for a in args], prog_name="h5etl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    errors = [line for line in result.output.splitlines() if line.startswith("h5etl: error: ")]
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output
    return result.exit_code, errors[0]


def test_wrong_credentials_are_one_line_and_exit_2(
    s3_auth: Bucket,
    work: Path,
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_raw(tmp_path, n=3)
    config = write_config(tmp_path, output=f"s3://{s3_auth.name}/releases")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    code, line = error_of("build", config)
    assert code == 2, line
    assert "refused the credentials" in line, line
    assert "not-the-secret" not in line
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_auth.server.secret)
    assert s3_auth.keys() == []  # nothing was written, no lock left


def test_a_missing_bucket_is_one_line_and_exit_2(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    config = write_config(tmp_path, output="s3://h5etl-no-such-bucket/releases")
    code, line = error_of("build", config)
    assert code == 2, line
    assert "no such bucket 'h5etl-no-such-bucket'" in line, line


def test_a_damaged_pointer_is_one_line_and_stays_as_it_is(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    config = write_config(tmp_path, output=f"s3://{s3.name}/releases")
    built(config)
    s3.put("releases/cells.h5.json", b"{not json")
    code, line = error_of("build", config)
    assert code == 1, line
    assert "releases/cells.h5.json" in line, line
    assert s3.get("releases/cells.h5.json") == b"{not json"
    assert "releases/cells-v0002.h5" not in list(s3.keys())
    link = f"s3://{s3.name}/releases/cells.h5"
    code, line = error_of("check", link)
    assert code == 1, line
    assert "not a readable release pointer" in line, line

    s3.client.delete_object(Bucket=s3.name, Key="releases/cells.h5.json")
    code, line = error_of("check", link)
    assert code == 2, line
    assert "no release of 'cells' is published there" in line, line


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], prog_name="h5etl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_the_release_commands_take_a_url(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=4)
    config = write_config(tmp_path, output=f"s3://{s3.name}/releases")
    local_config = write_config(tmp_path, config_name="local.yaml")
    for seed in (1, 2):
        built(config)
        built(local_config)
        add_pairs(raw.root, [f"t{seed}"], seed=seed)
    built(config)
    folder, link = f"s3://{s3.name}/releases", f"s3://{s3.name}/releases/cells.h5"

    code, out = invoke("releases", folder)
    assert code == 0, out
    lines = out.splitlines()
    assert [line[2:].split()[0] for line in lines] == [f"cells-v000{v}.h5" for v in (1, 2, 3)]
    assert [line[0] for line in lines] == [" ", " ", "*"]  # the pointer names v0003
    code, out = invoke("check", link)
    assert code == 0, out
    assert "ok" in out.splitlines()[-1].lower(), out
    code, out = invoke("diff", f"{folder}/cells-v0002.h5", tmp_path / "releases" / "cells.h5")
    assert code == 0, out
    assert "samples: the same" in out, out  # the same inputs built locally: only where to
    assert f"output: 's3://{s3.name}/releases' -> 'releases'" in out, out

    code, out = invoke("rollback", link)
    assert (code, out.strip()) == (0, f"{link} -> cells-v0002.h5")
    assert json.loads(s3.get("releases/cells.h5.json"))["file"] == "cells-v0002.h5"
    code, out = invoke("prune", folder, "--keep", "1", "--yes")
    assert code == 0, out
    assert s3.keys() == [  # v0002: the current; v0003: the newest; v0001 gone with its files
        "releases/.cells-v0002.h5.carry.json",
        "releases/.cells-v0003.h5.carry.json",
        "releases/cells-v0002.build.json",
        "releases/cells-v0002.h5",
        "releases/cells-v0002.rejects.jsonl",
        "releases/cells-v0003.build.json",
        "releases/cells-v0003.h5",
        "releases/cells-v0003.rejects.jsonl",
        "releases/cells.h5.json",
    ]
    code, out = invoke("status", folder)
    assert code == 0, out
    assert "cells" in out, out


def test_the_lock_object_keeps_builds_apart_and_goes_on_every_exit(
    s3: Bucket, work: Path, tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4, broken=["truncated"])
    config = write_config(tmp_path, output=f"s3://{s3.name}/releases", on_error="fail")
    code, line = error_of("build", config)  # the build fails: the lock goes all the same
    assert code == 1, line
    assert "no release was made" in line, line
    assert s3.keys() == []

    elsewhere = {"pid": 1, "host": "another-host", "started": "2026-12-04T00:00:00+00:00"}
    s3.put("releases/.cells.lock", json.dumps(elsewhere).encode())
    code, line = error_of("build", write_config(tmp_path, output=f"s3://{s3.name}/releases"))
    assert code == 1, line
    assert "another build of 'cells' is running (pid 1 on another-host" in line, line
    assert s3.keys() == ["releases/.cells.lock"]  # its lock untouched, nothing published
