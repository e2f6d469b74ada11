"""The command line starts light: each command imports what it uses, no more (issue 30).

Not timed: the modules a command loads are counted (``python -X importtime``), and the heavy
ones it does not use must be absent. ``tests/benchmarks/startup.py`` measures the time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# What a command that reads no config, no pixels and no HDF5 must not load.
HEAVY = ("pydantic", "numpy", "h5py", "PIL", "yaml", "joblib", "tqdm")


def _loaded(*args: str, cwd: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules ``h5etl ARGS`` imported, by name, and how it ended."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "h5etl", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
    )
    names = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "imported package" not in line
    }
    return names, done


def _heavy(names: set[str], roots: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(r for r in roots if any(n == r or n.startswith(r + ".") for n in names))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--version"], id="version"),
        pytest.param(["--help"], id="help"),
        # typer coerced the unset --help flag of the group with pydantic (60 ms, issue 30)
        pytest.param(["build", "--help"], id="build-help"),
        pytest.param(["status", "--help"], id="status-help"),
    ],
)
def test_version_and_help_load_no_heavy_library(args: list[str], tmp_path: Path) -> None:
    names, done = _loaded(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "typer" in names  # the importtime lines were read
    assert _heavy(names) == []


def test_status_loads_neither_pydantic_nor_numpy(tmp_path: Path) -> None:
    # a Path argument went through a pydantic TypeAdapter; the status records pulled in numpy
    names, done = _loaded("status", str(tmp_path / "releases"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]  # no such folder: a usage error
    assert "h5etl.pipeline.status" in names
    assert _heavy(names) == []


def test_releases_reads_hdf5_without_pydantic(tmp_path: Path) -> None:
    (tmp_path / "releases").mkdir()
    names, done = _loaded("releases", str(tmp_path / "releases"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no releases" in done.stdout
    assert "h5etl.release.listing" in names
    # the release notes' module named the config's Spec (pydantic) for its annotations only
    assert _heavy(names, ("pydantic", "PIL", "joblib", "tqdm", "h5etl.config")) == []


VALUES = ["1", "0", "-1", " 3", "1_0", "12", "abc", "", "x.yaml", ("a.yaml", "b"), 2, 0, None]


def _outcome(runtime: Any, param: Any, value: Any) -> tuple[str, Any]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=None)
    except Exception as exc:  # typer's BadParameter, or whatever typer raises
        return type(exc).__name__, str(exc)


def test_plain_values_coerce_as_typers_own_adapters() -> None:
    # h5etl.cli.values answers the simple values without pydantic: exactly as typer would
    import typer

    coercion = pytest.importorskip("typer._coercion", reason="typer before pydantic coercion")
    build_runtime_param = coercion.build_runtime_param
    from h5etl.cli.app import app
    from h5etl.cli.values import PlainValues

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    compared = 0
    for command in [group, *group.commands.values()]:
        for param in command.params:
            descriptor = param.type_descriptor  # type: ignore[attr-defined]
            ours = PlainValues(descriptor.parameter_info, descriptor.annotation)
            theirs = build_runtime_param(descriptor)
            for value in VALUES:
                if isinstance(value, tuple) != (param.nargs == -1):
                    continue  # click hands a many-valued argument a tuple, others a str
                got, want = _outcome(ours, param, value), _outcome(theirs, param, value)
                assert got == want, (command.name, param.name, value)
                compared += 1
    assert compared > 300
