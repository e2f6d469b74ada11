"""The examples ``h5etl demo --example NAME`` builds.

Each is a shipped config (``configs/<name>.yaml``, naming a recipe in ``pipelines/``) and a
maker of its raw folder, registered by name in ``registry.EXAMPLES``: synthetic,
deterministic for its seed, tiny, with a few inputs broken on purpose; the maker returns
them (path relative to the raw folder -> the reject reason the build gives and why). The
default, ``cells``, is ``h5etl demo`` itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from h5etl.config import resources
from h5etl.errors import ConfigError, UsageError
from h5etl.examples import classify as classify
from h5etl.examples import demo
from h5etl.examples import medical as medical
from h5etl.examples import scenes as scenes
from h5etl.examples import sensors as sensors
from h5etl.examples import superres as superres
from h5etl.examples import volumes as volumes
from h5etl.examples.registry import EXAMPLES, Broken, Example, Maker, register

__all__ = [
    "DEFAULT",
    "EXAMPLES",
    "Broken",
    "Example",
    "Maker",
    "check_installed",
    "default_folder",
    "find",
    "names_line",
    "prepare",
]

DEFAULT = "cells"
_REASON = re.compile(r"\((\w+)\)$")


@register(DEFAULT, config="demo.yaml", summary="synthetic cell images with 0/255 masks")
def cells(raw: Path, *, samples: int = 40, seed: int = 7) -> dict[str, Broken]:
    """The demo's own raw folder (``demo.write_raw``), its broken inputs as ``Broken``."""
    found = demo.write_raw(raw, samples=samples, seed=seed)
    broken = {}
    for path, text in found.items():
        match = _REASON.search(text)
        assert match is not None, text
        broken[path] = Broken(match.group(1), text[: match.start()].strip())
    return broken


def names_line() -> str:
    """Every example in one line, the default first."""
    others = sorted(name for name in EXAMPLES if name != DEFAULT)
    return f"examples: {DEFAULT} (default), {', '.join(others)}"


def find(name: str) -> Example:
    """The example called ``name``.

    Raises:
        UsageError: there is none (exit code 2); the message lists them.
    """
    try:
        return EXAMPLES[name]
    except KeyError:
        raise UsageError(f"no example named {name!r}; {names_line()}") from None


def default_folder(name: str) -> Path:
    """Where ``h5etl demo`` puts an example without ``--dir``: ``h5etl-demo`` for the cells,
    ``h5etl-<name>`` for the others."""
    return Path("h5etl-demo" if name == DEFAULT else f"h5etl-{name}")


def check_installed(name: str) -> None:
    """The optional libraries example ``name``'s fields are read with (and its raw folder is
    written with) are installed: checked before ``prepare`` makes anything.

    Raises:
        ConfigError: one line naming the libraries and the extra (exit code 2).
    """
    from h5etl.config.load import load_spec
    from h5etl.plan.kind_registry import check_installed as installed

    shipped = resources.example_config(find(name).config)
    try:
        installed(load_spec(shipped, check_paths=False))
    except ConfigError as exc:  # the example by its name, not the shipped file's path
        raise ConfigError(f"example {name}: {exc.message}") from exc


def prepare(folder: Path, name: str = DEFAULT) -> Path:
    """Lay out example ``name`` in ``folder`` (as ``demo.prepare``) and return its config.

    Raises:
        UsageError: no such example, or ``folder`` is not a new, empty or previous one.
    """
    example = find(name)
    if name == DEFAULT:
        return demo.prepare(folder)
    return demo.lay_out(folder, resources.example_config(example.config), example.make)
