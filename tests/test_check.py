"""``check``: a read-only health report; ``--deep`` finds damaged bytes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner

from h5etl import build, load_spec
from h5etl.check import check_release
from h5etl.cli import app


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One release, built once; tests copy it before damaging it."""
    from conftest import _make_raw, _write_config

    root = tmp_path_factory.mktemp("check")
    _make_raw(root, n=9, broken=["orphan_mask", "mask_128"])
    report = build(load_spec(_write_config(root, storage={"compression": "gzip"})), jobs=1)
    assert report.path is not None
    return report.path


def _copy(release: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy.h5"
    shutil.copyfile(release, target)
    return target


def _exit_code(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check", str(path), *args])
    return result.exit_code, result.output


def _flip_byte_in_chunk(path: Path, dataset: str, chunk: int, within: int) -> None:
    with h5py.File(path, "r") as handle:
        info = handle[dataset].id.get_chunk_info(chunk)
        offset = info.byte_offset + min(within, info.size - 1)
    with open(path, "r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)
        raw.seek(offset)
        raw.write(bytes([byte[0] ^ 0x01]))


def test_healthy_release_passes(release: Path) -> None:
    report = check_release(release, deep=True)
    assert report.ok, report.problems
    text = "\n".join(report.lines)
    assert "/train: " in text
    assert "rejects:" in text
    code, output = _exit_code(release, "--deep")
    assert code == 0
    assert output.rstrip().endswith("OK")


def test_check_follows_the_link(release: Path) -> None:
    link = release.parent / "cells.h5"
    assert check_release(link, deep=True).ok


@pytest.mark.parametrize(
    ("dataset", "within"),
    [
        pytest.param("train/image", 200, id="image-chunk"),
        pytest.param("train/mask", 30, id="mask-chunk"),
        pytest.param("valid/image", 10, id="valid-image"),
    ],
)
def test_deep_catches_a_flipped_byte(
    release: Path, tmp_path: Path, dataset: str, within: int
) -> None:
    copy = _copy(release, tmp_path)
    _flip_byte_in_chunk(copy, dataset, 0, within)
    report = check_release(copy, deep=True)
    assert not report.ok
    assert any(dataset in problem for problem in report.problems), report.problems
    code, output = _exit_code(copy, "--deep")
    assert code == 1
    assert "PROBLEM" in output
    assert "Traceback" not in output


def test_deep_catches_a_flipped_byte_in_an_uncompressed_chunk(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # without compression a flipped byte decodes cleanly; only the digest can notice
    make_raw(tmp_path, n=5)
    report = build(load_spec(write_config(tmp_path, storage={"compression": "none"})))
    assert report.path is not None
    _flip_byte_in_chunk(report.path, "train/image", 0, 100)
    assert check_release(report.path, deep=False).ok
    deep = check_release(report.path, deep=True)
    assert not deep.ok
    assert "SHA-256 mismatch" in deep.problems[0]
    assert "first bad block 0" in deep.problems[0]


def test_truncated_copy_fails(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    data = copy.read_bytes()
    copy.write_bytes(data[: len(data) * 2 // 3])
    for deep in ([], ["--deep"]):
        code, output = _exit_code(copy, *deep)
        assert code == 1, output
        assert "Traceback" not in output


def test_deleted_dataset_fails(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    with h5py.File(copy, "r+") as handle:
        del handle["train/mask"]
    report = check_release(copy)
    assert not report.ok
    assert any("/train/mask" in p and "missing" in p for p in report.problems)
    assert _exit_code(copy)[0] == 1


def test_empty_release_passes_deep_check(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # an empty split's source_sha256 was hashed as one (empty) stream by the sink but as no
    # blocks by check, so every empty release failed check --deep
    make_raw(tmp_path, n=0)
    report = build(load_spec(write_config(tmp_path)))
    assert report.path is not None
    checked = check_release(report.path, deep=True)
    assert checked.ok, checked.problems
    assert "rejects: none" in checked.lines


def test_reject_summary_lists_reasons_not_the_total(release: Path) -> None:
    # "rejects: total 3, mask_values 2, orphan 1" read as if "total" were a reason
    lines = [line for line in check_release(release).lines if line.startswith("rejects:")]
    assert lines == ["rejects: 3 (mask_values 2, orphan 1)"]


def test_not_hdf5_fails(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    path.write_text("hello", encoding="utf-8")
    assert _exit_code(path)[0] == 1
    assert _exit_code(tmp_path / "missing.h5")[0] == 1


def test_check_never_modifies_the_file(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    before, stat = copy.read_bytes(), copy.stat()
    check_release(copy)
    check_release(copy, deep=True)
    _exit_code(copy, "--deep")
    assert copy.read_bytes() == before
    assert copy.stat().st_mtime_ns == stat.st_mtime_ns


# --- files h5etl did not write, or damaged where check did not look ------------------------
# These printed tracebacks (AttributeError on a root dataset, KeyError/OSError in
# /diagnostics) instead of a problem and exit code 1.


def _cli_error(path: Path) -> str:
    """Run ``h5etl check``: exit 1, no traceback; the one error line naming the file."""
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("h5etl: error:")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(f"h5etl: error: {path}: ")
    return errors[0]


def test_foreign_hdf5_file_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as handle:
        handle["data"] = [1, 2, 3]  # a dataset at the root, where a release has split groups
        handle["group/scalar"] = 5  # a split-like group holding a scalar
    report = check_release(path, deep=True)
    assert not report.ok
    assert "/data: a Dataset, not a split group: not an h5etl release" in report.problems
    assert "/group/scalar: a scalar, not rows of samples" in report.problems
    error = _cli_error(path)
    assert "file attrs missing" in error
    assert f"and {len(report.problems) - 1} more problem(s)" in error


def test_diagnostics_without_digests_is_a_problem(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    with h5py.File(copy, "r+") as handle:
        nodes = handle["diagnostics/datasets"]
        del nodes["train.image/block_sha256"]
        del nodes["train.mask"].attrs["dataset"]
    report = check_release(copy, deep=True)
    assert any(
        p.startswith("/diagnostics/datasets/train.image: unreadable") and "block_sha256" in p
        for p in report.problems
    ), report.problems
    assert any(
        p.startswith("/diagnostics/datasets/train.mask: unreadable") and "KeyError" in p
        for p in report.problems
    ), report.problems
    assert "/train/image: no digest in /diagnostics" in report.problems
    _cli_error(copy)


def test_damaged_digests_are_a_problem(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    with h5py.File(copy, "r") as handle:
        digests = handle["diagnostics/datasets/train.image/block_sha256"]
        offset, size = digests.id.get_offset(), digests.id.get_storage_size()
    with open(copy, "r+b") as raw:
        raw.seek(offset)
        raw.write(b"\xff" * size)  # not hex, not even UTF-8
    report = check_release(copy, deep=True)
    assert any(
        p.startswith("/diagnostics/datasets/train.image: unreadable") for p in report.problems
    ), report.problems
    _cli_error(copy)


def test_diagnostics_that_is_not_a_group(tmp_path: Path) -> None:
    path = tmp_path / "odd.h5"
    with h5py.File(path, "w") as handle:
        handle.create_group("diagnostics")["datasets"] = [1]
    assert any(
        p.startswith("/diagnostics/datasets: not a group") for p in check_release(path).problems
    )
    _cli_error(path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda p: p.write_text("hello", "utf-8"), "not an HDF5 file", id="text"),
        pytest.param(lambda p: p.write_bytes(b""), "not an HDF5 file", id="empty"),
        pytest.param(lambda p: None, "no such file", id="missing"),
        pytest.param(lambda p: p.mkdir(), "a folder, not a release file", id="folder"),
        pytest.param(
            lambda p: p.symlink_to(p.parent / "gone.h5"), "link points nowhere", id="dangling"
        ),
    ],
)
def test_not_a_release_file(tmp_path: Path, make: Callable[[Path], object], message: str) -> None:
    path = tmp_path / "x.h5"
    make(path)
    assert message in _cli_error(path)
