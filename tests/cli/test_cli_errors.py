"""The command line: one line per error, exit 2 for usage, plain help, the dry-run wiring, demo."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner

from h5etl.cli import app as cli
from h5etl.cli import build as cli_build
from h5etl.cli.app import app
from h5etl.config import resources
from h5etl.dataflow import Reject
from h5etl.history.build_report import BuildReport
from h5etl.pipeline import run as pipeline

runner = CliRunner()


def _invoke(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args], prog_name="h5etl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _one_error_line(output: str) -> str:
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("h5etl: error: "), output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["build"], "missing argument 'CONFIG'", id="missing-config"),
        pytest.param(["releases"], "missing argument 'FOLDER'", id="missing-folder"),
        pytest.param(["rollback"], "missing argument 'LINK'", id="missing-link"),
        pytest.param(["build", "x.yaml", "--bogus"], "no such option: --bogus", id="option"),
        pytest.param(["build", "x.yaml", "-j", "0"], "invalid value for '--jobs'", id="jobs-0"),
        pytest.param(["biuld"], "no such command 'biuld'", id="command"),
        pytest.param(["preview", "x.h5"], "missing option '--out'", id="missing-option"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], expected: str) -> None:
    # typer drew a box of several lines around each of these
    code, output = _invoke(*args)
    assert code == 2, output
    line = _one_error_line(output)
    assert expected in line.lower() or expected in line, line
    assert "--help" in line


def test_usage_line_names_the_command_help() -> None:
    code, output = _invoke("releases")
    assert code == 2
    assert output == ("h5etl: error: missing argument 'FOLDER' (see 'h5etl releases --help')\n")


@pytest.mark.parametrize(
    ("make", "command"),
    [
        pytest.param(lambda tmp: tmp / "nowhere", "releases", id="releases-no-such-folder"),
        pytest.param(lambda tmp: _file(tmp), "releases", id="releases-on-a-file"),
        pytest.param(lambda tmp: tmp / "nowhere.h5", "rollback", id="rollback-no-such-file"),
        pytest.param(lambda tmp: _file(tmp), "rollback", id="rollback-not-a-link"),
    ],
)
def test_bad_paths_are_usage_errors(tmp_path: Path, make: Any, command: str) -> None:
    # these exited 1, the code of failed work
    path = make(tmp_path)
    code, output = _invoke(command, path)
    assert code == 2, output
    assert _one_error_line(output).startswith(f"h5etl: error: {path}: ")


def _file(tmp: Path) -> Path:
    path = tmp / "cells-v0001.h5"
    path.write_bytes(b"x")
    return path


def test_rollback_to_a_missing_version_is_a_usage_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    config = write_config(tmp_path)
    assert _invoke("build", config, "-j", "1", "-q")[0] == 0
    link = tmp_path / "releases" / "cells.h5"
    code, output = _invoke("rollback", link, "--to", "9")
    assert code == 2
    assert "no release v0009; have v1" in _one_error_line(output)
    code, output = _invoke("rollback", link)
    assert code == 2
    assert "no release older than v0001" in _one_error_line(output)
    assert os.readlink(link) == "cells-v0001.h5"


def test_help_is_plain_and_consistent() -> None:
    # --help showed <bool> after flags and mixed {config} with {RELEASE}
    commands = ("build", "validate", "check", "releases", "rollback", "demo", "preview", "report")
    pages = {command: _invoke(command, "--help")[1] for command in commands}
    pages["h5etl"] = _invoke("--help")[1]
    for page in pages.values():
        assert "<bool>" not in page
        assert "{" not in page
        assert "}" not in page
        assert "╭" not in page  # no boxes
        assert "<path>" not in page  # arguments showed as ``CONFIG <path>``
    usage = {name: page.splitlines()[0] for name, page in pages.items()}
    assert usage["build"] == "Usage: h5etl build [OPTIONS] CONFIG..."
    assert usage["validate"] == "Usage: h5etl validate [OPTIONS] CONFIG"
    assert usage["releases"] == "Usage: h5etl releases [OPTIONS] FOLDER"
    assert usage["rollback"] == "Usage: h5etl rollback [OPTIONS] LINK"
    assert usage["preview"] == "Usage: h5etl preview [OPTIONS] RELEASE"
    assert usage["report"] == "Usage: h5etl report [OPTIONS] RELEASE"
    assert re.search(r"^\s+--dry-run\s+Plan", pages["build"], re.MULTILINE)
    assert re.search(r"^\s+-j, --jobs N\s", pages["build"], re.MULTILINE)
    assert re.search(r"^\s+--dir FOLDER\s", pages["demo"], re.MULTILINE)
    assert re.search(r"^\s+--to N\s", pages["rollback"], re.MULTILINE)


def test_failed_work_still_exits_1(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3, broken=["text"])
    code, output = _invoke("build", write_config(tmp_path, on_error="fail"), "-j", "1")
    assert code == 1
    assert "Traceback" not in output


# --- progress bars and Ctrl-C ---


def test_bars_close_before_the_interrupt_line(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # on a terminal the live bar was redrawn below "h5etl: interrupted"
    make_raw(tmp_path, n=1)
    events: list[str] = []
    real_close = cli_build._Bars.close

    def close(self: cli_build._Bars) -> None:
        if self.bar is not None:
            events.append("bar closed")
        real_close(self)

    def interrupted(spec: Any, **kwargs: Any) -> BuildReport:
        kwargs["progress"]("decode", 0, 10)
        kwargs["progress"]("decode", 3, None)
        raise KeyboardInterrupt

    real_echo = typer.echo

    def echo(message: Any = None, **kwargs: Any) -> None:
        events.append(str(message))
        real_echo(message, **kwargs)

    monkeypatch.setattr(cli_build._Bars, "close", close)
    monkeypatch.setattr(cli_build, "_progress", _live_bars)
    monkeypatch.setattr(pipeline, "build", interrupted)
    monkeypatch.setattr(typer, "echo", echo)
    code, _ = _invoke("build", write_config(tmp_path), "-j", "1")
    assert code == 130
    assert events[-2:] == ["bar closed", "h5etl: interrupted; nothing was published"]


def _live_bars(quiet: bool) -> Any:
    """``cli_build._progress`` as on a terminal, drawing into a throwaway stream."""
    from contextlib import contextmanager

    @contextmanager
    def bars() -> Any:
        drawn = cli_build._Bars(enabled=True)
        try:
            yield drawn
        finally:
            drawn.close()

    return bars()


# --- build --dry-run / --decode wiring ---


def _fake_report(**extra: Any) -> BuildReport:
    return BuildReport(
        name="cells",
        inputs=6,
        samples={"train": 2, "valid": 0},
        rejects=[
            Reject("/raw/images/a.png", "decode", "truncated", "image file is truncated"),
            Reject("/raw/masks/b.png", "pair", "orphan"),
        ],
        seconds={"total": 0.1},
        **extra,
    )


def test_dry_run_prints_checks_rejects_and_warnings(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_raw(tmp_path, n=1)
    calls: list[dict[str, Any]] = []

    def fake_build(spec: Any, **kwargs: Any) -> BuildReport:
        calls.append(kwargs)
        return _fake_report(
            checks=["headers", "decoding"], warnings=["split valid is empty", "another"]
        )

    monkeypatch.setattr(pipeline, "build", fake_build)
    code, output = _invoke("build", write_config(tmp_path), "--dry-run", "--decode", "-q")
    assert code == 0, output
    assert calls[0]["decode"] is True
    assert calls[0]["dry_run"] is True
    lines = output.splitlines()
    assert lines[:3] == [
        "reject: /raw/images/a.png: truncated: image file is truncated",
        "reject: /raw/masks/b.png: orphan",
        "dry run: checked headers, decoding; nothing written",
    ]
    assert lines[-2:] == ["warning: split valid is empty", "warning: another"]


def test_build_prints_warnings_after_the_summary(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_raw(tmp_path, n=1)
    calls: list[dict[str, Any]] = []

    def fake_build(spec: Any, **kwargs: Any) -> BuildReport:
        calls.append(kwargs)
        return _fake_report(warnings=["split valid is empty"])

    monkeypatch.setattr(pipeline, "build", fake_build)
    frozen = gc.get_freeze_count()
    code, output = _invoke("build", write_config(tmp_path), "-q")
    assert code == 0, output
    # a build in a process that goes on leaves its garbage collection alone: frozen once
    # before the build, a test process's S3 client's pooled connections were never freed and
    # a later read in it hung (tests/remote, tests/cli, then a remote reader, in one process)
    assert gc.get_freeze_count() == frozen
    assert calls[0]["decode"] is False
    assert "reject: " not in output  # per-file lines are the rejects report's job here
    assert output.splitlines()[-1] == "warning: split valid is empty"


def test_decode_without_dry_run_is_a_usage_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    code, output = _invoke("build", write_config(tmp_path), "--decode", "-q")
    assert code == 2
    assert "--decode needs --dry-run" in _one_error_line(output)
    assert not (tmp_path / "releases").exists()


def test_dry_run_decode_predicts_the_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # real pipeline: a decode-time reject (a late truncation, a bad mask value) is listed
    raw = make_raw(tmp_path, n=4, broken=["truncated_late", "mask_128"])
    config = write_config(tmp_path)
    code, output = _invoke("build", config, "--dry-run", "--decode", "-j", "1", "-q")
    assert code == 0, output
    rejected = {line.split(": ")[1] for line in output.splitlines() if line.startswith("reject:")}
    assert rejected == set(raw.reasons)
    assert "dry run: checked " in output
    assert not list((tmp_path / "releases").glob("*.h5"))


# --- demo ---


def test_demo_twice_is_up_to_date(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    assert _invoke("demo", "--dir", folder, "-j", "1", "-q")[0] == 0
    code, output = _invoke("demo", "--dir", folder, "-j", "1", "-q")
    assert code == 0, output
    assert "cells: nothing changed since cells-v0001 (" in output
    assert os.readlink(folder / "releases" / "cells.h5") == "cells-v0001.h5"
    code, output = _invoke("build", folder / "demo.yaml", "-j", "1", "-q", "--full")
    assert code == 0, output
    assert os.readlink(folder / "releases" / "cells.h5") == "cells-v0002.h5"
    assert (folder / "demo.yaml").read_bytes() == resources.demo_config().read_bytes()


def test_demo_refuses_a_foreign_demo_yaml(tmp_path: Path) -> None:
    # it was overwritten, then the build failed
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "demo.yaml").write_text("name: mine\n", encoding="utf-8")
    code, output = _invoke("demo", "--dir", folder, "-j", "1", "-q")
    assert code == 2
    assert _one_error_line(output).startswith(f"h5etl: error: {folder / 'demo.yaml'}: ")
    assert (folder / "demo.yaml").read_text(encoding="utf-8") == "name: mine\n"
    assert sorted(p.name for p in folder.iterdir()) == ["demo.yaml"]


def test_demo_refuses_a_folder_with_data_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    (folder / "releases").mkdir(parents=True)
    code, output = _invoke("demo", "--dir", folder, "-j", "1", "-q")
    assert code == 2
    assert "no demo.yaml" in _one_error_line(output)
    assert sorted(p.name for p in folder.iterdir()) == ["releases"]


def test_main_exits_with_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # the real entry point, not the test runner: one line on stderr, exit 2
    monkeypatch.setattr(sys, "argv", ["h5etl", "releases"])
    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit) as caught:
        cli.main()
    assert caught.value.code == 2
    # the heap is frozen at the process's exit, not when main() returns to a caller that
    # goes on: a frozen heap never frees what is in reference cycles
    assert gc.get_freeze_count() == frozen


def test_dry_run_over_max_rejects_lists_them_and_fails(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the dry run stops as the build would, and still says which files it found
    raw = make_raw(tmp_path, n=3, broken=["orphan_image", "text"])
    config = write_config(tmp_path, max_rejects=0)
    code, output = _invoke("build", config, "--dry-run", "-j", "1", "-q")
    assert code == 1, output
    listed = {line.split(": ")[1] for line in output.splitlines() if line.startswith("reject:")}
    assert listed == set(raw.reasons)
    assert output.splitlines()[-1].startswith("h5etl: error: ")


def _processes_with(variable: str, value: str) -> list[int]:
    """The live processes whose environment holds ``variable=value`` (Linux ``/proc``)."""
    wanted = f"{variable}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours
        if wanted in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_config_error_is_one_line_exit_2_and_leaves_no_process_behind(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the CLI starts its workers before it reads the config, so they start while it does
    make_raw(tmp_path, n=2)
    config = write_config(tmp_path, seed="not a number")
    marks = str(tmp_path / "timeline.txt")
    env = {**os.environ, "H5ETL_TIMELINE": marks}  # every process of the run carries it
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config), "-j", "2", "--quiet"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "seed" in _one_error_line(done.stderr)
    assert "pool: started" in Path(marks).read_text()  # workers had been started
    # loky's resource tracker sees the CLI's end only once it has exited: a moment later
    deadline = time.monotonic() + 60
    while (left := _processes_with("H5ETL_TIMELINE", marks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []
