"""``check``: a read-only health report; ``--deep`` finds damaged bytes."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner, Result

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.cli.app import app


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


def test_reject_summary_lists_reasons_not_the_total(release: Path) -> None:
    # "rejects: total 3, mask_values 2, orphan 1" read as if "total" were a reason
    lines = [line for line in check_release(release).lines if line.startswith("rejects:")]
    assert lines == ["rejects: 3 (mask_values 2, orphan 1)"]


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


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _cli_error(path: Path, *args: str, code: int = 1) -> str:
    """Run ``h5etl check``: no traceback; one line on stderr naming the file; nothing twice."""
    result = _invoke("check", str(path), *args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = result.stderr.splitlines()
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"h5etl: error: {path}: ")
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM ")]
    assert len(set(problems)) == len(problems), result.stdout
    for problem in problems:  # the first problem came again as the error line
        assert problem.removeprefix("PROBLEM ") not in errors[0], result.output
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
    assert f"{len(report.problems)} problems" in error


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


# --- issue 11: one line per error; empty splits and releases; what --deep verified; readers


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda p: p.write_text("hello", "utf-8"),
            "not an HDF5 file (h5etl releases are HDF5)",
            id="text",
        ),
        pytest.param(
            lambda p: p.write_bytes(b""),
            "an empty file, not an HDF5 file (h5etl releases are HDF5)",
            id="empty",
        ),
        pytest.param(
            lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200)),
            "a damaged HDF5 file: HDF5 cannot open it",
            id="damaged-hdf5",
        ),
    ],
)
def test_a_file_that_is_not_hdf5_is_one_line_in_our_words(
    tmp_path: Path, make: Callable[[Path], object], message: str
) -> None:
    # "PROBLEM cannot open as HDF5 (...): Unable to synchronously open file (file signature
    # not found)" on stdout, then the same again as the error line on stderr
    path = tmp_path / "notes.txt"
    make(path)
    result = _invoke("check", str(path))
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"h5etl: error: {path}: {message}")


def test_a_truncated_release_is_one_line(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    copy.write_bytes(copy.read_bytes()[:4096])
    result = _invoke("check", str(copy), "--deep")
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"h5etl: error: {copy}: a truncated HDF5 file: ")
    assert "synchronously" not in line  # HDF5's wording stays out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda p: None, "no such file", id="missing"),
        pytest.param(lambda p: p.mkdir(), "a folder, not a release file", id="folder"),
        pytest.param(
            lambda p: p.symlink_to("gone.h5"),  # as release links are: relative
            "a link to gone.h5, which does not exist",
            id="dangling",
        ),
    ],
)
def test_a_path_that_is_no_file_is_a_usage_error(
    tmp_path: Path, make: Callable[[Path], object], message: str
) -> None:
    # exit code 1 (failed work) for what is a wrong argument, and "PROBLEM no such file" twice
    path = tmp_path / "x.h5"
    make(path)
    result = _invoke("check", str(path))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"h5etl: error: {path}: {message}")


def test_each_problem_is_printed_once(release: Path, tmp_path: Path) -> None:
    # the first problem came on stdout as PROBLEM, then again on stderr as the error line
    copy = _copy(release, tmp_path)
    with h5py.File(copy, "r+") as handle:
        del handle["train/mask"]
        del handle["valid/filename"]
    problems = check_release(copy).problems
    assert len(problems) >= 2
    result = _invoke("check", str(copy))
    assert result.exit_code == 1
    for problem in problems:
        assert result.stdout.count(problem) == 1, result.stdout
        assert problem not in result.stderr
    assert result.stderr == (
        f"h5etl: error: {copy}: {len(problems)} problems (the PROBLEM lines of the report)\n"
    )


def test_an_empty_split_is_a_problem(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # check said OK and nothing else about a split that holds no sample, then OK (1 warning)
    make_raw(tmp_path, n=1)
    built = build(load_spec(write_config(tmp_path)), jobs=1)
    assert built.path is not None
    [empty] = [split for split, count in built.samples.items() if count == 0]
    report = check_release(built.path, deep=True)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(f"split {empty}: 0 samples: the split is empty")
    assert f"PROBLEM {report.problems[0]}" in report.lines
    assert _cli_error(built.path).endswith(": 1 problem (the PROBLEM lines of the report)")


EMPTY = hashlib.sha256(b"")


def _empty_out(path: Path) -> None:
    """Make ``path`` what h5etl published before issue 11 when every input was rejected."""
    with h5py.File(path, "r+") as handle:
        for split in (k for k in handle if k != "diagnostics"):
            for dataset in handle[split].values():
                dataset.resize(0, axis=0)
            handle["diagnostics"].attrs[f"samples_{split}"] = 0
        handle.attrs["source_fingerprint"] = EMPTY.hexdigest()
        for node in handle["diagnostics/datasets"].values():
            # as the sink hashed empty datasets: no blocks, or one empty stream (texts, lineage)
            blocks = [] if node.attrs["block_rows"] else [EMPTY.hexdigest()]
            node.attrs["sha256"] = hashlib.sha256(
                b"".join(bytes.fromhex(b) for b in blocks)
            ).hexdigest()
            node.attrs.update({"raw_bytes": 0, "stored_bytes": 0, "ratio": 0.0})
            del node["block_sha256"]
            node.create_dataset("block_sha256", data=np.array(blocks, dtype="S64"))


def test_a_release_with_no_sample_is_a_problem(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # older versions published these when every input was rejected, and check said OK
    make_raw(tmp_path, n=1)
    built = build(load_spec(write_config(tmp_path)), jobs=1)
    assert built.path is not None
    _empty_out(built.path)
    # deep: an empty split's digests agree (lineage is one empty stream, images no blocks)
    report = check_release(built.path, deep=True)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith("0 samples in the release: ")
    assert report.warnings == []  # the empty splits are said by the problem
    assert "rejects: none" in report.lines
    assert _cli_error(built.path).endswith(": 1 problem (the PROBLEM lines of the report)")


def _hashed(path: Path) -> tuple[int, int, int]:
    """Datasets, blocks and uncompressed bytes ``--deep`` must hash, counted here with h5py."""
    datasets = blocks = nbytes = 0
    with h5py.File(path, "r") as handle:
        for node in handle["diagnostics/datasets"].values():
            blocks += len(node["block_sha256"])
            dataset = handle[node.attrs["dataset"]]
            datasets += 1
            if dataset.dtype.kind == "O":
                nbytes += sum(8 + len(row) for row in dataset[...])  # length-prefixed UTF-8
            else:
                nbytes += dataset.size * dataset.dtype.itemsize
    return datasets, blocks, nbytes


def test_deep_says_what_it_verified(release: Path) -> None:
    # check --deep printed exactly what check printed: nothing said the digests were recomputed
    datasets, blocks, nbytes = _hashed(release)
    assert 1024 < nbytes < 1024 * 1024
    lines = check_release(release, deep=True).lines
    assert (
        f"deep: {datasets} datasets, {blocks} blocks, {nbytes / 1024:.1f} KiB hashed, "
        "all SHA-256 digests equal"
    ) in lines
    assert not [line for line in check_release(release).lines if line.startswith("deep:")]


def test_deep_names_the_datasets_that_differ(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=9)
    built = build(load_spec(write_config(tmp_path, storage={"compression": "none"})), jobs=1)
    assert built.path is not None
    _flip_byte_in_chunk(built.path, "train/image", 0, 100)  # decodes, digest differs
    _flip_byte_in_chunk(built.path, "valid/mask", 0, 10)
    datasets, blocks, nbytes = _hashed(built.path)
    [line] = [line for line in check_release(built.path, deep=True).lines if "deep:" in line]
    assert line == (
        f"deep: {datasets} datasets, {blocks} blocks, {nbytes / 1024:.1f} KiB hashed, "
        f"SHA-256 digests differ in 2 of {datasets}: /train/image, /valid/mask"
    )


def test_deep_names_the_datasets_it_could_not_read(release: Path, tmp_path: Path) -> None:
    copy = _copy(release, tmp_path)
    _flip_byte_in_chunk(copy, "train/mask", 0, 30)  # gzip: the chunk no longer decodes
    [line] = [line for line in check_release(copy, deep=True).lines if "deep:" in line]
    assert line.endswith("; 1 unreadable: /train/mask"), line


@pytest.mark.parametrize(
    ("storage", "fields", "expected"),
    [
        pytest.param(
            {"compression": "gzip"},
            {},
            "readable by: every HDF5 tool and library (gzip and shuffle are built into HDF5)",
            id="gzip",
        ),
        pytest.param(
            {"compression": "none", "shuffle": False},
            {},
            "readable by: every HDF5 tool and library (no filters)",
            id="none",
        ),
        pytest.param(
            {"compression": "lzf"},
            {},
            "readable by: h5py (lzf is h5py's own filter); h5dump, h5ls and other HDF5 tools "
            "need the LZF plugin in HDF5_PLUGIN_PATH, without it they print no data",
            id="lzf",
        ),
        pytest.param(
            {"compression": {"codec": "blosc", "cname": "lz4"}},
            {},
            'readable by: h5py after "import hdf5plugin"; h5dump, h5ls and other HDF5 tools '
            "need the Blosc plugin in HDF5_PLUGIN_PATH (hdf5plugin.PLUGIN_PATH holds it), "
            "without it they print no data",
            id="blosc",
        ),
        pytest.param(
            {"compression": "lzf"},
            {"mask": {"compression": "zstd"}},
            'readable by: h5py after "import hdf5plugin" (lzf is h5py\'s own filter); h5dump, '
            "h5ls and other HDF5 tools need the LZF and Zstd plugins in HDF5_PLUGIN_PATH "
            "(hdf5plugin.PLUGIN_PATH holds Zstd), without them they print no data",
            id="lzf-and-zstd",
        ),
    ],
)
def test_check_says_which_tools_can_read_the_file(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    storage: dict[str, object],
    fields: dict[str, object],
    expected: str,
) -> None:
    # h5dump printed DATA { } for lzf datasets, and nothing in check said why
    make_raw(tmp_path, n=5)  # a sample in each split: an empty split is a problem
    config = write_config(tmp_path, storage=storage, fields=fields)
    built = build(load_spec(config), jobs=1)
    assert built.path is not None
    report = check_release(built.path)
    assert report.ok, report.problems
    assert [line for line in report.lines if line.startswith("readable by:")] == [expected]
