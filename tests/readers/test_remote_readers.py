"""Readers over object storage: a release built by h5etl, published to the test S3 server
(moto, a real process on localhost) and read back by every reader through its pointer.

Every test compares what the remote reader yields with the same release read locally by h5py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from s3_server import Bucket
from test_readers import FIELDS, build_release, direct

from h5etl.readers import ReaderError, Release, iter_batches
from h5etl.remote import publish


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release of 22 samples in chunks of 4, Blosc (decoded outside HDF5); the real file."""
    link = build_release(tmp_path_factory.mktemp("remote"), 22, compression="blosc")
    return link.resolve()


def test_release_reads_a_published_release_as_the_local_file(s3: Bucket, built: Path) -> None:
    publish.publish(built, s3.location("releases"), "cells")
    truth = direct(built)
    reader = Release(f"s3://{s3.name}/releases/cells.h5", "train", batch_size=4)
    assert reader.path == f"s3://{s3.name}/releases/cells-v0001.h5"
    assert reader.source.sha256 == hashlib.sha256(built.read_bytes()).hexdigest()
    got = reader.read(np.arange(len(reader))[::-1])
    for field in FIELDS:
        np.testing.assert_array_equal(got[field], truth[field][::-1])
    assert reader._stores  # the Blosc chunks decoded outside HDF5, from range reads
    batches = list(iter_batches(f"s3://{s3.name}/releases/cells.h5", "train", 5))
    assert sum(len(b["image"]) for b in batches) == len(reader)
    reader.close()
