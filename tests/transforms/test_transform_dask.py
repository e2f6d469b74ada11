"""Dask workers run a transform beside the config from the bytes its spec carries, and draw
the parent's random numbers (issue 28, items 2 and 4)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, read_release

import h5etl
from h5etl.transforms.apply import FieldChain, Transforms, apply_transforms
from h5etl.transforms.loading import Loader

distributed = pytest.importorskip("distributed")

PREP = """
def noisy(value, *, scale, rng):
    return value + rng.normal(0, scale, value.shape)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with distributed.LocalCluster(
        n_workers=1,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=":0",
    ) as local:
        yield local


def test_dask_workers_draw_what_the_parent_draws_without_the_file(
    tmp_path: Path, cluster: Any
) -> None:
    (tmp_path / "prep.py").write_text(textwrap.dedent(PREP))
    chain = FieldChain("ct", (Loader(tmp_path).resolve("prep:noisy", {"scale": 3.0}),))
    transforms = Transforms(11, chains=(chain,))
    volume = np.arange(4 * 5 * 6, dtype=np.float64).reshape(4, 5, 6)
    keys = [f"case{i}" for i in range(4)]
    here = [apply_transforms(transforms, key, {"ct": volume})["ct"] for key in keys]
    (tmp_path / "prep.py").unlink()  # a worker on another machine would not see it either
    with distributed.Client(cluster, set_as_default=False) as client:
        futures = [client.submit(apply_transforms, transforms, key, {"ct": volume}) for key in keys]
        there = client.gather(futures)
    for mine, theirs in zip(here, there, strict=True):
        np.testing.assert_array_equal(mine, theirs["ct"])


IMAGE_NOISE = """
import numpy as np


def noise(value, *, scale, rng):
    drawn = rng.integers(-scale, scale + 1, value.shape)
    return np.clip(value.astype(np.int16) + drawn, 0, 255).astype(np.uint8)
"""


def assert_same_datasets(mine: Path | None, theirs: Path | None) -> None:
    """Both releases exist and hold the same datasets with the same values."""
    assert mine is not None
    assert theirs is not None
    ours, other = read_release(mine), read_release(theirs)
    assert ours.keys() == other.keys()
    for name, data in ours.items():
        np.testing.assert_array_equal(data, other[name], err_msg=name)


def test_a_dask_build_stores_the_bytes_of_a_local_one(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    make_raw(tmp_path, n=6)
    (tmp_path / "prep.py").write_text(IMAGE_NOISE)
    noisy = {"image": {"transform": [{"call": "prep:noise", "args": {"scale": 9}}]}}
    local = h5etl.build(h5etl.load_spec(write_config(tmp_path, fields=noisy)), jobs=1)
    spec = h5etl.load_spec(write_config(tmp_path, fields=noisy, output="dask"))
    remote = h5etl.build(spec, scheduler=cluster.scheduler_address)
    assert_same_datasets(local.path, remote.path)


def test_a_dask_build_makes_again_only_the_changed_field(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An incremental build on the cluster after the image's args changed: the image made
    again there (the narrowed recipe travels), the rest carried; a local --full build of the
    same config stores the same values (issue 28 item 5)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    make_raw(tmp_path, n=6)
    (tmp_path / "prep.py").write_text(IMAGE_NOISE)

    def noisy(scale: int, output: str) -> h5etl.Spec:
        fields = {"image": {"transform": [{"call": "prep:noise", "args": {"scale": scale}}]}}
        return h5etl.load_spec(write_config(tmp_path, fields=fields, output=output))

    h5etl.build(noisy(9, "dask"), scheduler=cluster.scheduler_address)
    remote = h5etl.build(noisy(4, "dask"), scheduler=cluster.scheduler_address)
    assert (remote.reused, remote.redone) == (6, ("image",))
    local = h5etl.build(noisy(4, "local"), jobs=1, full=True)
    assert_same_datasets(local.path, remote.path)


def test_a_worker_that_cannot_import_the_module_stops_the_build_in_one_line(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An installed module the parent imports and the workers cannot (not on their path):
    the build stops, naming the call; no release, no reject per sample."""
    make_raw(tmp_path, n=6)
    package = tmp_path / "only_here"
    package.mkdir()
    (package / "h5etl_only_here_prep.py").write_text(IMAGE_NOISE)
    monkeypatch.syspath_prepend(str(package))
    noisy = {"image": {"transform": [{"call": "h5etl_only_here_prep:noise", "args": {"scale": 1}}]}}
    spec = h5etl.load_spec(write_config(tmp_path, fields=noisy))
    with pytest.raises(h5etl.H5EtlError) as caught:
        h5etl.build(spec, scheduler=cluster.scheduler_address)
    assert "h5etl_only_here_prep" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not list((tmp_path / "releases").glob("*.h5"))
