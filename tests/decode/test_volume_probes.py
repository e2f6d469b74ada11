"""A plain ``--dry-run`` of volumes reads their headers (issue 25, item 11): what headers show
(a file that is no DICOM, a missing slice, a label volume of another shape or grid, a NIfTI
of four dimensions or cut short) is rejected there with the reason the build gives, and the
dry run says what it could not check. Real DICOM (pydicom) and NIfTI (nibabel) files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import nibabel
import numpy as np
import yaml

import h5etl
from h5etl.examples.volumes import ct_case, series_affine, write_dicom_series, write_nifti

SHAPE = (5, 10, 12)  # (z, y, x)


def raw_folder(root: Path) -> dict[str, str]:
    """DICOM series with NIfTI label volumes, a few broken; returns case -> expected reason."""
    rng = np.random.default_rng(5)
    volume, labels = ct_case(rng, SHAPE)
    grid = series_affine()
    for name in ("good_a", "good_b", "no_dicom", "gap", "short", "shifted", "four_d", "cut"):
        positions = [0, 2.5, 5, 10, 12.5] if name == "gap" else None  # 7.5 mm missing
        write_dicom_series(root / "raw/ct" / name, volume, positions=positions, series=name)
        mask = root / "raw/masks" / f"{name}.nii"
        if name == "short":
            write_nifti(mask, labels[:, :8], affine=grid)  # 8 rows, its image 10
        elif name == "shifted":
            moved = grid.copy()
            moved[:3, 3] += [0.0, 4.0, 0.0]
            write_nifti(mask, labels, affine=moved)
        elif name == "four_d":
            stacked = np.stack([labels.transpose(2, 1, 0)] * 2, axis=-1)
            nibabel.save(nibabel.Nifti1Image(stacked, grid), str(mask))
        else:
            write_nifti(mask, labels, affine=grid)
    (root / "raw/ct/no_dicom/IM0002.dcm").write_bytes(b"plain text, no DICOM\n")
    cut = root / "raw/masks/cut.nii"
    cut.write_bytes(cut.read_bytes()[:-100])  # an uncompressed NIfTI shows this in its size
    return {
        "no_dicom": "unreadable",
        "gap": "slice_gap",
        "short": "size_mismatch",
        "shifted": "geometry_mismatch",
        "four_d": "unsupported",
        "cut": "truncated",
    }


def config(root: Path) -> Path:
    data: dict[str, Any] = {
        "name": "ct",
        "pipeline": "volumes",
        "sources": {
            "ct": {"dir": "raw/ct", "entries": "folders"},
            "mask": {"dir": "raw/masks", "glob": "*.nii"},
        },
        "splits": {"train": 1.0},
        "fields": {
            "ct": {"slice_shape": list(SHAPE[1:])},
            "mask": {"slice_shape": list(SHAPE[1:]), "values": [0, 1, 2]},
        },
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def culprits(report: h5etl.BuildReport) -> dict[str, str]:
    """Each rejected case's reason (both of its files are rejects, with the same reason)."""
    found = {(Path(r.path).name.removesuffix(".nii"), r.reason) for r in report.rejects}
    return dict(sorted(found))


def test_a_plain_dry_run_finds_what_volume_headers_show(tmp_path: Path) -> None:
    expected = raw_folder(tmp_path)
    spec = h5etl.load_spec(config(tmp_path))
    plain = h5etl.build(spec, jobs=1, dry_run=True)
    decoded = h5etl.build(spec, jobs=1, dry_run=True, decode=True)
    assert len(culprits(plain)) == len(plain.rejects) // 2  # one reason per case
    assert culprits(plain) == culprits(decoded) == dict(sorted(expected.items()))
    assert plain.samples == decoded.samples == {"train": 2}
    assert len(plain.rejects) == len(decoded.rejects) == 2 * len(expected)
    assert any(c.startswith("volume headers") for c in plain.checks)
    detail = {Path(r.path).name: r.detail for r in plain.rejects}
    assert "IM0002.dcm" in detail["no_dicom"]
    assert "1 slice missing between 5 mm" in detail["gap"]
    assert "100 bytes early" in detail["cut.nii"]


def test_the_dry_run_says_what_it_checked_and_what_not(tmp_path: Path) -> None:
    raw_folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config(tmp_path)), "--dry-run", "-j", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "rejects: 12 files" in out
    assert "volume headers (" in out
    assert "voxel data" in out  # what no header shows, said plainly
    assert "--dry-run --decode predicts it exactly" in out


def test_the_dry_run_names_fields_no_header_probe_reads(tmp_path: Path) -> None:
    # a sensor series has no header probe: the dry run says so, naming the field
    for name in ("a", "b"):
        folder = tmp_path / "raw/rec" / name
        folder.mkdir(parents=True)
        np.save(folder / "accel.npy", np.zeros((100, 3), np.float32))
    data: dict[str, Any] = {
        "name": "vib",
        "pipeline": "series",
        "sources": {"rec": {"dir": "raw/rec", "entries": "folders"}},
        "splits": {"train": 1.0},
        "fields": {
            "rec": {
                "kind": "series",
                "channels": {"accel": {"file": "accel.npy", "rate_hz": 50, "shape": [3]}},
            },
            "filename": {"kind": "text"},
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    report = h5etl.build(h5etl.load_spec(path), jobs=1, dry_run=True)
    assert any(w.startswith("fields rec (series): no header probe") for w in report.warnings), (
        report.warnings
    )
    assert not any(c.startswith("volume headers") for c in report.checks)
