"""Reading a config: YAML in, recipe defaults merged, paths resolved, a ``Spec`` out.

``load_spec(path)`` is the only function that reads a config file. Every problem becomes a
``ConfigError`` whose lines name the file, the dotted key and what was expected.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from h5etl import resources
from h5etl.errors import ConfigError
from h5etl.fieldspecs import FIELD_MODELS, inferred_kind
from h5etl.spec import (
    Compression,
    PadSpec,
    SourceSpec,
    Spec,
    SpecProblems,
    StorageSpec,
    source_for,
    unknown_source,
)

__all__ = ["load_spec", "parse_spec"]

DEFAULT_OUTPUT = "releases"  # relative to the config file, like every path in it


def _deep_merge(defaults: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in override.items():
        base = merged.get(key)
        if isinstance(base, Mapping) and isinstance(value, Mapping):
            merged[key] = _deep_merge(base, value)
        else:
            merged[key] = value
    return merged


# Keys whose recipe defaults merge into the config's mapping; any other key the config sets
# replaces the recipe's value whole: a config's splits or sources never mix with the recipe's.
_MERGED_KEYS = frozenset({"storage", "pad"})


def _apply_recipe(defaults: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Recipe defaults under the config. The recipe's fields are added unless the config sets
    them to null; a field both name is merged key by key."""
    merged = {**defaults, **config}
    for key in _MERGED_KEYS:
        if isinstance(defaults.get(key), Mapping) and isinstance(config.get(key), Mapping):
            merged[key] = _deep_merge(defaults[key], config[key])
    field_defaults, fields = defaults.get("fields"), config.get("fields")
    if isinstance(field_defaults, Mapping) and isinstance(fields, Mapping):
        combined = _deep_merge(field_defaults, fields)
        merged["fields"] = {name: spec for name, spec in combined.items() if spec is not None}
    return merged


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, but a sequence may be a mapping key (``colors: {[128, 64, 128]: 7}``,
    a colour-coded mask's table): it becomes a tuple."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, list):
            key = tuple(key)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} not found", path=path) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what}: {exc}", path=path) from exc
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: builds no objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"not valid YAML{where}: {problem}", path=path) from exc
    except RecursionError as exc:
        raise ConfigError("YAML nested too deeply", path=path) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} must be a YAML mapping of keys to values, got {type(data).__name__}",
            path=path,
        )
    if not all(isinstance(key, str) for key in data):
        raise ConfigError("every top-level key must be a string", path=path)
    return data


def _recipe_defaults(pipeline: Any, config_path: Path) -> tuple[Path, dict[str, Any]]:
    if not isinstance(pipeline, str) or not pipeline:
        raise ConfigError(
            f"must name a recipe such as 'segmentation' or a path to one, got {pipeline!r}",
            path=config_path,
            key="pipeline",
        )
    recipe_path = resources.find_recipe(pipeline, relative_to=config_path.parent)
    if recipe_path is None:
        known = ", ".join(resources.recipe_names())
        raise ConfigError(
            f"no recipe named {pipeline!r}; known recipes: {known}",
            path=config_path,
            key="pipeline",
        )
    recipe = _read_yaml_mapping(recipe_path, "pipeline recipe")
    defaults = recipe.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError("defaults must be a mapping", path=recipe_path, key="defaults")
    return recipe_path, defaults


def _fields_for_sources(defaults: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """Drop recipe fields the config does not name and whose source it does not have.

    A config with its own field names (``img``, ``label``) would otherwise inherit the
    recipe's ``image`` and ``mask`` without a shape and fail on keys it never wrote.
    """
    fields, sources = defaults.get("fields"), data.get("sources")
    if not isinstance(fields, dict) or not isinstance(sources, dict):
        return defaults
    own = data.get("fields")
    named: Mapping[str, Any] = own if isinstance(own, dict) else {}
    kept = {
        name: field
        for name, field in fields.items()
        if name in named or _reads_one_of(name, field, sources)
    }
    return {**defaults, "fields": kept}


def _reads_one_of(name: str, field: Any, sources: Mapping[str, Any]) -> bool:
    if not isinstance(field, dict):
        return name in sources
    source = field.get("source")
    if source is None and field.get("dtype") == "str":
        return True  # a text field without a source reads the first source, whatever its name
    return (name if source is None else source) in sources


def _resolve_paths(
    data: dict[str, Any], base: Path
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Paths made absolute against the config's folder, and the relative ones as written."""
    resolved = dict(data)
    written: dict[tuple[str, ...], str] = {}

    def absolute(key: tuple[str, ...], text: str) -> str:
        if not Path(text).is_absolute():
            written[key] = Path(text).as_posix()  # "./raw/images/" is stored as raw/images
        return str(base / text)

    if isinstance(resolved.get("output"), str):
        resolved["output"] = absolute(("output",), resolved["output"])
    sources = resolved.get("sources")
    if isinstance(sources, dict):
        resolved["sources"] = {
            name: {**src, "dir": absolute(("sources", str(name), "dir"), src["dir"])}
            if isinstance(src, dict) and isinstance(src.get("dir"), str)
            else src
            for name, src in sources.items()
        }
    return resolved, written


Key = tuple[str | int, ...]
Kind = Literal["unknown_key", "unknown_source", "other"]


def _keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


# The keys of the mapping at each key path (None: any name), for "did you mean".
_MODELS: list[tuple[tuple[str | None, ...], list[str]]] = [
    ((), _keys(Spec)),
    (("storage",), _keys(StorageSpec)),
    (("pad",), _keys(PadSpec)),
    (("sources", None), _keys(SourceSpec)),
    (("fields", None), sorted({k for m in FIELD_MODELS.values() for k in _keys(m)})),
    (("storage", "compression"), _keys(Compression)),
    (("fields", None, "compression"), _keys(Compression)),
]


@dataclass(frozen=True, slots=True)
class _Found:
    keys: tuple[Key, ...]
    message: str
    kind: Kind = "other"


def _unknown_key(key: Key) -> str:
    parent, name = key[:-1], str(key[-1])
    for pattern, keys in _MODELS:
        if len(pattern) == len(parent) and all(
            want is None or want == part for want, part in zip(pattern, parent, strict=True)
        ):
            close = difflib.get_close_matches(name, keys, n=1)
            if close:
                return (
                    f"unknown key; did you mean {close[0]!r}? (the README's config reference "
                    f"lists every key)"
                )
    return "unknown key (check the spelling against the README's config reference)"


def _unknown_field_key(kind: str, name: str) -> str:
    """An unknown key of a field: its kind's own keys, and which kind takes it if another."""
    keys = _keys(FIELD_MODELS[kind])
    close = difflib.get_close_matches(name, keys, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}? (a {kind} field's keys: {', '.join(keys)})"
    others = [k for k, model in FIELD_MODELS.items() if name in _keys(model)]
    if others:
        return (
            f"a {kind} field takes no {name} (that is a key of {' and '.join(others)} fields; "
            f"a {kind} field's keys: {', '.join(keys)})"
        )
    return f"unknown key (a {kind} field's keys: {', '.join(keys)})"


def _typos(data: Mapping[str, Any], merged: Mapping[str, Any]) -> list[_Found]:
    """Unknown top-level keys and fields reading no source: the likely cause of the rest."""
    found = [
        _Found(((key,),), _unknown_key((key,)), "unknown_key")
        for key in data
        if key not in Spec.model_fields
    ]
    sources, fields = merged.get("sources"), merged.get("fields")
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
            found.append(_Found((key,), message, "unknown_source"))
    return found


def _from_validation(exc: ValidationError) -> list[_Found]:
    found: list[_Found] = []
    for error in exc.errors(include_url=False):
        tagged = tuple(part for part in error["loc"] if part != "function-after[...]")
        loc = _without_kind_tag(tagged)
        if error["type"] == "unknown_kind":
            found.append(_Found(((*loc, "kind"),), _unknown_kind(error.get("input"))))
            continue
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, SpecProblems):  # a model validator that names its own keys
            found.extend(
                _Found(tuple((*loc, *key) for key in problem.keys), problem.message)
                for problem in cause.problems
            )
            continue
        message = error["msg"].removeprefix("Value error, ")
        kind: Kind = "other"
        if error["type"] == "extra_forbidden" and len(tagged) == 4 and tagged != loc:
            message, kind = _unknown_field_key(str(tagged[2]), str(loc[-1])), "unknown_key"
        elif error["type"] == "extra_forbidden":
            message, kind = _unknown_key(loc), "unknown_key"
        elif error["type"] == "missing":
            message = "required key is missing"
        elif "input" in error and error["type"] not in {"value_error", "assertion_error"}:
            message = f"{message}, got {error['input']!r}"
        found.append(_Found((loc,), message, kind))
    return found


def _without_kind_tag(loc: Key) -> Key:
    """A field's location without the union tag pydantic puts after its name."""
    if len(loc) >= 3 and loc[0] == "fields" and loc[2] in FIELD_MODELS:
        return (*loc[:2], *loc[3:])
    return loc


def _unknown_kind(data: Any) -> str:
    kind = data.get("kind") if isinstance(data, Mapping) else data
    known = list(FIELD_MODELS)
    text = f"kind must be one of {', '.join(known)}, got {kind!r}"
    close = difflib.get_close_matches(str(kind), known, n=1)
    return f"{text}; did you mean {close[0]!r}?" if close else text


def inferred_kinds(data: Mapping[str, Any]) -> dict[str, str]:
    """The fields a config (merged with its recipe) leaves without ``kind:``, and the kind
    each gets, for ``h5etl validate`` to say."""
    fields = data.get("fields")
    if not isinstance(fields, Mapping):
        return {}
    return {
        str(name): inferred_kind(field)
        for name, field in fields.items()
        if isinstance(field, Mapping) and field.get("kind") is None
    }


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


@dataclass(frozen=True, slots=True)
class _Origin:
    """Which file wrote a key: the config, or the recipe whose defaults filled it in."""

    config_path: Path
    config: Mapping[str, Any]
    recipe_path: Path
    recipe: Mapping[str, Any]

    def from_recipe(self, keys: Sequence[Key]) -> bool:
        """Whether the recipe wrote the offending value (and the config did not replace it)."""
        return all(_depth(self.recipe, key) == len(key) > _depth(self.config, key) for key in keys)

    def written(self, keys: Sequence[Key]) -> bool:
        """Whether the config itself set one of these keys (not the recipe, not nobody)."""
        return any(0 < _depth(self.config, key) >= _depth(self.recipe, key) for key in keys)

    def line(self, found: _Found) -> str:
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
            if depth > _depth(self.config, key):
                part = ".".join(map(str, key[:depth]))
                return f" ({part} comes from the recipe {self.recipe_path})"
        return ""


def _problem_lines(origin: _Origin, typos: list[_Found], found: list[_Found]) -> list[str]:
    """Typos first; beside one, only what the config itself wrote (the rest is likely their
    side effect: ``feilds:`` leaves the recipe's fields without shapes)."""
    seen = {typo.keys for typo in typos}
    found = [f for f in found if f.keys not in seen]
    typos = typos + [f for f in found if f.kind != "other"]
    others = [f for f in found if f.kind == "other"]
    if typos:
        # a model with an unknown key: its complaints about itself are likely the typo's
        parents = {f.keys[0][:-1] for f in typos if f.kind == "unknown_key"}
        others = [f for f in others if origin.written(f.keys) and f.keys[0] not in parents]
    return [origin.line(f) for f in typos + others]


def parse_spec(data: Mapping[str, Any], *, config_path: Path) -> Spec:
    """Validate an already-parsed config mapping, as ``load_spec`` does after reading YAML.

    Raises:
        ConfigError: one line per problem, naming the file and the dotted key.
    """
    config_path = config_path.absolute()
    recipe_path, recipe = _recipe_defaults(data.get("pipeline", "segmentation"), config_path)
    origin = _Origin(config_path, data, recipe_path, recipe)
    merged = _apply_recipe(_fields_for_sources(recipe, data), data)
    merged.setdefault("output", DEFAULT_OUTPUT)  # the config's folder's, not the current one's
    resolved, written = _resolve_paths(merged, config_path.parent)
    try:
        spec = Spec.model_validate(resolved)
    except ValidationError as exc:
        problems = _problem_lines(origin, _typos(data, merged), _from_validation(exc))
        raise ConfigError(problems[0], problems=problems) from exc
    spec = spec.located(
        config_dir=config_path.parent,
        config_file=config_path if config_path.is_file() else None,
        written_paths=written,
        inferred_kinds=inferred_kinds(merged),
    )
    missing = [
        origin.line(_Found((("sources", name, "dir"),), f"folder does not exist: {src.dir}"))
        for name, src in spec.sources.items()
        if not src.dir.is_dir()
    ]
    if missing:
        raise ConfigError(missing[0], problems=missing)
    return spec


def load_spec(path: Path | str) -> Spec:
    """Read, merge and validate a build config.

    Parameters:
        path: the config YAML; relative paths inside it are resolved against its folder.

    Returns:
        The frozen ``Spec``.

    Raises:
        ConfigError: the file is missing, not YAML, or breaks a rule (exit code 2).
    """
    config_path = Path(path).absolute()
    return parse_spec(_read_yaml_mapping(config_path, "config"), config_path=config_path)
