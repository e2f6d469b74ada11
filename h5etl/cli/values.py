"""Command-line values that need no pydantic: an option not given, a string, a path.

Newer typer (0.2x) coerces every parameter's value through a pydantic ``TypeAdapter`` that it
builds on first use, even the ``None`` of a ``--help`` flag that was not given: importing
pydantic and building the adapter cost about 60 ms (three times typer's own import) in
``h5etl build --help`` and in every command over releases, which need no pydantic. For those
values (and for a plain number within its bounds, a list of paths) ``PlainValues`` does what
typer's adapter does, with typer's own functions (the path checks and their messages
included); any other value, and every value typer refuses, still goes through typer's
adapter, built when first needed, so its messages are typer's.

Imported only where typer has this machinery (``h5etl.cli.usage`` guards the import).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer._coercion import RuntimeParam, build_runtime_param
from typer._param_types import coerce_cli_path

__all__ = ["install"]


@dataclass(frozen=True)
class PlainValues(RuntimeParam):
    """Typer's coercion of one parameter; ``None`` is answered by ``RuntimeParam.coerce``."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        info = self.parameter_info
        plain = info.parser is None and info.path_type is None
        single = not (param.multiple or param.nargs == -1)
        if plain and single and isinstance(value, str):
            if self.annotation is str:
                return value  # typer's adapter: ``str(value)``
            if self.annotation is Path:
                # typer's adapter makes the Path (with pydantic), then checks it
                return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
            if self.annotation is int and _plain_int(value, info):
                return int(value)
        if plain and self.annotation is int and type(value) is int and _within(value, info):
            return value  # a default (``--jobs``: the number of cores)
        if plain and self.annotation == list[Path] and _strings(value):
            # each CONFIG of ``build``, as typer's list adapter checks them: in a list
            return [
                coerce_cli_path(Path(item), info, path_type=Path, param=param, ctx=ctx)
                for item in value
            ]
        # anything else, and any value typer would refuse (with its own message)
        descriptor = param.type_descriptor
        return build_runtime_param(descriptor).coerce(value, param=param, ctx=ctx)


def _plain_int(value: str, info: Any) -> bool:
    """Whether ``value`` is decimal digits within the option's bounds (``min=1``), so that
    ``int(value)`` is what typer's adapter returns; a clamped option is typer's."""
    return value.isascii() and value.isdigit() and _within(int(value), info)


def _within(number: int, info: Any) -> bool:
    low, high = info.min, info.max
    inside = (low is None or number >= low) and (high is None or number <= high)
    return inside and not info.clamp


def _strings(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)


def install(param: Any) -> None:
    """Give ``param`` (a typer parameter) ``PlainValues`` if typer has not coerced it yet."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", True) is not None:
        return
    param._runtime_param = PlainValues(
        parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
    )
