"""How ``h5etl`` shows its usage: one-line usage errors with exit code 2, plain help.

Typer draws usage errors and help in rich boxes, shows ``<bool>`` after flags that take no
value and writes required arguments as ``{config}``; ``OneLineGroup`` (the app's group class)
turns each usage error into ``h5etl: error: ...`` and names every argument in upper case.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = ["OneLineGroup"]


def _click_class(name: str) -> type[Exception]:
    """A click exception class typer raises but does not export (from its own copy of click
    in newer typer, from click in older ones): found among ``typer.BadParameter``'s bases."""
    return next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == name)


_ClickException = _click_class("ClickException")


def _usage_line(exc: Exception) -> str:
    """Click's usage error (a boxed or three-line message) as one line."""
    message = " ".join(str(getattr(exc, "format_message", exc.__str__)()).split())
    message = message[:1].lower() + message[1:].rstrip(".")
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None)
    return f"{message} (see '{command} --help')" if command else message


def _no_type(ctx: Any = None) -> str:
    return ""


def _plain_values(params: Sequence[Any]) -> None:
    """Values that need no pydantic are coerced without it (``h5etl.cli.values``)."""
    try:
        from h5etl.cli import values
    except ImportError:  # an older typer: no pydantic in its coercion anyway
        return
    for param in params:
        values.install(param)


class _PlainUsage(TyperCommand):
    """Usage lines name arguments as ``CONFIG``, not typer's ``{CONFIG}``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # ``{CONFIG}`` and, for an argument taking several, ``{CONFIG}...``
        pieces = super().collect_usage_pieces(ctx)
        return [re.sub(r"^\{(.+)\}(\.\.\.)?$", r"\1\2", piece) for piece in pieces]

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        _plain_values([option])  # ``--help`` not given is a None typer would coerce
        return option


class OneLineGroup(TyperGroup):
    """Every usage error is one line, ``h5etl: error: ...``, and exit code 2; arguments show
    as upper-case names in help and usage alike."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for command in self.commands.values():
            for param in command.params:
                if param.param_type_name == "argument" and param.metavar is None:
                    param.metavar = (param.name or "").upper()
                if param.param_type_name == "argument":
                    # help showed ``CONFIG <path>``: the name says what it is, the type is noise
                    setattr(param, "display_type_rich", _no_type)  # noqa: B010
            if type(command) is TyperCommand:
                command.__class__ = _PlainUsage  # the same command, with plain usage pieces
            _plain_values(command.params)
        _plain_values(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        _plain_values([option])
        return option

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except _ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                typer.echo(ctx.get_help())  # plain ``h5etl``: the help, as before
            else:
                typer.echo(f"h5etl: error: {_usage_line(exc)}", err=True)
            code = int(getattr(exc, "exit_code", 2))
        except typer.Abort:
            typer.echo("h5etl: error: aborted", err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code)
