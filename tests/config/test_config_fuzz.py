"""Config fuzzing: any YAML document ends in a valid Spec or a ConfigError, never a traceback."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import base_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_config_places import model_names
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.config.spec import Spec
from h5etl.errors import ConfigError

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "lzf",
            "gzip",
            "blosc",
            "zstd",
            "none",
            "RGB",
            "L",
            "uint8",
            "str",
            "*.png",
            "raw/images",
            "segmentation",
            "reject",
            "crop",
            "skip",
            "fail",
        ]
    ),
)
KEYS = st.sampled_from(
    [
        "name",
        "pipeline",
        "output",
        "sources",
        "fields",
        "splits",
        "storage",
        "pad",
        "seed",
        "image",
        "mask",
        "shape",
        "chunks",
        "dtype",
        "mode",
        "values",
        "compression",
        "codec",
        "level",
        "dir",
        "glob",
        "fill",
        "oversize",
        "on_error",
        "max_rejects",
        "attrs",
        "chunk_samples",
    ]
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(KEYS, st.text(max_size=6)), children, max_size=5),
    ),
    max_leaves=25,
)

tried = {"documents": 0}
MODEL_NAMES = model_names()


def outcome(path: Path, text: str) -> Spec | ConfigError:
    path.write_text(text, encoding="utf-8")
    tried["documents"] += 1
    try:
        return load_spec(path)
    except ConfigError as exc:
        error = exc
    message = str(error)
    assert message.strip(), "a config error must say what is wrong"
    assert "Traceback" not in message
    # internal model names (SourceSpec, StorageSpec...) are no words of the config; the
    # config's own words may be quoted back (a value ``{Spec: null}`` is named as given)
    leaked = [
        name
        for name in MODEL_NAMES
        if re.search(rf"\b{name}\b", message) and not re.search(rf"\b{name}\b", text)
    ]
    assert not leaked, message
    return error


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "raw" / "images").mkdir(parents=True)
    (root / "raw" / "masks").mkdir(parents=True)
    return root


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=DOCUMENTS)
def test_random_documents(workspace: Path, document: Any) -> None:
    text = yaml.safe_dump(document, allow_unicode=True)
    outcome(workspace / "random.yaml", text)


def _set_path(config: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    mutated = copy.deepcopy(config)
    node: Any = mutated
    for key in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            return mutated
        node = node[key]
    node[path[-1]] = value
    return mutated


PATHS = st.sampled_from(
    [
        ["name"],
        ["pipeline"],
        ["output"],
        ["seed"],
        ["splits"],
        ["splits", "train"],
        ["sources"],
        ["sources", "image"],
        ["sources", "image", "dir"],
        ["sources", "mask", "glob"],
        ["fields"],
        ["fields", "image"],
        ["fields", "image", "shape"],
        ["fields", "image", "chunks"],
        ["fields", "mask", "values"],
        ["fields", "mask", "mode"],
        ["fields", "image", "dtype"],
        ["fields", "filename", "dtype"],
        ["fields", "mask", "compression"],
        ["storage"],
        ["storage", "chunk_samples"],
        ["storage", "compression"],
        ["pad", "fill"],
        ["pad", "oversize"],
        ["on_error"],
        ["max_rejects"],
        ["attrs"],
        ["unknown_key"],
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=PATHS, value=DOCUMENTS)
def test_mutated_valid_config(workspace: Path, path: list[str], value: Any) -> None:
    document = _set_path(base_config(), path, value)
    outcome(workspace / "mutated.yaml", yaml.safe_dump(document, allow_unicode=True))


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text(workspace: Path, text: str) -> None:
    outcome(workspace / "text.yaml", text)


def test_cli_exit_code_2_and_one_line_per_problem(workspace: Path) -> None:
    document = _set_path(base_config(), ["fields", "image", "chunks"], [4, 3, 99, 24])
    document["storage"] = {"chunk_samples": 4, "compression": "gzip", "level": 3}
    path = workspace / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "fields.image.chunks" in result.output or "storage.level" in result.output
    print(f"config documents fuzzed so far: {tried['documents']}")
