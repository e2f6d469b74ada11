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
import pytest
import yaml
from typer.testing import CliRunner, Result

from h5etl.cli.app import app


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


def _png(path: Path, rng: np.random.Generator) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)).save(path)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def _labelled(root: Path, table: bool) -> Path:
    """12 PNGs of classes ant/bee/owl, labelled by folder or by a table; every owl truncated."""
    rng = np.random.default_rng(5)
    rows = []
    for name in ("ant", "bee", "owl"):
        for i in range(4):
            relpath = f"{name}_{i}.png" if table else f"{name}/{name}_{i}.png"
            _png(root / "raw" / relpath, rng)
            rows.append(f"{relpath},{name}\n")
            if name == "owl":
                _truncate(root / "raw" / relpath)
    label: dict[str, Any] = {"kind": "label", "source": "image", "from": "folder"}
    if table:
        (root / "labels.csv").write_text("file,label\n" + "".join(rows))
        table_of = {"table": "labels.csv", "key": "file", "column": "label"}
        label = {"kind": "label", "source": "image", "from": table_of}
    config = {
        "name": "pets",
        "sources": {"image": {"dir": "raw", "glob": "*.png" if table else "*/*.png"}},
        "splits": {"train": 0.75, "valid": 0.25},
        "fields": {"image": {"kind": "image", "shape": [3, 8, 8], "mode": "RGB"}, "label": label},
        "max_rejects": 4,
    }
    path = root / "pets.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("table", [False, True], ids=["class-folders", "label-table"])
def test_a_plain_dry_run_fails_on_a_class_its_header_checks_emptied(
    tmp_path: Path, table: bool
) -> None:
    config = _labelled(tmp_path, table)
    for decode in ((), ("--decode",)):
        dry = cli("build", "-j", 1, "--dry-run", *decode, config)
        assert dry.exit_code == 1, dry.output
        assert "class 'owl' of field 'label' is empty" in dry.stderr
        # the rejected files' rows match their files: no "match no input file" warning
        assert "match no input" not in dry.output
    assert not (tmp_path / "releases").exists() or not list((tmp_path / "releases").glob("*.h5"))


def test_table_rows_of_rejected_files_are_not_said_to_match_no_file(tmp_path: Path) -> None:
    config = _labelled(tmp_path, table=True)
    for i in range(1, 4):  # one owl truncated, the others whole again
        _png(tmp_path / "raw" / f"owl_{i}.png", np.random.default_rng(i))
    dry = cli("build", "-j", 1, "--dry-run", config)
    assert dry.exit_code == 0, dry.output
    assert "rejects: 1 file (truncated 1)" in dry.stdout
    assert "match no input" not in dry.output
