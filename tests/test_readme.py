"""The README's own Python snippets run as written, in the folder of the example they name.

A snippet marked ``<!-- readme-test: NAME -->`` on the line before its fence is run (``exec``)
with the working folder at what ``h5etl demo --example NAME`` made, so a snippet whose API,
field names or file layout drifted fails here instead of in a reader's hands. The snippets of
one example share one build.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h5etl.cli import app

README = Path(__file__).parent.parent / "README.md"
MARKED = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```python\n(.*?)\n```", re.DOTALL)
# at least this many tested snippets per example (issue 25: a rejects loop that raised, a
# Keras snippet with no model, series keys that were renamed)
REQUIRED = {"cells": 7, "ct-volumes": 1, "vibration": 2}


def snippets() -> list[tuple[str, str, int]]:
    """(example, code, line of its fence) of every marked snippet, in README order."""
    text = README.read_text(encoding="utf-8")
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2) for m in MARKED.finditer(text)
    ]


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each example's demo folder, built once on first use."""
    return {}


def _folder(examples: dict[str, Path], name: str, root: Path) -> Path:
    if name not in examples:
        folder = root / name
        result = CliRunner().invoke(
            app, ["demo", "--example", name, "--dir", str(folder), "-j", "1", "-q"]
        )
        assert result.exit_code == 0, result.output
        examples[name] = folder
    return examples[name]


def test_every_reading_section_keeps_a_marked_snippet() -> None:
    found: dict[str, int] = {}
    for name, _, _ in snippets():
        found[name] = found.get(name, 0) + 1
    short = [name for name, count in REQUIRED.items() if found.get(name, 0) < count]
    assert not short, f"marked snippets {found}, at least {REQUIRED} expected"


# Not the snippets' doing: Keras 3 on torch converts tensors to numpy through a deprecated
# __array__ call (under -W error its progress bar then fails); torch warns when a loader
# starts more workers than this machine has cores.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    ("name", "code", "line"), [pytest.param(*s, id=f"{s[0]}-line{s[2]}") for s in snippets()]
)
def test_a_readme_snippet_runs_as_written(
    name: str,
    code: str,
    line: int,
    examples: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))
    folder = _folder(examples, name, tmp_path_factory.getbasetemp() / "readme")
    monkeypatch.chdir(folder)
    compiled = compile(code, f"README.md:{line}", "exec")
    exec(compiled, {"__name__": "__readme__"})  # the README's own code
