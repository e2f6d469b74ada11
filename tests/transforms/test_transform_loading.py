"""Resolving the calls a config names (issue 28, item 1): a module beside the config, an
installed module, a built-in; and every way a call can be wrong, as one line naming it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from h5etl.transforms import loading
from h5etl.transforms.loading import (
    BUILTIN_MODULE,
    CallError,
    CodeChanged,
    Loader,
    function_of,
)

PREP = """
import numpy as np

def invert(value, *, top=255):
    return (top - value).astype(value.dtype)

def noisy(value, *, scale, rng):
    return value + rng.normal(0, scale, value.shape)

NOT_CALLABLE = 3
"""

# writes a marker when imported: a module beside the config that no call names
OTHER = """
from pathlib import Path
Path(__file__).with_suffix(".imported").write_text("imported")

def invert(value):
    return value
"""


def _config_dir(tmp_path: Path, **modules: str) -> Path:
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / "cells.yaml").write_text("name: cells\n")
    for name, source in {"prep": PREP, **modules}.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A package importable from sys.path (as an installed one is), unique to the test."""
    name = f"lab_{abs(hash(str(tmp_path))) % 10**8}"
    site = tmp_path / "site"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    module = site / name / "prep.py"
    module.write_text("def double(value, *, times=2):\n    return value * times\n")
    monkeypatch.syspath_prepend(str(site))
    yield name, module
    for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[loaded]


def test_a_module_beside_the_config_resolves_and_runs_in_any_process(tmp_path: Path) -> None:
    folder = _config_dir(tmp_path)
    loader = Loader(folder)
    spec = loader.resolve("prep:invert", {"top": 200})
    assert spec.module.origin == "beside_config"
    assert spec.module.source == (folder / "prep.py").read_bytes()
    assert spec.args == {"top": 200}
    assert not spec.wants_rng
    assert loader.resolve("prep:noisy", {"scale": 1.0}).wants_rng
    assert [ref.name for ref in loader.imported] == ["prep"]
    assert function_of(spec)(np.uint8(100), top=200) == 100
    # nothing added to sys.path, and the module runs under a name of its own
    assert str(folder) not in sys.path
    assert "prep" not in sys.modules


def test_only_the_modules_named_are_imported(tmp_path: Path) -> None:
    folder = _config_dir(tmp_path, other=OTHER)
    loader = Loader(folder)
    loader.resolve("prep:invert")
    loader.resolve("crop", {"size": [4, 4]})
    assert not (folder / "other.imported").exists()
    assert [ref.name for ref in loader.imported] == ["prep"]  # built-ins are h5etl's own code


def test_a_builtin_resolves_by_its_short_name() -> None:
    spec = Loader(None).resolve("crop", {"size": [4, 4]})
    assert spec.module.name == BUILTIN_MODULE
    assert spec.module.origin == "builtin"
    assert spec.module.source is None


def test_an_installed_module_resolves_and_a_changed_file_is_caught(
    tmp_path: Path, installed: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, path = installed
    spec = Loader(_config_dir(tmp_path)).resolve(f"{name}.prep:double", {"times": 3})
    assert spec.module.origin == "installed"
    assert spec.module.path == str(path)
    assert function_of(spec)(2, times=3) == 6
    # edited mid-build: this process still runs the code it imported, the one recorded
    path.write_text("def double(value, *, times=2):\n    return value * times * 10\n")
    assert function_of(spec)(2, times=3) == 6
    # a fresh worker would import the edited file: it must not run code other than recorded
    monkeypatch.setattr(loading, "_HASHES", {})
    monkeypatch.setattr(loading, "_FUNCTIONS", {})
    for loaded in [m for m in sys.modules if m.startswith(f"{name}.")]:
        monkeypatch.delitem(sys.modules, loaded)
    with pytest.raises(CodeChanged, match=r"prep.py is not the code this build recorded"):
        function_of(spec)


def test_the_file_beside_the_config_wins_over_an_installed_module(
    tmp_path: Path, installed: tuple[str, Path]
) -> None:
    name, _ = installed
    folder = _config_dir(tmp_path, **{name: "def double(value):\n    return value\n"})
    spec = Loader(folder).resolve(f"{name}:double")
    assert spec.module.origin == "beside_config"


@pytest.mark.parametrize(
    ("call", "args", "problem"),
    [
        pytest.param("nowhere:f", {}, "no module 'nowhere': put nowhere.py beside", id="module"),
        pytest.param("prep:missing", {}, "has no 'missing'", id="attribute"),
        pytest.param("prep:NOT_CALLABLE", {}, "NOT_CALLABLE is a int, not a function", id="value"),
        pytest.param("prep:invert", {"bottom": 1}, "do not fit (value, *, top=255)", id="args"),
        pytest.param("prep:noisy", {}, "missing a required argument: 'scale'", id="missing"),
        pytest.param("prep:noisy", {"scale": 1, "rng": 3}, "'rng' is given by h5etl", id="rng"),
        pytest.param("prep:invert", {"top": float("nan")}, "plain YAML values", id="nan"),
        pytest.param("prep:invert:x", {}, "package.module:function", id="syntax"),
        pytest.param("sharpen", {}, "no built-in transform of that name", id="builtin"),
        pytest.param("crop", {"size": [0, 4]}, "positive integers", id="builtin-args"),
        pytest.param("normalise", {"method": "meanstd"}, "needs both mean", id="normalise"),
        pytest.param("cast", {"dtype": "complex64"}, "integer or float", id="cast"),
        pytest.param("window", {"low": 3, "high": 1}, "low must be below high", id="window"),
    ],
)
def test_a_call_that_cannot_run_is_one_line_naming_it(
    tmp_path: Path, call: str, args: dict[str, object], problem: str
) -> None:
    with pytest.raises(CallError) as caught:
        Loader(_config_dir(tmp_path)).resolve(call, args)
    message = str(caught.value)
    assert message.startswith(f"{call}: ")
    assert problem in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


def test_a_module_that_fails_on_import_is_one_line(tmp_path: Path) -> None:
    folder = _config_dir(tmp_path, bad="import numpy\nraise RuntimeError('no GPU\\nhere')\n")
    with pytest.raises(
        CallError, match=r"^bad:f: running .*bad.py failed: RuntimeError: no GPU here$"
    ):
        Loader(folder).resolve("bad:f")
    assert not [m for m in sys.modules if m.startswith("_h5etl_user_bad_")]


def test_an_installed_module_importing_what_is_missing_names_it(
    tmp_path: Path, installed: tuple[str, Path]
) -> None:
    name, path = installed
    path.write_text("import no_such_library_here\n")
    with pytest.raises(CallError, match=r"importing .* failed: ModuleNotFoundError: .*no_such"):
        Loader(None).resolve(f"{name}.prep:double")
