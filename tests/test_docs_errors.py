"""Error messages point into the docs (issue 27): a reject reason, a config error name the
reference section that explains them, once, and every section they can name exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeRaw, WriteConfig
from typer.testing import CliRunner

from h5etl import docrefs
from h5etl.cli.app import app
from h5etl.config.spec import Spec
from h5etl.inputs.reasons import TABLE

ROOT = Path(__file__).parent.parent
RAISED = re.compile(r'RejectError\(\s*"(\w+)"')


def _ids(text: str) -> set[str]:
    """The anchors a page pins: ``{#id}`` attribute lists and ``id="..."`` elements."""
    return set(re.findall(r"\{#([\w-]+)\}", text)) | set(re.findall(r'id="([\w-]+)"', text))


def _page(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location(
        "docs_hooks", ROOT / "docs" / "_tools" / "docs_hooks.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_reject_reason_has_its_section() -> None:
    raised = {m for p in (ROOT / "h5etl").rglob("*.py") for m in RAISED.findall(p.read_text())}
    codes = raised | {reason.code for reason in TABLE}
    missing = codes - _ids(_page(docrefs.REJECTS))
    assert not missing, f"reasons without a section in {docrefs.REJECTS}: {sorted(missing)}"


def test_every_config_key_a_message_can_name_has_its_section() -> None:
    page, _, _ = docrefs.CONFIG.partition("#")
    ids = _ids(_page(page)) | _ids(_hooks().config_keys())
    keys = {info.alias or name for name, info in Spec.model_fields.items()} | {"top-level"}
    anchors = {key: docrefs.config_key(key) for key in keys}
    missing = {k: a for k, a in anchors.items() if a is None or a.partition("#")[2] not in ids}
    assert not missing, f"config keys without their section in {page}: {missing}"


@pytest.mark.parametrize(
    "where",
    [docrefs.GUARD, *(docrefs.guard(k) for k in ("max_rejects", "max_shrink", "allow_empty"))],
)
def test_the_guard_sections_exist(where: str) -> None:
    page, _, anchor = where.partition("#")
    assert anchor in _ids(_page(page))


def test_the_loss_guard_names_its_section(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6, broken={"bad": "truncated"})
    config = write_config(tmp_path, max_rejects=1)
    result = CliRunner().invoke(app, ["build", str(config), "-j", "1", "-q"])
    assert result.exit_code == 1
    assert result.output.count("see docs/reference/") == 1, result.output
    assert result.output.rstrip().endswith("(see docs/reference/guard.md#max_rejects)")


def test_a_config_error_names_its_section_once(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    config = write_config(tmp_path, storage={"chunk_samples": 0})
    result = CliRunner().invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].endswith(
        "storage.chunk_samples: Input should be greater than 0, got 0 "
        "(see docs/reference/config.md#storage)"
    ), lines[0]


def test_a_reject_names_its_reason_section(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6, broken={"bad": "truncated"})
    skip = write_config(tmp_path, max_rejects=0.5)
    result = CliRunner().invoke(app, ["build", str(skip), "-j", "1", "-q"])
    assert result.exit_code == 0, result.output
    summary = [line for line in result.output.splitlines() if line.startswith("rejects:")]
    assert summary == ["rejects: 2 files (truncated 2); see docs/reference/rejects.md#truncated"]

    fail = write_config(tmp_path, config_name="fail.yaml", name="cells2", on_error="fail")
    result = CliRunner().invoke(app, ["build", str(fail), "-j", "1", "-q"])
    assert result.exit_code == 1
    assert result.output.count("see docs/reference/") == 1, result.output
    assert result.output.rstrip().endswith("(see docs/reference/rejects.md#truncated)")


@pytest.mark.parametrize("key", ["--notes", "", None])
def test_no_section_for_what_is_no_config_key(key: str | None) -> None:
    assert docrefs.config_key(key) is None
