"""The ``h5etl`` command: parse, call one library function, render. Errors become one line."""

from __future__ import annotations

import atexit
import gc
import logging
from pathlib import Path
from typing import Annotated

import typer

from h5etl._version import __version__
from h5etl.cli.build import ALL_CORES, ConfigArgument, JobsOption, QuietOption, build
from h5etl.cli.common import app
from h5etl.cli.common import fail as _fail
from h5etl.cli.common import run as _run
from h5etl.cli.common import say as _say
from h5etl.execute import pool as workers

__all__ = ["app", "main"]

# The pipeline, pydantic and HDF5 load inside the commands (``h5etl.cli.build``: ``build``
# starts its workers first, so their start-up overlaps these imports).


@app.command()
def validate(config: ConfigArgument) -> None:
    """Check CONFIG without building."""
    from h5etl.config.load import check_tables, load_spec
    from h5etl.plan.kind_registry import check_installed, plugin_notes, user_code_notes

    spec = _run(lambda: load_spec(config))
    _run(lambda: check_tables(spec))  # a broken table is the config's problem, found now
    _run(lambda: check_installed(spec))  # a missing extra too
    code_notes = _run(lambda: user_code_notes(spec))  # every call resolves, or exit 2
    fields = ", ".join(f"{name} ({spec.kind_of(name)})" for name in spec.fields)
    _say(f"{config}: OK ({spec.name}: fields {fields}; splits {', '.join(spec.splits)})")
    for name, kind in spec.inferred_kinds.items():
        _say(
            f"note: fields.{name} has no kind: read as kind: {kind}, as before kinds existed "
            f"(write kind: {kind} to say so)"
        )
    for line in [*plugin_notes(spec), *code_notes]:
        _say(line)


@app.command()
def check(
    where: Annotated[
        str, typer.Argument(metavar="PATH", help="A release file or link (or its s3:// URL).")
    ],
    deep: Annotated[bool, typer.Option("--deep", help="Recompute every SHA-256.")] = False,
) -> None:
    """Report on a release; exit 1 if anything is damaged."""
    from h5etl.check.health import check_release
    from h5etl.cli.releases import release_path
    from h5etl.errors import CheckFailed

    # The report, PROBLEM and WARNING lines included, goes to stdout; on failure one verdict
    # line goes to stderr, counting the problems without repeating them.
    path = release_path(where)  # a URL's release: downloaded once and checked
    report = _run(lambda: check_release(path, deep=deep))
    for line in report.lines:
        _say(line)
    if not report.ok:
        raise _fail(CheckFailed(report.summary, path=path))
    _say(report.summary)


@app.command()
def status(
    where: Annotated[
        str,
        typer.Argument(
            metavar="OUTPUT", help="An output folder (or a release link in one), or its URL."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="The status files as JSON.")] = False,
) -> None:
    """Show the running or the last build of each release in OUTPUT; exit 1 if one failed."""
    import json

    from h5etl.pipeline.status import describe, read_statuses
    from h5etl.remote.location import is_url, parse_location

    if is_url(where):  # the builds of this host into that URL: their local work folder
        from h5etl.release.remote_catalog import status_folder

        output = _run(lambda: status_folder(parse_location(where)))
    else:
        output = Path(where)
    views = _run(lambda: read_statuses(output))
    if as_json:
        _say(json.dumps([{**view.data, "state": view.state} for view in views], indent=2))
    else:
        for view in views:
            for line in describe(view):
                _say(line)
    if any(view.state not in ("running", "succeeded") for view in views):
        raise typer.Exit(1)


@app.command(name="demo")
def demo_command(
    folder: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            metavar="FOLDER",
            help="Where to put the demo (default: h5etl-demo, or h5etl-NAME with --example).",
        ),
    ] = None,
    example: Annotated[
        str,
        typer.Option(
            "--example",
            metavar="NAME",
            help="Which example to build; 'list' lists them.",
        ),
    ] = "cells",
    jobs: JobsOption = ALL_CORES,
    quiet: QuietOption = False,
) -> None:
    """Build the embedded example (synthetic cells, a few broken inputs) into FOLDER/releases.

    Run it again on the same FOLDER: nothing changed, so no new release (`h5etl build
    FOLDER/<example>.yaml --full` builds one). --example NAME builds another
    example (classification, super-resolution, 16-bit CT, colour masks, metadata, flat
    layout), each with a few broken inputs of its kind.
    """
    from h5etl import examples

    if example == "list":
        _say(examples.names_line())
        raise typer.Exit(2)
    _run(lambda: examples.find(example))
    _run(lambda: examples.check_installed(example))  # before anything is made
    where = folder if folder is not None else examples.default_folder(example)
    config = _run(lambda: examples.prepare(where, example))
    _say(f"demo config: {config}")
    build([config], jobs=jobs, dry_run=False, decode=False, resume=False, notes=None, quiet=quiet)


def _version_callback(value: bool) -> None:
    if value:
        _say(f"h5etl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log details.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="h5etl: %(message)s"
    )
    _dask_logs(verbose)


def _dask_logs(shown: bool) -> None:
    """dask.distributed's own records (a lost scheduler's reconnect attempts, with their
    tracebacks) reach the terminal only with ``-v``: the build says what went wrong in one
    line. Its loggers get a handler that drops them, so that logging's last resort (stderr)
    does not print them either."""
    for name in ("distributed", "tornado"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = shown


def main() -> None:
    """Entry point of the ``h5etl`` command."""
    workers.limit_native_threads()  # numpy is not imported yet (a test holds this)
    workers.serve_forks()
    # The interpreter's last garbage collection, after the exit handlers, would walk every
    # object the imports made (pydantic's schemas, numpy, h5py): 0.1 s of CPU after the work
    # is done. Frozen, they are freed as the modules go, without that walk. At exit, not
    # here: a process that calls main() and goes on (a test) must keep collecting what is in
    # reference cycles (an S3 client's pooled connections among them: a test process whose
    # heap was frozen once hung in a later read, no connection open, waiting for one).
    global _freeze_at_exit
    if not _freeze_at_exit:
        atexit.register(gc.freeze)
        _freeze_at_exit = True
    try:
        app()
    finally:
        # the workers it started go now (a config error included)
        workers.stop()
        workers.stop_fork_server()  # none running (no pool was started): nothing to do
        workers.serve_forks(False)  # main() called in a process that goes on (a test)


_freeze_at_exit = False


@app.command()
def preview(
    path: Annotated[Path, typer.Argument(metavar="RELEASE", help="A release file or link.")],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="PNG", help="The PNG to write.")],
    split: Annotated[
        str | None,
        typer.Option("--split", metavar="NAME", help="The split to show (default: the first)."),
    ] = None,
    n: Annotated[
        int, typer.Option("--n", min=1, metavar="N", help="How many samples to show.")
    ] = 16,
) -> None:
    """Draw the first N samples of a split, masks over images, names underneath, into a PNG."""
    from h5etl.preview.sheet import write_preview

    written = _run(lambda: write_preview(path, out, split=split, n=n))
    _say(f"preview: {written}")


# The commands over published releases register on the same app (kept apart for size).
from h5etl.cli import releases as cli_releases  # noqa: E402, F401
