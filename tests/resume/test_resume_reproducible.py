"""A build killed at a checkpoint and continued with ``--resume`` is the same file, byte for
byte, as one never killed (SOURCE_DATE_EPOCH set), for NIfTI volumes with enough slices that
a checkpoint's chunk lookups once moved later chunks. Every kind's own resume check is its
contract test (``h5etl.testing.KindContractTests``, inherited in tests/kinds/)."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

import h5etl
import h5etl.plan.tasks
from h5etl.examples.volumes import ct_case, write_nifti
from h5etl.history import clock
from h5etl.testing import run_killed_build

EPOCH = "1700000000"


def nifti_volumes(folder: Path, cases: int = 30, side: int = 32) -> Path:
    """``pipeline: volumes`` of NIfTI CT cases (10-19 slices) with NIfTI label volumes, as
    the issue's; enough slices (440) that a checkpoint's lookups once moved later chunks."""
    rng = np.random.default_rng(0)
    for index in range(cases):
        volume, labels = ct_case(rng, (int(rng.integers(10, 20)), side, side))
        write_nifti(folder / "raw/ct" / f"case_{index:03d}.nii.gz", volume)
        write_nifti(folder / "raw/masks" / f"case_{index:03d}.nii.gz", labels)
    config = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {
            "ct": {"dir": "raw/ct", "glob": "*.nii.gz"},
            "mask": {"dir": "raw/masks", "glob": "*.nii.gz"},
        },
        "splits": {"train": 0.8, "valid": 0.2},
        "seed": 1,
        "fields": {
            "ct": {"slice_shape": [side, side]},
            "mask": {"slice_shape": [side, side], "values": [0, 1, 2]},
        },
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config), "utf-8")
    return path


def test_a_resumed_volume_build_is_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A volume build resumed after a kill was another file (its datasets equal): a checkpoint
    # looked its chunks up by coordinates, which moved where HDF5 put the later chunks, so
    # the layout followed the checkpoints' times, and a resumed build's fall elsewhere. Here
    # the reference never checkpoints; the killed and the resumed build after every task.
    monkeypatch.setattr(h5etl.plan.tasks, "TASK_SAMPLES", 2)  # as the killed build cuts its tasks
    monkeypatch.setenv(clock.ENV, EPOCH)  # the killed build inherits it
    reference = h5etl.build(
        h5etl.load_spec(nifti_volumes(tmp_path / "reference")),
        checkpoint_seconds=1e9,
    )
    assert reference.path is not None
    config = nifti_volumes(tmp_path / "killed")
    assert run_killed_build(config, 6) == -signal.SIGKILL
    resumed = h5etl.build(h5etl.load_spec(config), resume=True, checkpoint_seconds=0)
    assert resumed.path is not None
    assert 0 < resumed.resumed < sum(resumed.samples.values())
    assert resumed.path.read_bytes() == reference.path.read_bytes()
