"""Sources on object storage (issue 29 item 1): ``dir: s3://...`` against the moto server.

A cells-like raw folder is uploaded to the bucket; a build from it must store exactly what a
build from the same files on local disk stores (the datasets, the lineage digests), each
worker reading the objects itself; an incremental build decodes only a changed object; an
object replaced during a build is rejected, never mixed in; a missing bucket or refused
credentials stop before anything is built, in one line.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import RawFolder, read_release
from s3_server import Bucket

from h5etl import ConfigError, build, load_spec
from h5etl.cli.app import app

pytest.importorskip("s3fs", reason="needs the cloud extra: pip install 'h5etl[cloud]'")


def _upload(raw: RawFolder, bucket: Bucket) -> None:
    """The raw folder's files as objects ``raw/images/...``, ``raw/masks/...``."""
    for folder in (raw.images, raw.masks):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                bucket.put(path.relative_to(raw.root).as_posix(), path.read_bytes())


def _remote_config(write_config, root: Path, bucket: Bucket, **overrides) -> Path:  # type: ignore[no-untyped-def]
    sources = {
        "image": {"dir": f"s3://{bucket.name}/raw/images"},
        "mask": {"dir": f"s3://{bucket.name}/raw/masks"},
    }
    return write_config(root, sources=sources, **overrides)  # type: ignore[no-any-return]


def test_a_build_from_the_bucket_stores_what_a_local_build_stores(
    s3: Bucket, make_raw, write_config, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    local_root, remote_root = tmp_path / "local", tmp_path / "remote"
    local_root.mkdir()
    remote_root.mkdir()
    raw = make_raw(local_root, n=10)
    _upload(raw, s3)
    local = build(load_spec(write_config(local_root)), jobs=1)
    remote = build(load_spec(_remote_config(write_config, remote_root, s3)), jobs=2)
    ours, theirs = read_release(local.path), read_release(remote.path)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert remote.samples == local.samples
