"""Pydantic's validation errors of a config, translated into one-line ``ConfigError`` messages.

Each line names the file that wrote the offending key (the config, or the recipe whose default
filled it in), the dotted key and what to do: "did you mean" for typos, a field kind's own keys.
Typos come first; what they likely caused is left out. Reads no file and builds no ``Spec``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from h5etl.config.fields import FIELD_MODELS, JsonRef, TableRef, inferred_kind
from h5etl.config.fields.registry import GROUP, REGISTRY
from h5etl.config.places import (
    SECTIONS,
    article,
    belongs,
    keys_of,
    matches,
    misplaced_entries,
    plain_words,
    stray_entry,
)
from h5etl.config.rules import source_for, unknown_source
from h5etl.config.sections import SpecProblems
from h5etl.config.spec import Spec

__all__ = [
    "Found",
    "Key",
    "Origin",
    "find_typos",
    "from_validation",
    "shown_problems",
]


Key = tuple[str | int, ...]
Kind = Literal["unknown_key", "unknown_source", "other"]


@dataclass(frozen=True, slots=True)
class Found:
    """One problem: the keys it blames, its message, and whether it is a likely typo."""

    keys: tuple[Key, ...]
    message: str
    kind: Kind = "other"


def _unknown_key(key: Key) -> str:
    parent, name = key[:-1], str(key[-1])
    place = belongs(name, parent)
    if place is not None:
        here = next((where for pattern, _, where in SECTIONS if matches(pattern, parent)), "")
        return f"{place}, not {here}" if here else place
    for pattern, keys, _ in SECTIONS:
        if matches(pattern, parent):
            close = difflib.get_close_matches(name, keys, n=1)
            if close:
                return f"unknown key; did you mean {close[0]!r}?"
    return "unknown key (check the spelling against the config reference)"


def _unknown_field_key(kind: str, name: str, *, inferred: bool = False) -> str:
    """An unknown key of a field: its kind's own keys, and which kind takes it if another."""
    keys = keys_of(FIELD_MODELS[kind])
    a = article(kind)
    # a key of another kind is a key the user meant: say so before guessing a typo
    others = [k for k, model in FIELD_MODELS.items() if name in keys_of(model)]
    if others and inferred and kind == "image":  # no kind and no clue: the old default guess
        return (
            f"{name} is a key of {' and '.join(others)} fields, but this field has no kind: and "
            f"is read as {kind} (as before kinds existed); add kind: {others[0]}"
        )
    if others:
        return (
            f"{a} {kind} field takes no {name} (that is a key of {' and '.join(others)} fields; "
            f"{a} {kind} field's keys: {', '.join(keys)})"
        )
    place = belongs(name, ("fields", ""))
    if place is not None:
        return f"{a} {kind} field takes no {name}: {place}"
    close = difflib.get_close_matches(name, keys, n=1)
    if close:
        return (
            f"unknown key; did you mean {close[0]!r}? ({a} {kind} field's keys: {', '.join(keys)})"
        )
    return f"unknown key ({a} {kind} field's keys: {', '.join(keys)})"


def find_typos(data: Mapping[str, Any], merged: Mapping[str, Any]) -> list[Found]:
    """Unknown top-level keys, keys at the wrong level and fields reading no source: the
    likely cause of the rest."""
    found = [
        Found(((key,),), stray_entry(key, data[key]) or _unknown_key((key,)), "unknown_key")
        for key in data
        if key not in Spec.model_fields
    ]
    misplaced = [Found(keys, message, "unknown_key") for keys, message in misplaced_entries(data)]
    found.extend(misplaced)
    sources, fields = merged.get("sources"), merged.get("fields")
    if any(f.keys[0][0] == "sources" for f in misplaced):
        return found  # the sources are not what the fields could read: that is the problem
    if not isinstance(sources, Mapping) or not sources or not isinstance(fields, Mapping):
        return found
    names = [str(name) for name in sources]
    for name, field in fields.items():
        source = field.get("source") if isinstance(field, Mapping) else None
        if not isinstance(name, str) or not isinstance(field, Mapping):
            continue
        if source is not None and not isinstance(source, str):
            continue
        kind = field.get("kind") or inferred_kind(field)
        if kind not in {"image", "mask", "text"} or isinstance(field.get("from"), Mapping):
            continue  # reads a table or a sidecar: the spec names the key
        if field.get("derive") is not None:
            continue
        read = source_for(
            name, source=source, reads_own_name=kind in {"image", "mask"}, sources=names
        )
        if read not in names:
            key: Key = ("fields", name) if source is None else ("fields", name, "source")
            message = unknown_source(read, names, implicit=source is None)
            found.append(Found((key,), message, "unknown_source"))
    return found


# What each member of a union of config values means, for one-line messages about it.
_MEMBER_WORDS = {
    "TableRef": "{table: <file>, key: <column>, column: <column>}",
    "JsonRef": "{json: <source>, key: <key>}",
    "float": "a number",
    "int": "an integer",
    "bool": "true or false",
    "constrained-int": "a count (an integer >= 0)",
    "constrained-float": "a fraction (0 <= f < 1)",
}
_MEMBER_MODELS: dict[str, type[BaseModel]] = {"TableRef": TableRef, "JsonRef": JsonRef}


def _member_at(loc: Key) -> int | None:
    """Where pydantic put a union member's name in ``loc`` (``TableRef``, ``literal['folder']``,
    ``float``), or None; user names (fields, sources, splits) are never taken for one."""
    first = 2 if loc and loc[0] in {"fields", "sources", "splits"} else 1
    for index in range(first, len(loc)):
        part = loc[index]
        if isinstance(part, str) and (
            part[:1].isupper()
            or part.startswith(("literal[", "constrained-"))
            or part in _MEMBER_WORDS
        ):
            return index
    return None


def _collapse_unions(errors: list[Any]) -> tuple[list[Any], list[Found]]:
    """The errors of a value that matched no member of its union, as what one member says:
    the member a mapping came closest to (fewest errors), or one line listing the choices for a
    scalar. Other errors pass through unchanged."""
    plain: list[Any] = []
    groups: dict[Key, list[tuple[Any, Key, Any]]] = {}
    for error in errors:
        loc = _without_kind_tag(tuple(p for p in error["loc"] if p != "function-after[...]"))
        at = _member_at(loc)
        if at is None:
            plain.append(error)
            continue
        groups.setdefault(loc[:at], []).append((loc[at], loc[at + 1 :], error))
    found = []
    for where, members in groups.items():
        value = next((e.get("input") for _, rest, e in members if not rest), None)
        if value is None:
            value = next((e.get("input") for _, rest, e in members if len(rest) == 1), None)
        models = [m for m, _, _ in members if m in _MEMBER_MODELS]
        if isinstance(value, Mapping) and models:
            best = min(dict.fromkeys(models), key=lambda m: sum(x == m for x, _, _ in members))
            found.extend(_member_problems(where, _MEMBER_MODELS[best], [
                (rest, error) for member, rest, error in members if member == best
            ]))  # fmt: skip
            continue
        choices = [
            m.removeprefix("literal[").removesuffix("]")
            if m.startswith("literal[")
            else _MEMBER_WORDS.get(m, m)
            for m in dict.fromkeys(m for m, _, _ in members)
        ]
        text = f"expected {' or '.join(choices)}, got {value!r}"
        literals = [c.strip("'") for c in choices if c.startswith("'")]
        close = difflib.get_close_matches(str(value), literals, n=1)
        found.append(Found((where,), f"{text}; did you mean {close[0]!r}?" if close else text))
    return plain, found


def _member_problems(
    where: Key, model: type[BaseModel], errors: list[tuple[Key, Any]]
) -> list[Found]:
    """A mapping's errors against the union member it came closest to; a misspelled key
    first, and not also the required key it misspells."""
    keys = keys_of(model)
    missing = {str(rest[-1]) for rest, e in errors if e["type"] == "missing" and rest}
    typos, others = [], []
    for rest, error in errors:
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(rest[-1]), keys, n=1)
            missing -= set(close)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            message = f"unknown key{hint} (its keys: {', '.join(keys)})"
            typos.append(Found(((*where, *rest),), message, "unknown_key"))
        elif error["type"] != "missing":
            message = error["msg"].removeprefix("Value error, ")
            others.append(Found(((*where, *rest),), message))
    others.extend(Found(((*where, key),), "required key is missing") for key in sorted(missing))
    return typos + others


def _inferred(merged: Mapping[str, Any] | None, field_name: Any) -> bool:
    fields = merged.get("fields") if merged is not None else None
    field = fields.get(field_name) if isinstance(fields, Mapping) else None
    return isinstance(field, Mapping) and field.get("kind") is None


def from_validation(exc: ValidationError, merged: Mapping[str, Any] | None = None) -> list[Found]:
    errors, found = _collapse_unions(list(exc.errors(include_url=False)))
    for error in errors:
        tagged = tuple(part for part in error["loc"] if part != "function-after[...]")
        loc = _without_kind_tag(tagged)
        if error["type"] == "unknown_kind":
            found.append(Found(((*loc, "kind"),), _unknown_kind(error.get("input"))))
            continue
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, SpecProblems):  # a model validator that names its own keys
            found.extend(
                Found(tuple((*loc, *key) for key in problem.keys), problem.message)
                for problem in cause.problems
            )
            continue
        message = error["msg"].removeprefix("Value error, ")
        kind: Kind = "other"
        if error["type"] == "extra_forbidden" and len(tagged) == 4 and tagged != loc:
            inferred = _inferred(merged, loc[1])
            message = _unknown_field_key(str(tagged[2]), str(loc[-1]), inferred=inferred)
            kind = "unknown_key"
        elif error["type"] == "extra_forbidden":
            message, kind = _unknown_key(loc), "unknown_key"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif "input" in error and error["type"] not in {"value_error", "assertion_error"}:
            message = f"{message}, got {error['input']!r}"
        found.append(Found((loc,), message, kind))
    return found


def _without_kind_tag(loc: Key) -> Key:
    """A field's location without the union tag pydantic puts after its name."""
    if len(loc) >= 3 and loc[0] == "fields" and loc[2] in FIELD_MODELS:
        return (*loc[:2], *loc[3:])
    return loc


def _unknown_kind(data: Any) -> str:
    kind = data.get("kind") if isinstance(data, Mapping) else data
    broken = REGISTRY.broken.get(kind) if isinstance(kind, str) else None
    if broken is not None:  # a plugin's kind that did not load: say which and why
        return broken
    known = list(FIELD_MODELS)
    text = f"kind must be one of {', '.join(known)}, got {kind!r}"
    close = difflib.get_close_matches(str(kind), known, n=1)
    if close:
        return f"{text}; did you mean {close[0]!r}?"
    # a config written where a plugin is installed, read where it is not
    return f"{text}; a kind from a plugin needs its package installed here (entry points {GROUP})"


def _depth(tree: Any, key: Key) -> int:
    """How many leading parts of ``key`` the mapping ``tree`` holds.

    A scalar on the way holds the rest too: ``compression: brotli`` is what became
    ``compression.codec``, so a problem there is that file's.
    """
    depth = 0
    for part in key:
        if isinstance(tree, Mapping) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and isinstance(part, int) and 0 <= part < len(tree):
            tree = tree[part]  # a list index in a pydantic location
        elif depth and tree is not None and not isinstance(tree, Mapping | list):
            return len(key)
        else:
            break
        depth += 1
    return depth


def _replaced(config: Any, recipe: Any, key: Key) -> bool:
    """Whether the config wrote a mapping where the recipe has a scalar on the way to ``key``
    (``from: {json: ...}`` over the recipe's ``from: folder``): the mapping is the config's."""
    for part in key:
        if not isinstance(config, Mapping) or part not in config:
            return False
        config = config[part]
        recipe = recipe.get(part) if isinstance(recipe, Mapping) else None
        if isinstance(config, Mapping) and recipe is not None and not isinstance(recipe, Mapping):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Origin:
    """Which file wrote a key: the config, or the recipe whose defaults filled it in."""

    config_path: Path
    config: Mapping[str, Any]
    recipe_path: Path
    recipe: Mapping[str, Any]

    def from_recipe(self, keys: Sequence[Key]) -> bool:
        """Whether the recipe wrote the offending value (and the config did not replace it)."""
        return all(
            _depth(self.recipe, key) == len(key) > _depth(self.config, key)
            and not _replaced(self.config, self.recipe, key)
            for key in keys
        )

    def written(self, keys: Sequence[Key]) -> bool:
        """Whether the config itself set one of these keys (not the recipe, not nobody)."""
        return any(0 < _depth(self.config, key) >= _depth(self.recipe, key) for key in keys)

    def line(self, found: Found) -> str:
        found = Found(found.keys, plain_words(found.message), found.kind)
        if self.from_recipe(found.keys):
            shown = ", ".join(".".join(map(str, ("defaults", *key))) for key in found.keys)
            return (
                f"{self.recipe_path}: {shown}: {found.message} (a recipe default, used by "
                f"{self.config_path})"
            )
        shown = ", ".join(".".join(map(str, key)) for key in found.keys if key)
        where = f"{self.config_path}: {shown}" if shown else str(self.config_path)
        return f"{where}: {found.message}{self._recipe_note(found.keys)}"

    def _recipe_note(self, keys: Sequence[Key]) -> str:
        """Where a key the config never wrote came from: ``fields.image`` of the recipe."""
        for key in keys:
            depth = _depth(self.recipe, key)
            if depth > _depth(self.config, key) and not _replaced(self.config, self.recipe, key):
                part = ".".join(map(str, key[:depth]))
                return f" ({part} comes from the recipe {self.recipe_path})"
        return ""


def shown_problems(origin: Origin, typos: list[Found], found: list[Found]) -> list[Found]:
    """Typos first; beside one, only what the config itself wrote (the rest is likely their
    side effect: ``feilds:`` leaves the recipe's fields without shapes)."""
    # a problem at or under a key a typo names is that typo's
    seen = {key for typo in typos for key in typo.keys}
    found = [
        f
        for f in found
        if not any(key[:n] in seen for key in f.keys for n in range(1, len(key) + 1))
    ]
    typos = typos + [f for f in found if f.kind != "other"]
    others = [f for f in found if f.kind == "other"]
    if typos:
        # a model with an unknown key: its complaints about itself are likely the typo's
        parents = {f.keys[0][:-1] for f in typos if f.kind == "unknown_key"}
        others = [f for f in others if origin.written(f.keys) and f.keys[0] not in parents]
    return typos + others
