"""Dask workers run a transform beside the config from the bytes its spec carries, and draw
the parent's random numbers (issue 28, items 2 and 4)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from h5etl.transforms.apply import FieldChain, Transforms, apply_transforms
from h5etl.transforms.loading import Loader

distributed = pytest.importorskip("distributed")

PREP = """
def noisy(value, *, scale, rng):
    return value + rng.normal(0, scale, value.shape)
"""


def test_dask_workers_draw_what_the_parent_draws_without_the_file(tmp_path: Path) -> None:
    (tmp_path / "prep.py").write_text(textwrap.dedent(PREP))
    chain = FieldChain("ct", (Loader(tmp_path).resolve("prep:noisy", {"scale": 3.0}),))
    transforms = Transforms(11, chains=(chain,))
    volume = np.arange(4 * 5 * 6, dtype=np.float64).reshape(4, 5, 6)
    keys = [f"case{i}" for i in range(4)]
    here = [apply_transforms(transforms, key, {"ct": volume})["ct"] for key in keys]
    (tmp_path / "prep.py").unlink()  # a worker on another machine would not see it either
    with (
        distributed.LocalCluster(
            n_workers=1,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        futures = [client.submit(apply_transforms, transforms, key, {"ct": volume}) for key in keys]
        there = client.gather(futures)
    for mine, theirs in zip(here, there, strict=True):
        np.testing.assert_array_equal(mine, theirs["ct"])
