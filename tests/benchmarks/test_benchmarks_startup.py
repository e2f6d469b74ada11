"""The start-up benchmark reads ``-X importtime`` as Python writes it; no timings."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parent  # the scripts beside these tests


@pytest.fixture(scope="module")
def startup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_startup", BENCH / "startup.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_importtime_lines_give_counts_costs_and_the_libraries_loaded(startup: ModuleType) -> None:
    code = "import json, h5etl.cli.app"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = startup.parse_importtime(done.stderr, top=100)
    names = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert found.count == len(names) - 1  # the header line is not a module
    tops = [name for name, _ in found.heaviest]
    assert "h5etl.cli.app" in tops
    assert "json" in tops  # one space of indent: imported at the top level
    assert all(seconds > 0 for _, seconds in found.heaviest)
    assert found.seconds == pytest.approx(sum(seconds for _, seconds in found.heaviest))
    assert "pydantic" not in found.loaded  # the watched libraries, as the CLI test holds
    assert startup.parse_importtime("import time: self [us] | cumulative | imported package\n") == (
        startup.Imports(0, 0.0, frozenset(), ())
    )
