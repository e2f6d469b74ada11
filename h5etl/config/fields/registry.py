"""The kind registry: every field kind h5etl knows, built in or from a plugin, by name.

A plugin is a distribution with an entry point of the group ``h5etl.kinds`` naming a
``KindEntry`` (``filesize = "h5etl_filesize.entry:ENTRY"``; the entry point's name is the
kind's). Plugins load when this module is imported (every command that reads a config), once
per process: a plugin installed later is seen by the next process. A config now runs
third-party code, so ``h5etl validate`` says which plugin each field's kind comes from.
A plugin that fails to load breaks only the configs naming its kind (``broken``: one line
naming the plugin and the error, exit 2); one named like a kind already known is set aside
(``ignored``), the known kind keeps its name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from h5etl.config.fields.base import FieldModel
from h5etl.config.fields.builtin import BUILTIN_ENTRIES
from h5etl.config.fields.entry import KindEntry

__all__ = ["GROUP", "REGISTRY", "Plugin", "Registry", "entry_of", "load_registry"]

GROUP = "h5etl.kinds"  # the entry-point group plugins register their kinds in

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plugin:
    """Where a kind that is not built in comes from."""

    distribution: str  # its name and version, as installed
    entry_point: str  # as declared: "filesize = h5etl_filesize.entry:ENTRY"

    def __str__(self) -> str:
        return f"plugin {self.distribution} (entry point {self.entry_point} in {GROUP})"


@dataclass(frozen=True, slots=True)
class Registry:
    """The kinds known here: entries by name (built in first), and what became of plugins."""

    entries: Mapping[str, KindEntry[Any]]
    plugins: Mapping[str, Plugin]  # kind -> the plugin it comes from (built-in kinds: none)
    broken: Mapping[str, str]  # kind -> why its plugin is unusable, one line
    ignored: tuple[str, ...] = ()  # plugins set aside (a name already known), one line each

    @property
    def models(self) -> dict[str, type[FieldModel]]:
        """Each kind's config model, by name."""
        return {name: entry.model for name, entry in self.entries.items()}

    def is_builtin(self, kind: str) -> bool:
        return kind in self.entries and kind not in self.plugins


def _plugin(point: metadata.EntryPoint) -> Plugin:
    dist = point.dist
    named = f"{dist.name} {dist.version}" if dist is not None else "(no distribution)"
    return Plugin(named, f"{point.name} = {point.value}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _loaded(point: metadata.EntryPoint, plugin: Plugin) -> KindEntry[Any] | str:
    """The plugin's entry, or why it is unusable (one line)."""
    try:
        found = point.load()
    except Exception as exc:  # a plugin's bug or missing dependency, reported when named
        return f"kind {point.name!r} comes from {plugin}, which failed to load: {_one_line(exc)}"
    if not isinstance(found, KindEntry):
        return (
            f"kind {point.name!r} comes from {plugin}, which names no "
            f"h5etl.kind_api.KindEntry but {type(found).__name__}"
        )
    if found.name != point.name:
        return (
            f"kind {point.name!r} comes from {plugin}, whose KindEntry is named {found.name!r}: "
            "the entry point's name must be the kind's"
        )
    return found


def load_registry(
    builtin: Iterable[KindEntry[Any]], points: Iterable[metadata.EntryPoint]
) -> Registry:
    """The built-in entries and every plugin's of ``points``, in a stable order."""
    entries = {entry.name: entry for entry in builtin}
    plugins: dict[str, Plugin] = {}
    broken: dict[str, str] = {}
    ignored: list[str] = []
    for point in sorted(points, key=lambda p: (p.name, p.value)):
        plugin = _plugin(point)
        if point.name in entries or point.name in broken:
            ignored.append(f"{plugin} is ignored: kind {point.name!r} is already known")
            continue
        found = _loaded(point, plugin)
        if isinstance(found, str):
            broken[point.name] = found
            logger.debug("%s", found)
            continue
        entries[point.name] = found
        plugins[point.name] = plugin
    for line in ignored:  # said by ``h5etl validate``: every command's stderr is no place
        logger.debug("%s", line)
    return Registry(entries, plugins, broken, tuple(ignored))


REGISTRY = load_registry(BUILTIN_ENTRIES, metadata.entry_points(group=GROUP))
"""The kinds of this installation (read once, at import)."""


def entry_of(kind: str) -> KindEntry[Any]:
    """The registry entry of ``kind`` (a kind a validated config names: always known)."""
    return REGISTRY.entries[kind]
