"""The loss guards count in the unit they name (issue 25 verification, B1 and B2).

B1: a recording cut into windows is one input file: its rejected windows count once against
``max_rejects`` (files against files), and the summary says files and samples apart.
B2: a plain ``--dry-run`` whose header probes reject every file of a class fails on the
empty class as ``--dry-run --decode`` and the build do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml
from typer.testing import CliRunner, Result

from h5etl.cli import app


def cli(*args: object) -> Result:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _recording(folder: Path, rng: np.random.Generator, nan_at: tuple[int, ...] = ()) -> None:
    """6 s: accel 100 Hz (n, 3) with NaN at ``nan_at`` rows, volts 10 Hz."""
    folder.mkdir(parents=True)
    accel = rng.normal(size=(600, 3)).astype(np.float32)
    accel[list(nan_at), 0] = np.nan
    np.save(folder / "accel.npy", accel)
    volts = rng.normal(size=60).round(3)
    (folder / "volts.csv").write_text("v\n" + "".join(f"{v}\n" for v in volts))


def _series_config(root: Path, **over: Any) -> Path:
    config = {
        "name": "rig",
        "pipeline": "series",
        "output": "releases",
        "sources": {"recording": {"dir": "raw", "entries": "folders"}},
        "fields": {
            "recording": {
                "channels": {
                    "accel": {
                        "file": "accel.npy",
                        "rate_hz": 100,
                        "dtype": "float32",
                        "shape": [3],
                    },
                    "volts": {"file": "volts.csv", "rate_hz": 10, "columns": ["v"]},
                },
                "window": {"seconds": 2, "stride": 1},
            }
        },
        "splits": {"train": 1.0},
        **over,
    }
    path = root / "rig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_windows_of_one_recording_count_as_one_rejected_file(tmp_path: Path) -> None:
    # 4 recordings of 5 windows (2 s, stride 1 s); NaNs at 0.5, 2.5, 4.5 s spoil every
    # window of r0: one input file of four, however many of its windows were rejected
    rng = np.random.default_rng(0)
    for name in ("r0", "r1", "r2", "r3"):
        _recording(tmp_path / "raw" / name, rng, (50, 250, 450) if name == "r0" else ())
    config = _series_config(tmp_path, max_rejects=1)
    result = cli("build", "-j", 1, config)
    assert result.exit_code == 0, result.output
    assert "rejects: 1 file, 5 samples (non_finite 5)" in result.stdout
    with h5py.File(tmp_path / "releases" / "rig-v0001.h5", "r") as handle:
        names = sorted(handle["train"]["filename"].asstr()[...])
    assert names == sorted(n for n in ("r1", "r2", "r3") for _ in range(5))
    # a share: 1 of 4 files is 25 %, over 0.2, and the line says files and samples apart
    refused = cli(
        "build", "-j", 1, _series_config(tmp_path, max_rejects=0.2), "--dry-run", "--decode"
    )
    assert refused.exit_code == 1, refused.output
    assert "1 of 4 input files rejected (25%), 5 samples, over max_rejects 0.2" in refused.stderr
