"""Config errors a new user meets: typos named first and alone, recipe values blamed on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import MakeRaw, WriteConfig, base_config
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config import resources
from h5etl.config.load import load_spec
from h5etl.errors import ConfigError

runner = CliRunner()


@pytest.fixture
def raw_root(tmp_path: Path, make_raw: MakeRaw) -> Path:
    make_raw(tmp_path, n=1)
    return tmp_path


def _problems(config: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_spec(config)
    assert caught.value.exit_code == 2
    return caught.value.problems


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _own_names(fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config whose sources are not called image and mask."""
    data = base_config()
    data["sources"] = {"img": {"dir": "raw/images"}, "lbl": {"dir": "raw/masks"}}
    data["fields"] = fields or {
        "img": {"shape": [3, 24, 24], "mode": "RGB"},
        "lbl": {"shape": [1, 24, 24], "mode": "L", "values": [0, 1]},
        "filename": {"dtype": "str"},
    }
    return data


# --- item 5: the recipe pinned filename.source: image ---


def test_text_field_reads_the_first_source(raw_root: Path) -> None:
    # "fields.filename: source 'image' is not one of the sources": a key the user never wrote
    spec = load_spec(_write(raw_root / "own.yaml", _own_names()))
    assert spec.source_of("filename") == "img"


def test_recipe_file_name_field_comes_with_own_source_names(raw_root: Path) -> None:
    fields = {
        "img": {"shape": [3, 24, 24], "mode": "RGB"},
        "lbl": {"shape": [1, 24, 24], "mode": "L", "values": [0, 1]},
    }
    spec = load_spec(_write(raw_root / "own.yaml", _own_names(fields)))
    assert sorted(spec.fields) == ["filename", "img", "lbl"]
    assert spec.source_of("filename") == "img"


@pytest.mark.parametrize(
    "recipe_field",
    [
        pytest.param({"kind": "text"}, id="text"),
        pytest.param({"kind": "label", "from": "folder"}, id="label"),
    ],
)
def test_a_recipe_field_of_a_kind_comes_along_without_dtype_str(
    raw_root: Path, recipe_field: dict[str, Any]
) -> None:
    # only `dtype: str` kept a recipe field that names no source; `kind: text` was dropped
    recipe = {"defaults": {"fields": {"extra": recipe_field}}}
    (raw_root / "mine.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    data = _own_names()
    data["pipeline"] = "mine.yaml"
    spec = load_spec(_write(raw_root / "own.yaml", data))
    assert "extra" in spec.fields
    assert spec.fields["extra"].kind == recipe_field["kind"]


def test_shipped_recipe_pins_no_source() -> None:
    recipe = yaml.safe_load(
        (resources.data_dir("pipelines") / "segmentation.yaml").read_text("utf-8")
    )
    assert all("source" not in field for field in recipe["defaults"]["fields"].values())


@pytest.mark.parametrize(
    ("recipe_defaults", "key"),
    [
        pytest.param(
            {"fields": {"filename": {"dtype": "str", "source": "image"}}},
            "defaults.fields.filename.source: no source named 'image'",
            id="pinned-source",
        ),
        pytest.param(
            {"storage": {"chunk_samples": 0}}, "defaults.storage.chunk_samples", id="bad-value"
        ),
        pytest.param({"splits": {"train": 0.5}}, "defaults.splits: ", id="bad-splits"),
        pytest.param({"colour": 1}, "defaults.colour: unknown key", id="unknown-key"),
    ],
)
def test_error_from_a_recipe_value_names_the_recipe(
    raw_root: Path, recipe_defaults: dict[str, Any], key: str
) -> None:
    recipe = _write(raw_root / "my-recipe.yaml", {"defaults": recipe_defaults})
    data = _own_names()
    data["pipeline"] = "my-recipe.yaml"
    for name in ("splits", "storage"):
        data.pop(name)
    config = _write(raw_root / "own.yaml", data)
    problems = _problems(config)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{recipe}: {key}"), problems
    assert str(config) in problems[0]  # and which config used it


def test_config_value_over_a_recipe_default_is_the_configs(raw_root: Path) -> None:
    data = _own_names()
    data["storage"] = {"chunk_samples": 0}
    config = _write(raw_root / "own.yaml", data)
    assert _problems(config)[0].startswith(f"{config}: storage.chunk_samples")


# --- item 8: typos ---


def test_misspelled_top_level_key_is_the_only_line(raw_root: Path) -> None:
    # "feilds" came third, after two "fields.image/mask: needs a shape" side effects
    data = base_config()
    data["feilds"] = data.pop("fields")
    config = _write(raw_root / "config.yaml", data)
    assert _problems(config) == [f"{config}: feilds: unknown key; did you mean 'fields'?"]


def test_misspelled_top_level_key_on_the_command_line(raw_root: Path) -> None:
    data = base_config()
    data["feilds"] = data.pop("fields")
    config = _write(raw_root / "config.yaml", data)
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"h5etl: error: {config}: feilds: unknown key; did you mean 'fields'? "
        "(see docs/reference/config.md#top-level)"  # the page that lists every key
    ]


def test_misspelled_field_name_is_named(raw_root: Path) -> None:
    # only "fields.image: an image field needs a shape" was said; imag went unmentioned
    data = base_config()
    data["fields"] = {"imag" if k == "image" else k: v for k, v in data["fields"].items()}
    config = _write(raw_root / "config.yaml", data)
    problems = _problems(config)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{config}: fields.imag: no source named 'imag'"), problems
    assert "did you mean 'image'?" in problems[0]


def test_misspelled_source_of_a_field(raw_root: Path, write_config: WriteConfig) -> None:
    config = write_config(raw_root, fields={"mask": {"source": "msk"}})
    problems = _problems(config)
    assert problems[0].startswith(f"{config}: fields.mask.source: no source named 'msk'")
    assert "did you mean 'mask'?" in problems[0]


def test_other_problems_are_still_reported_beside_a_typo(
    raw_root: Path, write_config: WriteConfig
) -> None:
    config = write_config(raw_root, colour=1, seed="x")
    problems = _problems(config)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{config}: colour: unknown key")
    assert problems[1].startswith(f"{config}: seed:")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(
            {"storage": {"chunk_sample": 4}},
            "storage.chunk_sample: unknown key; did you mean 'chunk_samples'?",
            id="nested",
        ),
        pytest.param(
            {"fields": {"image": {"shap": [3, 24, 24]}}},
            "fields.image.shap: unknown key; did you mean 'shape'?",
            id="field-key",
        ),
        pytest.param(
            {"sources": {"image": {"globs": "*.png"}}},
            "sources.image.globs: unknown key; did you mean 'glob'?",
            id="source-key",
        ),
    ],
)
def test_misspelled_nested_keys_suggest_the_key(
    raw_root: Path, write_config: WriteConfig, overrides: dict[str, Any], expected: str
) -> None:
    config = write_config(raw_root, **overrides)
    assert _problems(config)[0].startswith(f"{config}: {expected}")


@pytest.mark.parametrize("dtype", ["uint9", "uint32", "float64"])
def test_bad_dtype_points_at_the_key_and_lists_the_choices(
    raw_root: Path, write_config: WriteConfig, dtype: str
) -> None:
    # "fields.image: dtype must be a numpy dtype name or str, got 'uint9'"
    config = write_config(raw_root, fields={"image": {"dtype": dtype}})
    assert _problems(config) == [
        f"{config}: fields.image.dtype: allowed dtypes are uint8, uint16, int16, float32 for "
        f"an image field (16-bit inputs into uint8 are scaled to 8 bits and reported), "
        f"got {dtype!r}"
    ]


# --- union values (from:, default:, max_rejects:) in one line, review of the kinds work ---


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        pytest.param(
            {"kind": "text", "from": "filenme"},
            "fields.extra.from: expected 'filename' or {table: <file>, key: <column>, column: "
            "<column>} or {json: <source>, key: <key>}, got 'filenme'; did you mean 'filename'?",
            id="text-from-typo",
        ),
        pytest.param(
            {"kind": "label", "from": {"tabel": "l.csv", "key": "file", "column": "label"}},
            "fields.extra.from.tabel: unknown key; did you mean 'table'? (its keys: table, key, "
            "column)",
            id="table-key-typo",
        ),
        pytest.param(
            {"kind": "text", "from": {"json": "image"}},
            "fields.extra.from.key: required key is missing",
            id="sidecar-without-key",
        ),
        pytest.param(
            {"kind": "value", "from": {"json": "image", "key": "a"}, "default": "none"},
            "fields.extra.default: expected a number or an integer or true or false, got 'none'",
            id="default",
        ),
        pytest.param(
            {"kind": "value", "from": {"json": "image", "key": ""}},
            "fields.extra.from.key: String should have at least 1 character",
            id="empty-sidecar-key",
        ),
    ],
)
def test_a_union_value_is_one_line_naming_the_closest_choice(
    raw_root: Path, write_config: WriteConfig, field: dict[str, Any], expected: str
) -> None:
    # "fields.x.from.TableRef.json: ...", "fields.x.from.literal['filename']: ..." and three
    # more lines in pydantic's words, for one value
    config = write_config(raw_root, fields={"extra": field})
    assert _problems(config) == [f"{config}: {expected}"]


def test_an_unknown_kind_says_a_plugins_kind_needs_its_package(
    raw_root: Path, write_config: WriteConfig
) -> None:
    # a config of a plugin's kind, read where the plugin is not installed, said only
    # "kind must be one of ...": nothing hinted that the kind was a plugin's
    config = write_config(raw_root, fields={"extra": {"kind": "checksum"}})
    (problem,) = _problems(config)
    assert problem.startswith(f"{config}: fields.extra.kind: kind must be one of image, mask, ")
    assert problem.endswith(
        ", got 'checksum'; a kind from a plugin needs its package installed here (entry "
        "points h5etl.kinds)"
    )


def test_max_rejects_out_of_range_is_one_line(raw_root: Path, write_config: WriteConfig) -> None:
    config = write_config(raw_root, max_rejects=1.5)
    assert _problems(config) == [
        f"{config}: max_rejects: expected a count (an integer >= 0) or a fraction "
        f"(0 <= f < 1), got 1.5"
    ]


def test_a_mapping_over_a_recipe_scalar_is_the_configs_mistake(raw_root: Path) -> None:
    # the recipe's label has from: folder; a config's own from: {...} was blamed on the recipe
    data = base_config()
    data["pipeline"] = "classification"
    data["sources"] = {"image": {"dir": "raw/images"}}
    data["fields"] = {
        "image": {"kind": "image", "shape": [3, 24, 24], "mode": "RGB"},
        "label": {"kind": "text", "from": {"json": "image"}},
    }
    config = _write(raw_root / "cls.yaml", data)
    assert _problems(config) == [f"{config}: fields.label.from.key: required key is missing"]


def test_a_recipe_path_that_is_not_there_is_named_as_a_path(
    raw_root: Path, write_config: WriteConfig
) -> None:
    # "no recipe named 'recipes/mine.yaml'": the README says it may be a path
    config = write_config(raw_root, pipeline="recipes/mine.yaml")
    (problem,) = _problems(config)
    assert f"no recipe file {raw_root / 'recipes' / 'mine.yaml'}" in problem


def test_validate_finds_a_missing_or_broken_label_table(
    raw_root: Path, write_config: WriteConfig
) -> None:
    # validate said OK; only build and --dry-run read the table
    origin = {"table": "labels.csv", "key": "file", "column": "label"}
    config = write_config(raw_root, fields={"label": {"kind": "label", "from": origin}})
    (problem,) = _problems(config)
    assert problem.startswith(f"{config}: fields.label.from.table: no such file: ")
    (raw_root / "labels.csv").write_text("file,label\na.png,cat\na.png,dog\n", "utf-8")
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "labels.csv" in line
    assert "(fields.label.from.table)" in line


def test_a_key_of_another_kind_on_a_field_without_kind_says_to_add_it(
    raw_root: Path, write_config: WriteConfig
) -> None:
    # "a image field takes no from" and "no source named 'label'": both away from the fix
    config = write_config(raw_root, fields={"label": {"from": "folder", "source": "image"}})
    problems = _problems(config)
    assert problems[0] == (
        f"{config}: fields.label.from: from is a key of label and text and value fields, but "
        f"this field has no kind: and is read as image (as before kinds existed); add kind: label"
    )


def test_a_misspelled_stratify_target_gets_a_suggestion(
    raw_root: Path, write_config: WriteConfig
) -> None:
    config = write_config(
        raw_root, fields={"label": {"kind": "label", "source": "image"}}, stratify="lable"
    )
    (problem,) = _problems(config)
    assert problem.endswith("(label fields: label); did you mean 'label'?")


def test_a_mask_dtype_that_is_a_list_is_a_config_error(raw_root: Path) -> None:
    # the fuzz test's find: {dtype: [], values: []} raised TypeError (a list is no dict key)
    data = base_config()
    data["fields"]["mask"]["dtype"] = []
    config = _write(raw_root / "config.yaml", data)
    problems = _problems(config)
    assert len(problems) == 1
    assert "fields.mask.dtype: allowed dtypes are" in problems[0]
    assert problems[0].endswith("for a mask field, got []")
