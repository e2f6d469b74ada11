"""The examples ``h5etl demo --example NAME`` builds: each builds, checks deep, and rejects
exactly the inputs its maker broke on purpose, for the reasons the maker gave."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h5etl import examples
from h5etl.cli.app import app
from h5etl.config import resources

runner = CliRunner()
NAMES = sorted(examples.EXAMPLES)


def _invoke(*args: str | Path) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args], prog_name="h5etl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def _build_and_check(name: str, folder: Path, expected_raw: Path) -> None:
    """Build ``name`` into ``folder`` through the CLI, check it deep, and compare its rejects
    with what the maker (run again into ``expected_raw``) says it broke."""
    code, output = _invoke("demo", "--example", name, "--dir", folder, "-j", "1", "-q")
    assert code == 0, output
    expected = examples.EXAMPLES[name].make(expected_raw)
    assert expected, f"{name} breaks nothing on purpose"
    assert _tree(folder / "raw") == _tree(expected_raw)  # deterministic
    links = [p for p in (folder / "releases").iterdir() if p.is_symlink()]
    assert len(links) == 1, links
    code, checked = _invoke("check", links[0], "--deep")
    assert code == 0, checked
    (report,) = (folder / "releases").glob("*.rejects.jsonl")
    rejects = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    raw = (folder / "raw").resolve()
    by_path = {Path(r["path"]).resolve().relative_to(raw).as_posix(): r for r in rejects}
    for path, broken in expected.items():
        assert path in by_path, f"{path} ({broken.why}) was not rejected: {sorted(by_path)}"
        assert by_path[path]["reason"] == broken.reason, (path, broken, by_path[path])
    reasons = {by_path[path]["key"]: broken.reason for path, broken in expected.items()}
    assert {(r["key"], r["reason"]) for r in rejects} == set(reasons.items())
    total = sum(1 for line in output.splitlines() if line.startswith("rejects: "))
    assert total == 1, output


@pytest.mark.parametrize("name", NAMES)
def test_example_builds_and_rejects_exactly_its_broken_inputs(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)  # as a user runs it: from anywhere but the example's folder
    # (a table path, raw/labels.csv, is relative to the config's folder, not to the cwd)
    _build_and_check(name, tmp_path / name, tmp_path / "again" / "raw")


def test_classification_reports_its_empty_class_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _invoke("demo", "--example", "classification", "-j", "1", "-q")
    assert code == 0, output
    assert "warning: fields.label: class folder 'triangle' is empty" in output
    assert (tmp_path / "h5etl-classification" / "releases" / "shapes.h5").is_symlink()


def test_an_example_built_again_is_up_to_date(tmp_path: Path) -> None:
    folder = tmp_path / "seed"
    assert _invoke("demo", "--example", "seed", "--dir", folder, "-j", "1", "-q")[0] == 0
    code, output = _invoke("demo", "--example", "seed", "--dir", folder, "-j", "1", "-q")
    assert code == 0, output
    assert "seed: nothing changed since seed-v0001 (" in output
    assert os.readlink(folder / "releases" / "seed.h5") == "seed-v0001.h5"


def test_an_example_refuses_another_examples_folder(tmp_path: Path) -> None:
    folder = tmp_path / "seed"
    assert _invoke("demo", "--example", "seed", "--dir", folder, "-j", "1", "-q")[0] == 0
    code, output = _invoke("demo", "--example", "ct16", "--dir", folder, "-j", "1", "-q")
    assert code == 2, output
    assert output.startswith(f"h5etl: error: {folder}: holds raw and releases/ but no ct16.yaml")
    assert sorted(p.name for p in folder.iterdir()) == ["raw", "releases", "seed.yaml"]


@pytest.mark.parametrize("name", ["list", "nope"])
def test_list_or_an_unknown_example_names_them_all_in_one_line(name: str) -> None:
    code, output = _invoke("demo", "--example", name)
    assert code == 2
    (line,) = output.splitlines()
    assert line.endswith(examples.names_line())
    assert line.startswith("h5etl: error: no example named 'nope'; " if name == "nope" else "ex")
    for known in NAMES:
        assert known in line


def test_every_shipped_config_validates(tmp_path: Path) -> None:
    by_config = {example.config: example for example in examples.EXAMPLES.values()}
    shipped = sorted(resources.data_dir("configs").glob("*.yaml"))
    assert {path.name for path in shipped} == set(by_config)  # one example per config
    for path in shipped:
        folder = tmp_path / path.stem
        by_config[path.name].make(folder / "raw")
        config = folder / path.name
        shutil.copyfile(path, config)
        code, output = _invoke("validate", config)
        assert code == 0, output
        assert output.startswith(f"{config}: OK"), output


def test_every_recipe_is_used_by_a_shipped_config() -> None:
    used = {
        line.split(":", 1)[1].split("#")[0].strip()
        for path in resources.data_dir("configs").glob("*.yaml")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.startswith("pipeline:")
    }
    assert set(resources.recipe_names()) <= used, resources.recipe_names()
