"""Config paths: resolved against the config's folder, stored relative to it, hashed that way."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest
import yaml
from conftest import MakeRaw, WriteConfig, base_config
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.fields import LabelField, TableRef
from h5etl.config.load import load_spec, parse_spec
from h5etl.config.spec import spec_sha256, spec_text

runner = CliRunner()


def _stored(spec_yaml: str) -> dict[str, object]:
    data = yaml.safe_load(spec_yaml)
    assert isinstance(data, dict)
    return data


def test_default_output_is_the_config_folders_releases(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # output: left out resolved against the current directory: two histories for one config
    project = tmp_path / "project"
    project.mkdir()
    make_raw(project, n=1)
    config = write_config(project, output=None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_spec(config)
    assert spec.output == project / "releases"
    assert _stored(spec_text(spec))["output"] == "releases"


def test_default_output_build_from_another_folder(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    make_raw(project, n=2)
    config = write_config(project, output=None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["build", str(config), "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert not (elsewhere / "releases").exists()
    with h5py.File(project / "releases" / "cells.h5", "r") as handle:
        stored = _stored(str(handle.attrs["config"]))
    assert stored["output"] == "releases"


def test_moved_project_keeps_its_config_digest(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the stored config embedded absolute paths, so a moved project got a new config_sha256
    first = tmp_path / "first"
    first.mkdir()
    make_raw(first, n=1)
    write_config(first)
    second = tmp_path / "moved" / "deeper"
    shutil.copytree(first, second)
    spec_a, spec_b = load_spec(first / "config.yaml"), load_spec(second / "config.yaml")
    assert spec_sha256(spec_a) == spec_sha256(spec_b)
    assert spec_text(spec_a) == spec_text(spec_b)
    stored = _stored(spec_text(spec_a))
    assert stored["output"] == "releases"
    assert stored["sources"] == {
        "image": {"dir": "raw/images", "glob": "*.png"},
        "mask": {"dir": "raw/masks", "glob": "*.png"},
    }
    # at run time the paths stay absolute, each in its own copy
    assert spec_b.output == second / "releases"
    assert spec_b.sources["image"].dir == second / "raw" / "images"
    assert spec_b.sources["image"].dir.is_absolute()


def test_moved_project_builds_with_the_same_config_sha256(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    first = tmp_path / "first"
    first.mkdir()
    make_raw(first, n=2)
    write_config(first)
    second = tmp_path / "second"
    shutil.copytree(first, second)
    digests = []
    for project in (first, second):
        result = runner.invoke(app, ["build", str(project / "config.yaml"), "-j", "1", "-q"])
        assert result.exit_code == 0, result.output
        with h5py.File(project / "releases" / "cells.h5", "r") as handle:
            digests.append((str(handle.attrs["config_sha256"]), str(handle.attrs["config"])))
            assert str(first) not in str(handle.attrs["config"])
    assert digests[0] == digests[1]


def test_outside_and_absolute_paths(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a path out of the config folder is stored as ../x; one written absolute stays absolute
    make_raw(tmp_path, n=1)
    project = tmp_path / "project"
    project.mkdir()
    config = write_config(
        project,
        output=str(tmp_path / "out"),
        sources={"image": {"dir": "../raw/images"}, "mask": {"dir": str(tmp_path / "raw/masks")}},
    )
    spec = load_spec(config)
    assert spec.sources["image"].dir == project / "../raw/images"
    assert spec.sources["image"].dir.is_absolute()
    stored = _stored(spec_text(spec))
    assert stored["output"] == str(tmp_path / "out")
    sources = stored["sources"]
    assert isinstance(sources, dict)
    assert sources["image"]["dir"] == "../raw/images"
    assert sources["mask"]["dir"] == str(tmp_path / "raw/masks")


def test_spellings_of_one_path_hash_alike(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    plain = load_spec(write_config(tmp_path))
    dotted = load_spec(
        write_config(
            tmp_path,
            config_name="dotted.yaml",
            output="./releases/",
            sources={"image": {"dir": "./raw/images/"}},
        )
    )
    assert spec_sha256(plain) == spec_sha256(dotted)


def test_changed_output_is_stored_as_it_is(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a spec whose output was replaced in code must not store the config's old relative path
    make_raw(tmp_path, n=1)
    spec = load_spec(write_config(tmp_path))
    moved = spec.model_copy(update={"output": tmp_path / "api"})
    assert _stored(spec_text(moved))["output"] == str(tmp_path / "api")


def test_config_file_is_kept_out_of_the_stored_config(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=1)
    config = write_config(tmp_path)
    with monkeypatch.context() as here:
        here.chdir(tmp_path)
        spec = load_spec(Path(config.name))
    assert spec.config_file == config
    assert spec.config_file.is_absolute()
    assert "config_file" not in spec_text(spec)
    assert str(config) not in spec_text(spec)
    # no real file behind the mapping: no config_file, paths still relative to its folder
    fake = parse_spec(base_config(), config_path=tmp_path / "not-a-file.yaml")
    assert fake.config_file is None
    assert fake.output == tmp_path / "releases"
    assert spec_sha256(fake) == spec_sha256(spec)


def test_config_file_cannot_be_set_from_yaml(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    config = write_config(tmp_path, config_file="/etc/passwd")
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    assert "config_file: unknown key" in result.output


def test_a_sidecar_table_is_found_beside_the_config_and_stored_as_written(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a label table is a path in the config like a source folder: relative to the config
    make_raw(tmp_path, n=2)
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "labels.csv").write_text("file,label\n", encoding="utf-8")
    config = write_config(
        tmp_path,
        fields={
            "label": {"kind": "label", "from": {"table": "meta/labels.csv", "column": "label"}}
        },
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # undone after the test (its folder is removed then)
    spec = load_spec(config)
    field = spec.fields["label"]
    assert isinstance(field, LabelField)
    assert isinstance(field.from_, TableRef)
    assert field.from_.table == tmp_path / "meta" / "labels.csv"
    fields = _stored(spec_text(spec))["fields"]
    assert isinstance(fields, dict)
    assert fields["label"]["from"] == {
        "table": "meta/labels.csv",
        "key": "file",
        "column": "label",
    }
