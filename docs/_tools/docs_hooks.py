"""MkDocs hooks: the reference pages' tables, generated from the code at every build.

A page asks for a table with a marker line, ``<!-- generated: NAME -->``; ``on_page_markdown``
puts the table there. So the config keys (from the pydantic models), the CLI (from the typer
app) and the reject reasons (from ``h5etl.inputs.reasons.TABLE``) cannot drift from the code, and
the page's source file still exists for a reader who follows an error message to it.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with that table."""
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


# --- config keys -------------------------------------------------------------------------


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment at the end of each field's line in the model's source: the why of a key."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.end_lineno - 1] if node.end_lineno else ""
            if "  # " in line:
                found[node.target.id] = line.split("  # ", 1)[1].strip()
    return found


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_text(a) for a in args)}]"
    if annotation is Ellipsis:
        return "..."
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default_text(info: Any) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        return f"`{info.default_factory()!r}`"
    if info.default is PydanticUndefined:
        return ""
    value = info.default
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, PurePath):
        return f"`{value}`"
    return f"`{value!r}`" if value is not None else "`null`"


def model_table(
    model: type[BaseModel], prefix: str, seen: set[type[BaseModel]], *, heading: bool = True
) -> list[str]:
    """A table of the model's keys, then one of each nested model's, depth first."""
    comments = _comments(model)
    doc = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    out = [f"#### `{prefix}` {{#{_anchor(prefix)}}}", ""] if prefix and heading else []
    out += [doc, ""] if prefix else []
    out += ["| key | type | default | notes |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        notes = comments.get(name, "").replace("|", "\\|")
        out.append(f"| `{key}` | {_type_text(info.annotation)} | {_default_text(info)} | {notes} |")
        nested += [(f"{prefix}.{key}" if prefix else key, m) for m in _models_in(info.annotation)]
    out.append("")
    for path, sub in nested:
        if sub not in seen:
            seen.add(sub)
            out += model_table(sub, path, seen)
    return out


def _anchor(key: str) -> str:
    return key.replace(".", "-").replace("<", "").replace(">", "").replace(" ", "")


def config_keys() -> str:
    """Every key of a build config, from ``Spec`` and the field kinds' models."""
    from h5etl.config.fields import FIELD_MODELS
    from h5etl.config.spec import Spec

    seen: set[type[BaseModel]] = set(FIELD_MODELS.values())
    out = ["### Top level {#top-level}", "", *model_table(Spec, "", seen)]
    out += ["### Field kinds {#field-kinds}", ""]
    out += [
        "Each entry of `fields:` is one of these models, picked by its `kind:` "
        "(a field without `kind:` is a text when `dtype: str`, a mask when it has `values`, "
        "else an image).",
        "",
    ]
    for kind, model in FIELD_MODELS.items():
        out += [f"### kind: {kind} {{#kind-{kind}}}", ""]
        out += model_table(model, f"fields.<{kind}>", seen, heading=False)
    return "\n".join(out)


# --- CLI -----------------------------------------------------------------------------------


def cli_commands() -> str:
    """Every command and option of ``h5etl``, from the typer app."""
    import typer

    from h5etl.cli.app import app

    group: Any = typer.main.get_command(app)  # typer's own click: duck-typed
    context = type(group.context_class(group)) if hasattr(group, "context_class") else None
    assert context is not None
    ctx = context(group, info_name="h5etl")
    out: list[str] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        sub = context(command, info_name=name, parent=ctx)
        usage = " ".join(command.collect_usage_pieces(sub))
        out += [f"## h5etl {name} {{#{name}}}", "", f"`h5etl {name} {usage}`", ""]
        out += [inspect.cleandoc(command.help or ""), ""]
        out += ["| argument or option | what it does | default |", "|---|---|---|"]
        for param in command.params:
            record = param.get_help_record(sub)
            if param.param_type_name == "argument":
                names = param.metavar or str(param.name).upper()
                text = getattr(param, "help", None) or ""
            elif record is None:
                continue
            else:
                names, text = record
            # a default the help already words ("default: all cores") is this machine's
            said = "default" in text.lower()
            default = "" if said or param.default in (None, False, ()) else param.default
            text = re.sub(r"\s*\[[^\]]*\]$", "", text).replace("|", "\\|")
            out.append(f"| `{names}` | {text} | {f'`{default}`' if default != '' else ''} |")
        out.append("")
    return "\n".join(out)


# --- reject reasons ------------------------------------------------------------------------


def reasons_table() -> str:
    """The file-per-sample reject reasons, in the order a sample's first defect is named."""
    from h5etl.inputs.reasons import TABLE

    out = ["| reason | the defect | found first by |", "|---|---|---|"]
    out += [f"| [`{r.code}`](#{r.code}) | {r.defect} | {r.found_by} |" for r in TABLE]
    return "\n".join(out)


# --- exit codes ----------------------------------------------------------------------------


def exit_codes() -> str:
    """Each error h5etl raises on purpose, with the exit code the CLI gives it."""
    from h5etl import errors

    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.H5EtlError)
    ]
    out = ["| error | exit code | what it means |", "|---|---|---|"]
    for cls in classes:
        doc = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        out.append(f"| `{cls.__name__}` | {cls.exit_code} | {doc} |")
    return "\n".join(out)


def format_version() -> str:
    """The layout record's format version, as readers check it."""
    from h5etl.format import contract as fileformat

    return (
        f"This page specifies **format {fileformat.FORMAT}** of the layout record "
        "(`h5etl.format.contract.FORMAT`, stored in the root attribute "
        f"`{fileformat.LAYOUT_ATTR}`). "
        "A reader refuses a record newer than it knows; releases of older h5etl versions carry "
        "no record and are read by inferring one from their groups and stored config."
    )


GENERATORS: dict[str, Callable[[], str]] = {
    "format-version": format_version,
    "exit-codes": exit_codes,
    "config-keys": config_keys,
    "cli-commands": cli_commands,
    "reasons-table": reasons_table,
}
