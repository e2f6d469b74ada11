"""Where each config key belongs, and the config's words for pydantic's.

The keys of every section are read from the config models, so a key added to a model is
known here at once: a key written in the wrong section is told where it belongs
(``belongs``), and messages never show a model's class name (``plain_words``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from h5etl.config.fields import FIELD_MODELS
from h5etl.config.sections import Compression, DecodeSpec, GroupBy, PadSpec, SourceSpec, StorageSpec
from h5etl.config.spec import Spec

Key = tuple[str | int, ...]


def keys_of(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


FIELD_KEYS = sorted({k for m in FIELD_MODELS.values() for k in keys_of(m)})

# The keys of the mapping at each key path (None: any name), and how a message says where
# that mapping is: for "did you mean", and for "belongs under" when a key is in the wrong one.
SECTIONS: list[tuple[tuple[str | None, ...], list[str], str]] = [
    ((), [k for k in keys_of(Spec) if k != "group_by"], "at the top level"),
    (("storage",), keys_of(StorageSpec), "under storage:"),
    (("pad",), keys_of(PadSpec), "under pad:"),
    (("decode",), keys_of(DecodeSpec), "under decode:"),
    (("splits",), ["group_by"], "under splits:"),
    (("splits", "group_by"), keys_of(GroupBy), "under splits.group_by:"),
    (("sources", None), keys_of(SourceSpec), "under a source, sources.<name>:"),
    (("fields", None), FIELD_KEYS, "under a field, fields.<name>:"),
    (("storage", "compression"), keys_of(Compression), "under storage.compression:"),
    (("fields", None, "compression"), keys_of(Compression), "under fields.<name>.compression:"),
]
# Mappings of user-named entries: what one entry is called, and an example of the map.
NAMED = {
    "sources": ("source", "sources: {images: {dir: raw/images, glob: '*.png'}}"),
    "fields": ("field", "fields: {image: {shape: [3, 224, 224]}}"),
    "splits": ("split", "splits: {train: 0.8, valid: 0.2}"),
}


def matches(pattern: tuple[str | None, ...], parent: Key) -> bool:
    return len(pattern) == len(parent) and all(
        want is None or want == part for want, part in zip(pattern, parent, strict=True)
    )


def belongs(name: str, parent: Key) -> str | None:
    """Where a key that ``parent``'s mapping does not take belongs, if any other does:
    ``"compression belongs under storage: (or under a field, fields.<name>:)"``."""
    places = [
        _where(pattern, where, name)
        for pattern, keys, where in SECTIONS
        if name in keys and not matches(pattern, parent)
    ]
    if not places:
        return None
    more = f" (or {', '.join(places[1:3])})" if len(places) > 1 else ""
    return f"{name} belongs {places[0]}{more}"


def home(name: str, parent: Key) -> str | None:
    """The top-level key whose docs section explains where a misplaced ``name`` belongs
    (``pad`` for a top-level ``fill``; ``stratify`` for itself), or None if nowhere else
    (a key of another kind of field is explained with the fields)."""
    if any(name in keys and matches(pattern, parent) for pattern, keys, _ in SECTIONS):
        return None
    for pattern, keys, _ in SECTIONS:
        if name in keys and not matches(pattern, parent):
            return str(pattern[0]) if pattern else name
    return None


def _where(pattern: tuple[str | None, ...], where: str, name: str) -> str:
    """Where a section is, for ``name``: a field's key that only some kinds take names them
    (``fill`` belongs under a volume field, not any field)."""
    if pattern != ("fields", None):
        return where
    kinds = [kind for kind, model in FIELD_MODELS.items() if name in keys_of(model)]
    if len(kinds) == len(FIELD_MODELS):
        return where
    return f"under {article(kinds[0])} {' or '.join(kinds)} field, fields.<name>:"


def article(word: str) -> str:
    return "an" if word[:1] in set("aeiou") else "a"


@functools.cache
def _model_names() -> frozenset[str]:
    """The names of every config model class: internal words no message may show."""
    names, todo = set(), [BaseModel]
    while todo:
        for model in todo.pop().__subclasses__():
            todo.append(model)
            if model.__module__.startswith("h5etl."):
                names.add(model.__name__)
    return frozenset(names)


_INSTANCE_OF = re.compile(
    r"(a valid dictionary or )?(object to extract fields from|instance of \w+)"
)


def plain_words(message: str) -> str:
    """A pydantic message in the config's words: no model class names (``instance of
    SourceSpec`` is "a mapping of keys to values")."""
    message = _INSTANCE_OF.sub("a mapping of keys to values", message)
    for name in _model_names():
        message = re.sub(rf"\b{name}\b", "a mapping", message) if name in message else message
    return message


def _entry_like(section: str, value: Any) -> bool:
    """Whether ``value`` can be one entry of a named map: a mapping, a split's fraction."""
    if section == "splits":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, Mapping)


def _odd_entries(section: str, named: Mapping[Any, Any]) -> list[str]:
    """The names in a map of named entries that are no entries: values no entry takes, and
    in splits a key of another section whose number the fractions do without (``seed: 3``)."""
    odd = [
        key
        for key, value in named.items()
        if isinstance(key, str) and key != "group_by" and not _entry_like(section, value)
    ]
    if section == "splits":
        fractions = {k: v for k, v in named.items() if k not in odd and k != "group_by"}
        for key in fractions:
            rest = [v for k, v in fractions.items() if k != key]
            known = isinstance(key, str) and belongs(key, ("splits", "")) is not None
            if known and rest and abs(math.fsum(rest) - 1) < 1e-6:
                odd.append(key)
    return odd


def misplaced_entries(data: Mapping[str, Any]) -> list[tuple[tuple[Key, ...], str]]:
    """Keys of a map of named entries (sources, fields, splits) that are no entry's name but
    a key written at the wrong level: an entry's own keys (``sources: {dir: x}``), or a key
    of another section (``splits: {..., stratify: label}``). One line per map, or per key."""
    found: list[tuple[tuple[Key, ...], str]] = []
    for section, (entry, example) in NAMED.items():
        named = data.get(section)
        if not isinstance(named, Mapping):
            continue
        odd = _odd_entries(section, named)
        own_keys = (
            next(keys for pattern, keys, _ in SECTIONS if pattern == (section, None))
            if section != "splits"
            else []
        )
        own = [key for key in odd if key in own_keys]
        if own:
            message = (
                f"{section} maps each {entry}'s name to its keys ({example}); "
                f"{', '.join(own)} {'is a key' if len(own) == 1 else 'are keys'} of one {entry}"
            )
            found.append((tuple((section, key) for key in own), message))
        for key in odd:
            place = belongs(key, (section, ""))
            if key not in own and place is not None:
                message = f"{key} is no {entry}: {place}, not under {section}:"
                found.append((((section, key),), message))
    return found


def stray_entry(name: str, value: Any) -> str | None:
    """A top-level key whose mapping holds only a source's or a field's keys: an entry
    written outside its map (``image: {shape: [3, 224, 224]}`` beside ``fields:``)."""
    if not isinstance(value, Mapping) or not value:
        return None
    for section in ("sources", "fields"):
        keys = next(keys for pattern, keys, _ in SECTIONS if pattern == (section, None))
        if all(key in keys for key in value):
            entry = NAMED[section][0]
            return f"a {entry} belongs under {section}: ({section}: {{{name}: {{...}}}})"
    return None
