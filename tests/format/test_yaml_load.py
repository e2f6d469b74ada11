"""yaml_load: libyaml's parser where it cannot crash, with the same data as PyYAML's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from h5etl.config import load as config_load
from h5etl.format import yaml_load

ROOT = Path(__file__).parents[2]
DEEP = "name: " + "[" * 100_000 + "]" * 100_000 + "\n"


def _documents() -> list[Path]:
    """Every config and recipe the project ships."""
    return sorted(
        path for folder in ("configs", "pipelines") for path in (ROOT / folder).glob("*.yaml")
    )


def test_the_fast_parser_reads_every_shipped_document_as_pyyaml_does() -> None:
    documents = _documents()
    assert len(documents) >= 15, documents
    plain = 0
    assert config_load._FastLoader is not None  # PyYAML is built with libyaml here
    for path in documents:
        text = path.read_text(encoding="utf-8")
        assert yaml_load.c_parser_is_safe(text), path
        fast = yaml.load(text, Loader=config_load._FastLoader)  # the config's own loaders
        assert fast == yaml.load(text, Loader=config_load._Loader), path
        try:  # a colour table's sequence keys need the config's loader
            expected = yaml.load(text, Loader=yaml.SafeLoader)
        except yaml.constructor.ConstructorError:
            continue
        assert yaml_load.safe_load(text) == expected, path
        plain += 1
    assert plain >= 10


def test_deep_nesting_goes_to_the_parser_that_raises() -> None:
    assert not yaml_load.c_parser_is_safe(DEEP)
    with pytest.raises(RecursionError):
        yaml_load.safe_load(DEEP)


def test_the_cli_says_a_deep_config_is_nested_too_deeply(tmp_path: Path) -> None:
    # build reads the config's name with yaml_load before it loads it (release.naming):
    # with libyaml there, the process died of a segmentation fault
    config = tmp_path / "c.yaml"
    config.write_text(DEEP, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert done.stderr.strip().splitlines() == [f"h5etl: error: {config}: YAML nested too deeply"]
