"""The ``h5etl`` command: exit codes, one-line errors naming the key, no tracebacks."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner

from h5etl import __version__
from h5etl.cli.app import app

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


BAD_CONFIGS = [
    pytest.param({"colour": "red"}, "colour", id="unknown-top-level-key"),
    pytest.param({"storage": {"chunk_sample": 4}}, "storage.chunk_sample", id="unknown-nested-key"),
    pytest.param(
        {"fields": {"image": {"chunks": [4, 24, 24]}}}, "fields.image.chunks", id="chunk-rank"
    ),
    pytest.param(
        {"fields": {"image": {"chunks": [4, 3, 48, 24]}}}, "fields.image.chunks", id="chunk-too-big"
    ),
    pytest.param({"fields": {"mask": {"dtype": "uint9"}}}, "fields.mask", id="bad-dtype"),
    pytest.param({"fields": {"image": {"shape": [3, 24]}}}, "fields.image", id="shape-rank"),
    pytest.param({"splits": {"train": 0.7, "valid": 0.2}}, "splits", id="splits-sum"),
    pytest.param(
        {"sources": {"mask": {"dir": "raw/nowhere"}}}, "sources.mask.dir", id="missing-source-dir"
    ),
    pytest.param({"storage": {"compression": "zip"}}, "storage.compression", id="compression-name"),
    pytest.param(
        {"storage": {"compression": {"codec": "gzip", "level": 12}}},
        "storage.compression",
        id="gzip-level",
    ),
    pytest.param(
        {"fields": {"mask": {"compression": "lzma"}}}, "fields.mask.compression", id="field-codec"
    ),
    pytest.param({"storage": {"chunk_samples": 0}}, "storage.chunk_samples", id="chunk-samples-0"),
    pytest.param({"on_error": "ignore"}, "on_error", id="on-error-choice"),
    pytest.param({"pad": {"oversize": "shrink"}}, "pad.oversize", id="oversize-choice"),
    pytest.param({"name": None}, "name", id="missing-name"),
    pytest.param({"name": "a/b"}, "name", id="bad-name"),
    pytest.param({"pipeline": "nosuchrecipe"}, "pipeline", id="unknown-recipe"),
    # refused up front, not with a traceback in Sink.finish after the whole decode
    pytest.param({"attrs": {"big": 2**64}}, "attrs.big", id="attr-int-beyond-64-bits"),
    pytest.param({"attrs": {"note": "a\0b"}}, "attrs.note", id="attr-nul"),
    pytest.param({"attrs": {"": "x"}}, "attrs", id="attr-empty-name"),
    pytest.param(
        {"fields": {"image": {"chunks": [100, 3, 24, 24]}, "mask": {"chunks": [64, 1, 24, 24]}}},
        "fields.mask.chunks",
        id="decode-task-lcm",
    ),
]


@pytest.mark.parametrize(("overrides", "key"), BAD_CONFIGS)
@pytest.mark.parametrize("command", ["validate", "build"])
def test_bad_config_exits_2_naming_the_key(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    overrides: dict[str, Any],
    key: str,
    command: str,
) -> None:
    make_raw(tmp_path, n=1)
    config = write_config(tmp_path, **overrides)
    extra = ["-j", "1"] if command == "build" else []
    code, output = _invoke(command, str(config), *extra)
    assert code == 2, output
    assert "Traceback" not in output
    assert str(config) in output
    assert re.search(rf"{re.escape(key)}[.: ]", output), output
    assert not (tmp_path / "releases").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("- a\n- b\n", "mapping", id="a-list"),
        pytest.param("just a string\n", "mapping", id="a-string"),
        pytest.param("name: [unclosed\n", "line", id="invalid-yaml"),
        pytest.param("name: x\n\tbad: tab\n", "YAML", id="tab-indent"),
        pytest.param("", "sources", id="empty-file"),
    ],
)
def test_unusable_yaml_exits_2(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(text, encoding="utf-8")
    code, output = _invoke("validate", str(config))
    assert code == 2, output
    assert "Traceback" not in output
    assert expected in output
    assert str(config) in output


def test_missing_config_exits_2(tmp_path: Path) -> None:
    # ConfigError("... not found") without problems= raised AttributeError in its own __init__
    code, output = _invoke("validate", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "not found" in output


def test_every_problem_on_its_own_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    config = write_config(tmp_path, colour=1, seed="x")
    code, output = _invoke("validate", str(config))
    assert code == 2
    lines = [line for line in output.splitlines() if line.startswith("h5etl: error:")]
    assert len(lines) == 2, output
    assert any("colour" in line for line in lines)
    assert any("seed" in line for line in lines)


def test_validate_ok(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> None:
    make_raw(tmp_path, n=1)
    code, output = _invoke("validate", str(write_config(tmp_path)))
    assert code == 0
    assert "OK" in output


def test_build_check_releases_rollback(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=5, broken=["orphan_image", "mask_128"])
    config = write_config(tmp_path)
    code, output = _invoke("build", str(config), "--jobs", "1", "--quiet")
    assert code == 0, output
    assert "rejects: 3 files" in output
    assert "cells-v0001.h5" in output
    code, output = _invoke("build", str(config), "-j", "2", "-q", "--full")  # or: up to date
    assert code == 0, output
    link = tmp_path / "releases" / "cells.h5"
    assert os.readlink(link) == "cells-v0002.h5"

    code, output = _invoke("check", str(link), "--deep")
    assert code == 0, output
    assert "OK" in output

    code, output = _invoke("releases", str(tmp_path / "releases"))
    assert code == 0
    lines = [line for line in output.splitlines() if not line.startswith("    ")]  # no story
    assert len(lines) == 2
    assert lines[1].startswith("*")
    assert "cells-v0002.h5" in lines[1]

    code, output = _invoke("rollback", str(link))
    assert code == 0, output
    assert os.readlink(link) == "cells-v0001.h5"
    code, output = _invoke("rollback", str(link), "--to", "2")
    assert code == 0
    assert os.readlink(link) == "cells-v0002.h5"
    code, output = _invoke("rollback", str(link), "--to", "9")
    assert code == 2  # no such version: a usage error, no work failed
    assert "v0009" in output
    assert os.readlink(link) == "cells-v0002.h5"


def test_dry_run(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> None:
    make_raw(tmp_path, n=3)
    code, output = _invoke("build", str(write_config(tmp_path)), "--dry-run", "-q")
    assert code == 0
    assert "dry run" in output
    assert not list((tmp_path / "releases").glob("*.h5"))


def test_on_error_fail_exits_1(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3, broken=["text"])
    code, output = _invoke("build", str(write_config(tmp_path, on_error="fail")), "-j", "1")
    assert code == 1
    assert "Traceback" not in output
    assert "unreadable" in output


def test_jobs_zero_is_a_usage_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    code, _ = _invoke("build", str(write_config(tmp_path)), "--jobs", "0")
    assert code == 2


def test_version() -> None:
    code, output = _invoke("--version")
    assert code == 0
    assert __version__ in output


def test_demo(tmp_path: Path) -> None:
    code, output = _invoke("demo", "--dir", str(tmp_path / "demo"), "-j", "1", "-q")
    assert code == 0, output
    assert "rejects:" in output
    link = tmp_path / "demo" / "releases" / "cells.h5"
    assert link.is_symlink()
    code, output = _invoke("check", str(link), "--deep")
    assert code == 0, output


def test_releases_says_what_each_release_holds_from_its_layout_record(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # releases listed names and sizes only; a flat release's /x_train was invisible to it
    make_raw(tmp_path, n=6)
    config = tmp_path / "flat.yaml"
    config.write_text(
        "name: cells\npipeline: flat\n"
        "sources: {x: {dir: raw/images, glob: '*.png'}, y: {dir: raw/masks, glob: '*.png'}}\n"
        "fields: {x: {shape: [3, 24, 24]}, y: {shape: [1, 24, 24]}}\n",
        encoding="utf-8",
    )
    code, output = _invoke("build", str(config), "--jobs", "1", "--quiet")
    assert code == 0, output
    (tmp_path / "releases" / "cells-v0002.h5").write_bytes(b"not hdf5")  # a stray file
    code, output = _invoke("releases", str(tmp_path / "releases"))
    assert code == 0, output
    first, story, stray = output.splitlines()
    assert story == "    initial: the first release of this name here"
    counts = re.search(r"train (\d+), valid (\d+); x \(image\), y \(mask\)$", first)
    assert counts is not None, first
    assert int(counts[1]) + int(counts[2]) == 6
    assert "unreadable: not an HDF5 file" in stray
