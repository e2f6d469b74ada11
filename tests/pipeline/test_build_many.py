"""Many configs, one command: ``h5etl build configs/`` (or several files) builds each under
its own lock, goes on past a failing one, prints one summary table and exits with the worst
outcome's code (0 all built, 1 a build failed, 2 a config invalid, 130 interrupted)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, RawFolder, WriteConfig
from PIL import Image
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.pipeline import batch
from h5etl.release.lock import BuildLock

runner = CliRunner()
SOURCES = {"image": {"dir": "../raw/images"}, "mask": {"dir": "../raw/masks"}}


@pytest.fixture
def raw(tmp_path: Path, make_raw: MakeRaw) -> RawFolder:
    return make_raw(tmp_path, n=9, broken=["mask_128"])


def add_config(root: Path, write_config: WriteConfig, file: str, **overrides: Any) -> Path:
    """``root/configs/<file>``, reading ``root/raw`` and building into ``root/releases``."""
    (root / "configs").mkdir(exist_ok=True)
    overrides = {"sources": SOURCES, "output": "../releases", **overrides}
    return write_config(root / "configs", config_name=file, **overrides)


def stored(release: Path) -> int:
    with h5py.File(release, "r") as handle:
        return sum(len(handle[f"{split}/image"]) for split in ("train", "valid"))


def good_pairs(raw: RawFolder) -> int:
    """Pairs whose mask is 0/255 only, read with Pillow here (not h5etl)."""
    count = 0
    for key in [*raw.keys, *raw.broken]:
        with Image.open(raw.mask(key)) as mask:
            values = set(np.unique(np.asarray(mask.convert("L"))).tolist())
        count += values <= {0, 255}
    return count


def build(*args: Path | str) -> Any:
    return runner.invoke(app, ["build", *map(str, args), "--jobs", "1", "--quiet"])


def summary(output: str) -> list[list[str]]:
    """The rows of the summary table (header first), split on runs of spaces."""
    lines = output.split("== summary ==\n", 1)[1].splitlines()
    end = next(i for i, line in enumerate(lines) if line.endswith(" configs built"))
    return [line.split() for line in lines[:end]]


def test_a_folder_builds_each_config_past_a_failing_and_an_invalid_one(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    add_config(tmp_path, write_config, "a.yaml")
    add_config(tmp_path, write_config, "b.yaml", name="strict", on_error="fail")
    bad = add_config(tmp_path, write_config, "c.yaml", name="typo", splits={"train": "x"})
    add_config(tmp_path, write_config, "d.yaml", name="other", storage={"compression": "gzip"})
    (tmp_path / "configs" / "notes.txt").write_text("not a config")
    (tmp_path / "configs" / ".hidden.yaml").write_text("not: [a config")

    result = build(tmp_path / "configs")

    assert result.exit_code == 2, result.output  # a config was invalid: the worst outcome
    releases = tmp_path / "releases"
    expected = good_pairs(raw)
    assert stored(releases / "cells.h5") == expected
    assert stored(releases / "other.h5") == expected  # built after the failure
    assert not (releases / "strict.h5").exists()
    assert not (releases / "typo.h5").exists()
    headers = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert headers == [
        f"== {tmp_path / 'configs' / 'a.yaml'} (cells) ==",
        f"== {tmp_path / 'configs' / 'b.yaml'} (strict) ==",
        f"== {tmp_path / 'configs' / 'd.yaml'} (other) ==",
        "== summary ==",
    ]
    rows = summary(result.stdout)
    assert rows[0] == ["config", "name", "result", "release", "samples", "rejects", "stored"]
    assert [row[1:4] for row in rows[1:]] == [
        ["cells", "ok", "v0001"],
        ["strict", "failed", "-"],
        ["-", "invalid", "-"],
        ["other", "ok", "v0001"],
    ]
    assert rows[1][4:6] == [str(expected), "2"]  # samples; both files of the bad pair
    assert "2 of 4 configs built" in result.stdout
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert errors[0].startswith(f"h5etl: error: {bad}: splits.train: ")  # before any build
    assert "on_error: fail" in errors[1]
    assert f"invalid: {bad}: splits.train: " in result.stdout


def test_several_files_all_built_exit_0(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    one = add_config(tmp_path, write_config, "one.yaml")
    two = add_config(tmp_path, write_config, "two.yml", name="two")
    result = build(one, two, one)  # a file named twice builds once
    assert result.exit_code == 0, result.output
    assert [row[1:3] for row in summary(result.stdout)[1:]] == [["cells", "ok"], ["two", "ok"]]
    assert "2 of 2 configs built" in result.stdout
    assert result.stderr == ""


def test_a_failed_build_is_exit_1_and_the_next_still_builds(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    failing = add_config(tmp_path, write_config, "a.yaml", on_error="fail")
    good = add_config(tmp_path, write_config, "b.yaml", name="good")
    result = build(failing, good)
    assert result.exit_code == 1
    assert stored(tmp_path / "releases" / "good.h5") == good_pairs(raw)


def test_each_build_takes_its_own_lock(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    busy = add_config(tmp_path, write_config, "busy.yaml", name="busy")
    free = add_config(tmp_path, write_config, "free.yaml", name="free")
    (tmp_path / "releases").mkdir()
    with BuildLock(tmp_path / "releases" / ".busy.lock", "busy").held():
        result = build(busy, free)
    assert result.exit_code == 1  # LockHeld is a failed build
    assert "another build of 'busy' is running" in result.stderr
    assert [row[1:3] for row in summary(result.stdout)[1:]] == [["busy", "failed"], ["free", "ok"]]
    assert (tmp_path / "releases" / "free.h5").exists()
    assert not (tmp_path / "releases" / "busy.h5").exists()


def test_two_configs_of_one_release_are_refused_and_the_first_builds(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    first = add_config(tmp_path, write_config, "a.yaml")
    second = add_config(tmp_path, write_config, "b.yaml", seed=1)
    result = build(tmp_path / "configs")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"h5etl: error: {second}: builds the same release as {first} ('cells' in "
        f"{tmp_path / 'configs' / '..' / 'releases'}); give one of them another name or output"
    ]
    assert sorted(p.name for p in (tmp_path / "releases").glob("cells-v*.h5")) == ["cells-v0001.h5"]


def test_a_dry_run_of_a_folder_writes_nothing(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    add_config(tmp_path, write_config, "a.yaml")
    add_config(tmp_path, write_config, "b.yaml", name="other")
    result = runner.invoke(app, ["build", str(tmp_path / "configs"), "--dry-run", "-j", "1"])
    assert result.exit_code == 0, result.output
    assert [row[2:4] for row in summary(result.stdout)[1:]] == [["ok", "dry"], ["ok", "dry"]]
    assert not (tmp_path / "releases").exists()


def test_a_folder_without_configs_is_a_usage_error(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    result = build(folder)
    assert result.exit_code == 2
    assert (
        result.stderr.strip() == f"h5etl: error: {folder}: no *.yaml or *.yml config in this folder"
    )
    assert not (tmp_path / "releases").exists()


def test_a_missing_one_of_several_is_a_usage_error_before_any_build(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    good = add_config(tmp_path, write_config, "a.yaml")
    missing = tmp_path / "configs" / "b.yaml"
    result = build(good, missing)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"h5etl: error: {missing}: no such config file or folder"
    assert not (tmp_path / "releases").exists()


def test_config_files_takes_a_folders_configs_by_name(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("b.yml", "a.yaml", "c.txt", ".d.yaml", "sub/e.yaml"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "f.yaml").mkdir()  # a folder named like a config is no config
    assert batch.config_files([tmp_path, tmp_path / "a.yaml"]) == [
        tmp_path / "a.yaml",
        tmp_path / "b.yml",
    ]


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        pytest.param([0, 0], 0, id="all-ok"),
        pytest.param([0, 1], 1, id="a-failed-build"),
        pytest.param([1, 2, 0], 2, id="an-invalid-config-wins"),
        pytest.param([2, 130], 130, id="interrupted-wins"),
        pytest.param([], 0, id="nothing"),
    ],
)
def test_the_exit_code_is_the_worst_outcomes(codes: list[int], expected: int) -> None:
    outcomes = [batch.Outcome(Path(f"{i}.yaml"), exit_code=code) for i, code in enumerate(codes)]
    assert batch.exit_code(outcomes) == expected


def cli_with_decode(before: str) -> str:
    """A child script: ``h5etl build FOLDER --jobs 1`` with ``before`` (code run at the start
    of every image decode, ``calls[0]`` counting them, ``folder`` the folder built) put in
    front of the decoder."""
    body = textwrap.indent(textwrap.dedent(before).strip(), " " * 4)
    return f"""
import os, signal, sys, time
import h5etl.inputs.raster
original = h5etl.inputs.raster.decode_field
calls = [0]
folder = sys.argv[1]
def patched(*args, **kwargs):
    calls[0] += 1
{body}
    return original(*args, **kwargs)
h5etl.inputs.raster.decode_field = patched
from h5etl.cli.app import main
sys.argv = ["h5etl", "build", sys.argv[1], "--jobs", "1", "--quiet"]
main()
"""


# The CLI over a folder whose first build, at its first decode, says so (the file
# ``decoding`` beside the folder) and waits there for the Ctrl-C: it lands in that build
# however late the test gets to send it. It was a 0.05 s sleep per decode, a window of about
# 2 s that a test starved that long on a loaded machine missed: the first build published.
GATED_MANY = cli_with_decode(
    """
    if calls[0] == 1:
        from pathlib import Path
        from h5etl.pipeline import interrupts
        (Path(folder).parent / "decoding").touch()
        while not interrupts.requested():  # in the main thread, the Ctrl-C raises in here
            time.sleep(0.01)
    """
)


def test_ctrl_c_stops_the_builds_and_still_prints_the_summary(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    add_config(tmp_path, write_config, "a.yaml")
    add_config(tmp_path, write_config, "b.yaml", name="later")
    status = tmp_path / "releases" / "cells.status.json"
    # its pipes closed whatever happens: left open, they failed the next test of this process
    with subprocess.Popen(
        [sys.executable, "-c", GATED_MANY, str(tmp_path / "configs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            deadline = time.monotonic() + 90  # to come up on a loaded machine, not a measure
            while not (tmp_path / "decoding").exists():  # the first build waits there
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the first build never decoded"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert [row[1:3] for row in summary(out)[1:]] == [["cells", "failed"], ["later", "not"]]
    assert "0 of 2 configs built" in out
    assert err.strip().endswith("a.yaml: interrupted; nothing was published")
    assert not (tmp_path / "releases" / "cells.h5").exists()
    ended = json.loads(status.read_text("utf-8"))
    assert ended["state"] == "interrupted"
    assert ended["result"]["exit_code"] == 130
    assert not (tmp_path / "releases" / "later.status.json").exists()  # never started


# A Ctrl-C that Python loses (raised inside a weakref callback it is printed as "Exception
# ignored"), made certain: the third decode sends SIGINT to its own process and swallows it.
SWALLOWED_MANY = cli_with_decode(
    """
    if calls[0] == 3:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler raises in here, and the exception is lost
        except KeyboardInterrupt:
            pass
    """
)


def test_a_ctrl_c_python_swallowed_still_stops_the_builds_of_a_folder(
    tmp_path: Path, raw: RawFolder, write_config: WriteConfig
) -> None:
    add_config(tmp_path, write_config, "a.yaml")
    add_config(tmp_path, write_config, "b.yaml", name="later")
    proc = subprocess.run(
        [sys.executable, "-c", SWALLOWED_MANY, str(tmp_path / "configs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert [row[1:3] for row in summary(proc.stdout)[1:]] == [["cells", "failed"], ["later", "not"]]
    assert proc.stderr.strip().endswith("a.yaml: interrupted; nothing was published")
    assert not (tmp_path / "releases" / "cells.h5").exists()
    assert not (tmp_path / "releases" / "later.h5").exists()
