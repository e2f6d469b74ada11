"""Reading a config: YAML in, recipe defaults merged, paths resolved, a ``Spec`` out.

``load_spec(path)`` is the only function that reads a config file. Every problem becomes a
``ConfigError`` whose lines name the file, the dotted key and what was expected (the wording
of pydantic's errors is ``h5etl.config.messages``'s job).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from h5etl.config import places, resources
from h5etl.config.fields import TableRef, inferred_kind
from h5etl.config.messages import Found, Origin, find_typos, from_validation, shown_problems
from h5etl.config.spec import Spec
from h5etl.errors import ConfigError
from h5etl.format import yaml_load
from h5etl.remote.errors import RemoteUsageError
from h5etl.remote.location import is_url, parse_location

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
_MERGED_KEYS = frozenset({"storage", "pad", "decode"})


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
    a colour-coded mask's table): it becomes a tuple; and a key written twice is an error."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, list):
            key = tuple(key)
        if key in out:  # PyYAML would keep the last one without a word
            raise yaml.constructor.ConstructorError(
                None, None, f"found duplicate key {key!r}", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


# the same with libyaml's parser, where yaml_load says it is safe (a small build parsed its
# config and recipe in a fifth of its time with PyYAML's own)
_FastLoader: type[Any] | None = (
    type("_FastLoader", (yaml_load.C_SAFE_LOADER,), {}) if yaml_load.C_SAFE_LOADER else None
)
for _loader in (_Loader, _FastLoader):
    if _loader is not None:
        _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{what} not found", path=path) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what}: {exc}", path=path) from exc
    try:
        if _FastLoader is not None and yaml_load.c_parser_is_safe(text):
            data = yaml.load(text, Loader=_FastLoader)  # safe loaders: they build no objects
        else:
            data = yaml.load(text, Loader=_Loader)
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
        if "/" in pipeline or pipeline.endswith((".yaml", ".yml")):  # a path, not a name
            raise ConfigError(
                f"no recipe file {config_path.parent / pipeline}; known recipes: {known}",
                path=config_path,
                key="pipeline",
            )
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
    origin = field.get("from")
    if isinstance(origin, Mapping):  # a table (always there) or a JSON sidecar source
        return "json" not in origin or origin["json"] in sources
    derive = field.get("derive")
    if isinstance(derive, Mapping):  # computed from a field: kept when that one's source is
        named = derive.get("from")
        return all(n in sources for n in ([named] if isinstance(named, str) else named or []))
    kind = field.get("kind") or inferred_kind(field)
    if source is None and kind in {"text", "label"}:
        return True  # it names the first source's files, whatever that source is called
    return (name if source is None else source) in sources


def _resolve_paths(
    data: dict[str, Any], base: Path
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Paths made absolute against the config's folder, and the relative ones as written."""
    resolved = dict(data)
    written: dict[tuple[str, ...], str] = {}

    def absolute(key: tuple[str, ...], text: str) -> str:
        if is_url(text):  # on object storage: as written (the spec checks it)
            return text
        if not Path(text).is_absolute():
            written[key] = Path(text).as_posix()  # "./raw/images/" is stored as raw/images
        return str(base / text)

    if isinstance(resolved.get("output"), str) and not is_url(resolved["output"]):
        resolved["output"] = absolute(("output",), resolved["output"])
    sources = resolved.get("sources")
    if isinstance(sources, dict):
        resolved["sources"] = {
            name: {**src, "dir": absolute(("sources", str(name), "dir"), src["dir"])}
            if isinstance(src, dict) and isinstance(src.get("dir"), str)
            else src
            for name, src in sources.items()
        }
    fields = resolved.get("fields")
    if isinstance(fields, dict):
        resolved["fields"] = {
            name: _with_table_path(field, ("fields", str(name), "from", "table"), absolute)
            for name, field in fields.items()
        }
    return resolved, written


def _with_table_path(
    field: Any, key: tuple[str, ...], absolute: Callable[[tuple[str, ...], str], str]
) -> Any:
    """A field whose ``from.table`` names a sidecar table, with that path resolved."""
    if not isinstance(field, dict):
        return field
    origin = field.get("from")
    if not isinstance(origin, dict) or not isinstance(origin.get("table"), str):
        return field
    return {**field, "from": {**origin, "table": absolute(key, origin["table"])}}


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


def parse_spec(data: Mapping[str, Any], *, config_path: Path, check_paths: bool = True) -> Spec:
    """Validate an already-parsed config mapping, as ``load_spec`` does after reading YAML;
    ``check_paths=False``: its folders and tables need not exist yet (an example's, before
    ``demo`` writes them).

    Raises:
        ConfigError: one line per problem, naming the file and the dotted key.
    """
    config_path = config_path.absolute()
    recipe_path, recipe = _recipe_defaults(data.get("pipeline", "segmentation"), config_path)
    origin = Origin(config_path, data, recipe_path, recipe)
    merged = _apply_recipe(_fields_for_sources(recipe, data), data)
    merged.setdefault("output", DEFAULT_OUTPUT)  # the config's folder's, not the current one's
    resolved, written = _resolve_paths(merged, config_path.parent)
    try:
        spec = Spec.model_validate(resolved)
    except ValidationError as exc:
        shown = shown_problems(origin, find_typos(data, merged), from_validation(exc, merged))
        problems = [origin.line(f) for f in shown]
        raise ConfigError(problems[0], problems=problems, topic=_topic(shown)) from exc
    spec = spec.located(
        config_dir=config_path.parent,
        config_file=config_path if config_path.is_file() else None,
        written_paths=written,
        inferred_kinds=inferred_kinds(merged),
    )
    remote_tables = [
        origin.line(
            Found(
                (("fields", name, "from", "table"),),
                "a table on object storage is not supported yet: copy it to a local file",
            )
        )
        for name, table in _written_tables(merged)
        if is_url(table)
    ]
    if remote_tables:
        raise ConfigError(remote_tables[0], problems=remote_tables, topic="fields")
    if not check_paths:
        return spec
    buckets: set[str] = set()  # a bucket's problem once: the sources in it share it
    dirs = [
        origin.line(Found((("sources", name, "dir"),), problem))
        for name, src in spec.sources.items()
        if (problem := _folder_problem(src.dir, buckets)) is not None
    ]
    missing = dirs + [
        origin.line(Found((("fields", name, "from", "table"),), f"no such file: {table}"))
        for name, table in _tables(spec)
        if not table.is_file()
    ]
    if missing:
        raise ConfigError(missing[0], problems=missing, topic="sources" if dirs else "fields")
    return spec


def _folder_problem(folder: Path | str, buckets: set[str]) -> str | None:
    """What is wrong with a source's ``dir``: a local folder that does not exist; a URL whose
    bucket is missing, whose credentials are refused or whose backend is not installed (one
    request, as a local folder is one stat; none for a bucket ``buckets`` holds: asked)."""
    if isinstance(folder, Path):
        return None if folder.is_dir() else f"folder does not exist: {folder}"
    location = parse_location(folder)
    bucket = f"{location.protocol}://{location.bucket}"
    if bucket in buckets:
        return None
    buckets.add(bucket)
    from h5etl.remote.objects import reachable  # a config with a URL source only

    try:
        reachable(location)
    except RemoteUsageError as exc:
        return f"{folder}: {exc.message}"
    return None


def _topic(shown: list[Found]) -> str:
    """The config key whose reference section explains the first problem: its top-level
    key (a misplaced key's: where it belongs), or the list of every key (an unknown
    top-level key)."""
    key = shown[0].keys[0] if shown and shown[0].keys else ()
    top = str(key[0]) if key else ""
    home = places.home(str(key[-1]), key[:-1]) if key else None
    if home is not None and shown[0].kind == "unknown_key":  # misplaced: where it belongs
        return home
    if top in Spec.model_fields and not (len(key) == 1 and shown[0].kind == "unknown_key"):
        return top
    return "top-level"


def _written_tables(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The sidecar tables a config's fields name, as written, by field."""
    fields = data.get("fields")
    if not isinstance(fields, Mapping):
        return []
    return [
        (str(name), field["from"]["table"])
        for name, field in fields.items()
        if isinstance(field, Mapping)
        and isinstance(field.get("from"), Mapping)
        and isinstance(field["from"].get("table"), str)
    ]


def _tables(spec: Spec) -> list[tuple[str, Path]]:
    """The sidecar tables the fields read, by field."""
    found = []
    for name, field in spec.fields.items():
        table = getattr(getattr(field, "from_", None), "table", None)
        if isinstance(table, Path):
            found.append((name, table))
    return found


def check_tables(spec: Spec) -> None:
    """Read every sidecar table the fields name, as a build will (``h5etl validate``).

    Raises:
        ConfigError: a table is broken (a key twice, a column missing, not UTF-8...), one line
            naming the table, the line and the field.
    """
    from h5etl.inputs import tables  # reads files: only validate and builds need it

    for name, path in _tables(spec):
        origin = getattr(spec.fields[name], "from_", None)
        assert isinstance(origin, TableRef)
        try:
            tables.load_table(path, key=origin.key, columns=[origin.column])
        except ConfigError as exc:
            raise ConfigError(
                f"{exc.message} (fields.{name}.from.table)", path=exc.path, topic="fields"
            ) from exc


def load_spec(path: Path | str, *, check_paths: bool = True) -> Spec:
    """Read, merge and validate a build config.

    Parameters:
        path: the config YAML; relative paths inside it are resolved against its folder.
        check_paths: False: its source folders and tables need not exist (yet).

    Returns:
        The frozen ``Spec``.

    Raises:
        ConfigError: the file is missing, not YAML, or breaks a rule (exit code 2).
    """
    config_path = Path(path).absolute()
    data = _read_yaml_mapping(config_path, "config")
    return parse_spec(data, config_path=config_path, check_paths=check_paths)
