"""The examples ``h5etl demo --example NAME`` builds: each a config in ``configs/`` and a maker
of its raw folder (synthetic, deterministic, tiny, a few inputs broken on purpose)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Broken:
    """An input broken on purpose: the reject ``reason`` the build must give it, and why."""

    reason: str
    why: str


class Maker(Protocol):
    """Writes an example's raw folder; returns its broken inputs by path relative to it."""

    def __call__(self, raw: Path, *, samples: int = ..., seed: int = ...) -> dict[str, Broken]: ...


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    summary: str  # one line: what it shows
    config: str  # its config's file name in configs/
    make: Maker


EXAMPLES: dict[str, Example] = {}


def register(name: str, *, config: str, summary: str) -> Callable[[Maker], Maker]:
    """Register a maker under ``name``; its config is ``configs/<config>``."""

    def add(make: Maker) -> Maker:
        if name in EXAMPLES:
            raise ValueError(f"example {name!r} is registered twice")
        EXAMPLES[name] = Example(name, summary, config, make)
        return make

    return add
