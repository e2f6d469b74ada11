"""The README's and the docs' own snippets and configs work as written (issue 27: docs that
cannot rot).

Markers, each on the line before a fence:

- ``<!-- docs-test: NAME -->`` (or ``readme-test: NAME``) before a ``python`` fence: the code
  runs (``exec``) with the working folder at what ``h5etl demo --example NAME`` made; before a
  ``sh`` fence: each ``h5etl ...`` line runs through the CLI there and must exit 0 (``cd``,
  ``pip`` and the ``h5etl demo`` line the folder came from are what the reader types to get
  there). The snippets of one example share one demo build, README and docs alike.
- ``<!-- no-run: WHY -->`` before a ``python`` fence of ``docs/``: it is not meant to run.
  An unmarked ``python`` fence in ``docs/`` fails here.
- A ``yaml`` fence with a top-level ``name:`` is a config: the real loader validates it (its
  folders need not exist). ``<!-- config-fragment: BASE -->``: the fence is laid over
  ``configs/BASE.yaml`` (each top-level key's entries replace the base's) and the result is
  validated. ``<!-- not-a-config: WHY -->``: not validated. Any other ``yaml`` fence fails.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import _read_yaml_mapping, load_spec, parse_spec
from h5etl.errors import ConfigError

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"^(?:<!-- ([\w-]+): ?([^\n]*?) -->\n)?```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE
)
# at least this many tested snippets per example (issue 25: a rejects loop that raised, a
# Keras snippet with no model, series keys that were renamed)
REQUIRED = {"cells": 7, "ct-volumes": 1, "vibration": 2}
TESTED = ("python", "sh")
QUICK_STARTS = ("segmentation", "classification", "superres", "volumes", "series", "flat")


@dataclass(frozen=True, slots=True)
class Fence:
    page: Path
    line: int  # of the opening fence
    marker: str  # "" when unmarked
    argument: str
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fences() -> Iterator[Fence]:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start(3)) + 1
            yield Fence(page, line, m[1] or "", m[2] or "", m[3], m[4].rstrip("\n"))


def marked_snippets() -> list[Fence]:
    """The marked python and sh fences, each distinct snippet of an example once (the docs
    copied the README's; both are checked, each runs once)."""
    seen: set[tuple[str, str]] = set()
    found = []
    for fence in fences():
        if fence.marker not in ("docs-test", "readme-test") or fence.language not in TESTED:
            continue
        if (fence.argument, fence.code) not in seen:
            seen.add((fence.argument, fence.code))
            found.append(fence)
    return found


@pytest.fixture(scope="module")
def examples() -> dict[str, Path]:
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
    for fence in marked_snippets():
        if fence.language == "python":
            found[fence.argument] = found.get(fence.argument, 0) + 1
    short = [name for name, count in REQUIRED.items() if found.get(name, 0) < count]
    assert not short, f"marked snippets {found}, at least {REQUIRED} expected"


@pytest.mark.parametrize("page", QUICK_STARTS)
def test_a_quick_start_builds_and_trains_as_written(page: str) -> None:
    path = ROOT / "docs" / "tutorials" / f"{page}.md"
    marked = {f.language for f in marked_snippets() if f.page == path}
    text = path.read_text(encoding="utf-8")
    assert "h5etl demo" in text, f"{path.name}: no h5etl demo to start from"
    assert marked == {"python", "sh"}, f"{path.name}: tested fences {marked}"


def test_every_python_snippet_of_the_docs_runs_or_says_it_does_not() -> None:
    unmarked = [
        f.where
        for f in fences()
        if f.language == "python"
        and f.page != ROOT / "README.md"
        and f.marker not in ("docs-test", "readme-test", "no-run")
    ]
    assert not unmarked, f"python fences neither tested nor marked no-run: {unmarked}"


# Not the snippets' doing: Keras 3 on torch converts tensors to numpy through a deprecated
# __array__ call (under -W error its progress bar then fails); torch warns when a loader
# starts more workers than this machine has cores.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("fence", [pytest.param(f, id=f.where) for f in marked_snippets()])
def test_a_snippet_runs_as_written(
    fence: Fence,
    examples: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))
    folder = _folder(examples, fence.argument, tmp_path_factory.getbasetemp() / "docs")
    monkeypatch.chdir(folder)
    if fence.language == "sh":
        _run_commands(fence)
        return
    compiled = compile(fence.code, fence.where, "exec")
    exec(compiled, {"__name__": "__docs__"})  # the docs' own code


def _run_commands(fence: Fence) -> None:
    for line in fence.code.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] in ("cd", "pip") or words[:2] == ["h5etl", "demo"]:
            continue
        assert words[0] == "h5etl", f"{fence.where}: a tested sh fence runs h5etl only: {line}"
        args = words[1:]
        if args[0] == "build":
            args += ["--jobs", "1", "--quiet"]  # no worker pool for a build that is up to date
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, f"{fence.where}: {line}\n{result.output}"


# --- configs -------------------------------------------------------------------------------


def _laid_over(base: Mapping[str, Any], fragment: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in fragment.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _configs() -> list[Any]:
    return [
        pytest.param(f, id=f.where)
        for f in fences()
        if f.language in ("yaml", "yml") and f.marker != "not-a-config"
    ]


@pytest.mark.parametrize("fence", _configs())
def test_a_config_in_the_docs_validates(fence: Fence, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(fence.code, "utf-8")
    try:
        # the loader's own YAML reading: colours as [R, G, B] keys, duplicate keys refused
        data = _read_yaml_mapping(path, "config")
        if fence.marker == "config-fragment":
            base = _read_yaml_mapping(ROOT / "configs" / f"{fence.argument}.yaml", "base")
            parse_spec(_laid_over(base, data), config_path=path, check_paths=False)
            return
        assert "name" in data, (
            f"{fence.where}: a yaml fence without name: is no whole config; mark it "
            "<!-- config-fragment: BASE --> or <!-- not-a-config: WHY -->"
        )
        load_spec(path, check_paths=False)
    except ConfigError as exc:
        pytest.fail(f"{fence.where}: {exc}")


def test_nothing_the_readme_documented_is_lost() -> None:
    """Each heading the README had before the move (tests/data/readme_headings.txt) is a
    heading of a docs page or of CHANGELOG.md."""
    listed = (ROOT / "tests" / "data" / "readme_headings.txt").read_text("utf-8").splitlines()
    old = [line for line in listed if line and not line.startswith("#")]
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "CHANGELOG.md"]
    heading = re.compile(r"^#{1,6} (.*?)(?: \{#[\w-]+\})?$", re.MULTILINE)
    found = {
        m[1].strip().strip("[]")
        for page in pages
        for m in heading.finditer(page.read_text("utf-8"))
    }
    lost = [text for text in old if text not in found]
    assert not lost, f"README headings with no page: {lost}"
