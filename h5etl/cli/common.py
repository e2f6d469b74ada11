"""What every ``h5etl`` command module shares: the app, and the edge where errors become lines.

``cli.py`` holds the build-side commands, ``cli_releases.py`` the commands over published
releases (``releases``, ``rollback``, ``diff``, ``prune``); both register on ``app``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import typer

from h5etl.cli.usage import OneLineGroup
from h5etl.errors import H5EtlError
from h5etl.pipeline import interrupts

__all__ = ["app", "fail", "run", "say"]

app = typer.Typer(
    cls=OneLineGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no boxes, no <bool> after flags that take no value
    help="Turn folders of images and masks into versioned, checksummed HDF5 releases.",
)
T = TypeVar("T")


class Closable(Protocol):
    def close(self) -> None: ...


def say(text: str) -> None:
    typer.echo(text)


def fail(exc: H5EtlError) -> typer.Exit:
    for line in str(exc).splitlines():
        typer.echo(f"h5etl: error: {line}", err=True)
    return typer.Exit(exc.exit_code)


def run(action: Callable[[], T], bars: Closable | None = None) -> T:
    """Call into the library; our errors become lines on stderr and an exit code.

    Progress bars are closed first, so none is redrawn below the error line.
    """
    try:
        with interrupts.catching():
            return action()
    except H5EtlError as exc:
        if bars is not None:
            bars.close()
        raise fail(exc) from None
    except KeyboardInterrupt:
        if bars is not None:
            bars.close()
        typer.echo("h5etl: interrupted; nothing was published", err=True)
        raise typer.Exit(130) from None
