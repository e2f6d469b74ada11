"""Releases built before field kinds (h5etl 0.1, commit 7ae8f1a) still open everywhere.

The two files in tests/data were built by that version from ten 10..16 px image/mask pairs
(one broken pair), once with its default codec (Blosc-LZ4) and once with lzf; they hold no
layout record, no ``kind`` attributes and no statistics.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (the Blosc filter, for reading the expectation with h5py)
import numpy as np
import pytest
from typer.testing import CliRunner

from h5etl.check.health import check_release
from h5etl.cli.app import app
from h5etl.format import contract as fileformat
from h5etl.preview.sheet import write_preview
from h5etl.readers import Release, iter_batches

DATA = Path(__file__).parents[1] / "data"
OLD = [
    pytest.param(DATA / "cells-0.1-blosc.h5", id="blosc"),
    pytest.param(DATA / "cells-0.1-lzf.h5", id="lzf"),
]


@pytest.fixture(params=OLD)
def old_release(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    copy = tmp_path / Path(request.param).name  # read-only use, but never touch the fixture
    shutil.copyfile(request.param, copy)
    return copy


def test_the_fixtures_are_what_0_1_wrote(old_release: Path) -> None:
    with h5py.File(old_release, "r") as handle:
        assert handle.attrs["h5etl_version"] == "0.1.0"
        assert fileformat.LAYOUT_ATTR not in handle.attrs
        assert "kind" not in handle["train/image"].attrs


def test_layout_is_inferred_as_that_version_laid_it_out(old_release: Path) -> None:
    with h5py.File(old_release, "r") as handle:
        record = fileformat.read_layout(handle)
    assert record.inferred
    assert record.template == "{split}/{field}"
    assert set(record.splits) == {"train", "valid"}
    kinds = {name: field.kind for name, field in record.fields.items()}
    assert kinds == {"image": "image", "mask": "mask", "filename": "text"}
    assert record.fields["mask"].extra["values"] == [0, 1]


def test_check_deep_passes(old_release: Path) -> None:
    report = check_release(old_release, deep=True)
    assert report.ok, report.lines
    assert any("all SHA-256 digests equal" in line for line in report.lines)
    result = CliRunner().invoke(app, ["check", "--deep", str(old_release)])
    assert result.exit_code == 0, result.output


def test_readers_return_what_h5py_reads(old_release: Path) -> None:
    with h5py.File(old_release, "r") as handle:
        expected = {name: handle[f"train/{name}"][...] for name in ("image", "mask", "filename")}
    release = Release(old_release, "train")
    assert set(release.fields) == {"image", "mask", "filename"}
    got = release.read_slice(0, len(release))
    np.testing.assert_array_equal(got["image"], expected["image"])
    np.testing.assert_array_equal(got["mask"], expected["mask"])
    assert [str(n) for n in got["filename"]] == [n.decode() for n in expected["filename"]]
    batches = list(iter_batches(old_release, "train", batch_size=3, shuffle=False))
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in batches]), expected["image"])


def test_preview_draws_it(old_release: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    write_preview(old_release, out, split="train", n=4)
    assert out.stat().st_size > 0
