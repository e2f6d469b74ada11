"""The ``h5etl`` command: parse, call one library function, render. Errors become one line."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from tqdm import tqdm

from h5etl import __version__, workers
from h5etl.cli_common import app
from h5etl.cli_common import fail as _fail
from h5etl.cli_common import run as _run
from h5etl.cli_common import say as _say
from h5etl.errors import BuildFailed, UsageError
from h5etl.release_naming import has_link as _has_link
from h5etl.units import human_size

__all__ = ["app", "main"]

# The pipeline, pydantic and HDF5 load inside the commands: ``build`` starts its workers
# first, so their start-up overlaps these imports.
if TYPE_CHECKING:
    from h5etl.records import Reject
    from h5etl.report import BuildReport
    from h5etl.spec import Spec


ALL_CORES = os.cpu_count() or 1

JobsOption = Annotated[
    int,
    typer.Option("--jobs", "-j", min=1, metavar="N", help="Worker processes (default: all cores)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


class _Bars:
    """Draws the pipeline's progress hook as tqdm bars, only on a terminal.

    Stages run one after another, so one bar is live at a time; a finished stage stays as one
    line. A stage shorter than a second never draws.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar: tqdm[Any] | None = None
        self.stage = ""

    def __call__(self, stage: str, advance: int, total: int | None) -> None:
        if not self.enabled:
            return
        if advance == 0 and stage != self.stage:
            self.close()
            self.stage = stage
            self.bar = tqdm(
                total=total,
                desc=f"{stage:>12}",
                unit={"discover": " files", "shards": " shards"}.get(stage, " samples"),
                leave=True,
                dynamic_ncols=True,
                mininterval=0.2,
                delay=1.0,
            )
        elif self.bar is not None and stage == self.stage:
            self.bar.update(advance)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@contextmanager
def _progress(quiet: bool) -> Iterator[_Bars]:
    bars = _Bars(enabled=not quiet and sys.stderr.isatty())
    try:
        yield bars
    finally:
        bars.close()


def _summary(report: BuildReport) -> None:
    splits = ", ".join(f"{split} {count}" for split, count in report.samples.items())
    _say(f"samples: {splits} (of {report.inputs} input files)")
    if report.rejects:
        reasons = ", ".join(f"{reason} {n}" for reason, n in report.reject_counts.items())
        _say(f"rejects: {len(report.rejects)} files ({reasons})")
    else:
        _say("rejects: none")
    from h5etl.report import CONVERSIONS

    for name, codes in report.conversions.items():
        shown = ", ".join(f"{n} {CONVERSIONS.get(code, code)}" for code, n in codes.items())
        _say(f"converted: {name}: {shown}")
    for split, fields in report.class_counts.items():
        for name, counts in fields.items():
            shown = ", ".join(f"{label} {n}" for label, n in counts.items())
            _say(f"classes: {split}/{name}: {shown}")
    if report.path is not None:
        ratio = report.raw_bytes / report.stored_bytes if report.stored_bytes else 0.0
        _say(
            f"bytes: {human_size(report.raw_bytes)} raw, {human_size(report.stored_bytes)} stored "
            f"(ratio {ratio:.2f})"
        )
        _say(f"wall: {report.seconds.get('total', 0.0):.2f} s")
        _say(f"release: {report.path} (v{report.version:04d}); {report.link} -> {report.path.name}")
        if report.change:
            _say(f"change: {report.change}")
        if report.rejects_path is not None:
            _say(f"rejects report: {report.rejects_path}")


def _reject_lines(rejects: Sequence[Reject]) -> None:
    for reject in rejects:
        detail = f": {reject.detail}" if reject.detail else ""
        _say(f"reject: {reject.path}: {reject.reason}{detail}")


ConfigArgument = Annotated[Path, typer.Argument(metavar="CONFIG", help="The build config (YAML).")]


ConfigsArgument = Annotated[
    list[Path],
    typer.Argument(
        metavar="CONFIG",
        help="Build configs (YAML), or folders of them: each builds in turn, then a summary.",
    ),
]


@dataclass(frozen=True, slots=True)
class _BuildOptions:
    jobs: int
    dry_run: bool
    decode: bool
    resume: bool
    quiet: bool
    full: bool = False
    scheduler: str | None = None
    shards: int = 1
    vds: bool = False
    notes: str | None = None  # release notes for every config built (instead of their notes:)


@app.command()
def build(
    configs: ConfigsArgument,
    jobs: JobsOption = ALL_CORES,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Plan and report every reject, write nothing."),
    ] = False,
    decode: Annotated[
        bool,
        typer.Option(
            "--decode",
            help="With --dry-run: also decode every sample, so the rejects are exactly the "
            "build's.",
        ),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue a build that was killed part-way.")
    ] = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Decode every sample and write a fresh permutation, even when the current "
            "release could be carried from.",
        ),
    ] = False,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            metavar="ADDRESS",
            help="Decode on the Dask cluster of this scheduler (tcp://host:8786), or 'local'; "
            "default: the config's decode.scheduler.",
        ),
    ] = None,
    shards: Annotated[
        int,
        typer.Option(
            "--shards",
            min=1,
            metavar="K",
            help="Write with K shard writers side by side, then stitch one release.",
        ),
    ] = 1,
    vds: Annotated[
        bool,
        typer.Option(
            "--vds",
            help="With --shards: publish a virtual-dataset release over the shard files "
            "(no copy; the part files must travel with it).",
        ),
    ] = False,
    notes: Annotated[
        str | None,
        typer.Option("--notes", metavar="TEXT", help="Release notes (instead of the config's)."),
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Build a new release from each CONFIG (a folder: each config in it)."""
    if decode and not dry_run:
        raise _fail(UsageError("--decode needs --dry-run (a build decodes everything anyway)"))
    if vds and shards < 2:
        raise _fail(UsageError("--vds needs --shards K (K >= 2): it maps the shard files"))
    if scheduler is not None:
        _check_scheduler(scheduler)
    single = len(configs) == 1 and not configs[0].is_dir()
    if scheduler in (None, "local") and not (single and not full and _has_link(configs[0])):
        workers.warm_up(jobs)  # a config naming a cluster leaves these idle; they time out
    options = _BuildOptions(
        jobs, dry_run, decode, resume, quiet, full, scheduler, shards, vds, notes
    )
    if single:
        spec = _run(lambda: _load(configs[0], options))
        with _progress(quiet) as bars:
            report = _run(lambda: _build_spec(spec, options, bars), bars)
        _render_build(report, dry_run=dry_run)
        return
    _build_many(configs, options)


def _load(path: Path, options: _BuildOptions) -> Spec:
    from h5etl.config import load_spec
    from h5etl.story import with_notes

    return with_notes(load_spec(path), options.notes)


def _build_spec(spec: Spec, options: _BuildOptions, bars: _Bars) -> BuildReport:
    from h5etl import pipeline, records

    try:
        return pipeline.build(
            spec,
            jobs=options.jobs,
            scheduler=options.scheduler,
            shards=options.shards,
            virtual=options.vds,
            dry_run=options.dry_run,
            decode=options.decode,
            resume=options.resume,
            full=options.full,
            progress=bars,
        )
    except BuildFailed as exc:
        if options.dry_run:  # what the dry run found before it stopped, as the build would
            bars.close()
            _reject_lines([r for r in exc.rejects if isinstance(r, records.Reject)])
        raise


def _build_many(paths: list[Path], options: _BuildOptions) -> None:
    """Each config in turn, each under its own lock; a summary table; the worst exit code."""
    from h5etl import batch

    configs = _run(lambda: batch.config_files(paths))

    def started(outcome: batch.Outcome) -> None:
        _say(f"== {outcome.config} ({outcome.name}) ==")

    def done(outcome: batch.Outcome) -> None:
        if outcome.report is not None:
            _render_build(outcome.report, dry_run=options.dry_run)
        for line in outcome.error.splitlines():
            typer.echo(f"h5etl: error: {line}", err=True)

    def one(spec: Spec) -> BuildReport:
        with _progress(options.quiet) as bars:
            return _build_spec(spec, options, bars)

    outcomes = batch.build_all(
        configs, load=lambda path: _load(path, options), build=one, started=started, done=done
    )
    _say("== summary ==")
    for line in batch.summary_lines(outcomes):
        _say(line)
    code = batch.exit_code(outcomes)
    if code:
        raise typer.Exit(code)


def _check_scheduler(address: str) -> None:
    import re

    from h5etl.specparts import SCHEDULER_PATTERN

    if not re.match(SCHEDULER_PATTERN, address):
        raise _fail(
            UsageError(
                f"--scheduler: not a scheduler address: {address!r}; give tcp://host:8786 "
                f"(what `dask scheduler` prints) or local"
            )
        )


def _render_build(report: BuildReport, *, dry_run: bool) -> None:
    if report.up_to_date:
        from h5etl.uptodate import message

        _say(message(report))
        for warning in report.warnings:
            _say(f"warning: {warning}")
        return
    if dry_run:
        _reject_lines(report.rejects)
        _say(f"dry run: checked {', '.join(report.checks)}; nothing written")
    if report.resumed:
        _say(f"resumed: {report.resumed} samples copied from the killed build")
    if report.reused:
        mib = report.reused_bytes / 2**20
        _say(f"carried: {report.reused} samples ({mib:.1f} MiB of chunks) from the parent release")
    if report.shards:
        reused = (
            f", {report.shards_reused} reused from the killed build" if report.shards_reused else ""
        )
        how = "mapped by the release (virtual datasets)" if report.virtual else "stitched"
        _say(f"shards: {report.shards} written side by side and {how}{reused}")
    _summary(report)
    for warning in report.warnings:
        _say(f"warning: {warning}")


@app.command()
def validate(config: ConfigArgument) -> None:
    """Check CONFIG without building."""
    from h5etl.config import check_tables, load_spec

    spec = _run(lambda: load_spec(config))
    _run(lambda: check_tables(spec))  # a broken table is the config's problem, found now
    fields = ", ".join(f"{name} ({spec.kind_of(name)})" for name in spec.fields)
    _say(f"{config}: OK ({spec.name}: fields {fields}; splits {', '.join(spec.splits)})")
    for name, kind in spec.inferred_kinds.items():
        _say(
            f"note: fields.{name} has no kind: read as kind: {kind}, as before kinds existed "
            f"(write kind: {kind} to say so)"
        )


@app.command()
def check(
    path: Annotated[Path, typer.Argument(help="A release file or link.")],
    deep: Annotated[bool, typer.Option("--deep", help="Recompute every SHA-256.")] = False,
) -> None:
    """Report on a release; exit 1 if anything is damaged."""
    from h5etl.check import check_release
    from h5etl.errors import CheckFailed

    # The report, PROBLEM and WARNING lines included, goes to stdout; on failure one verdict
    # line goes to stderr, counting the problems without repeating them.
    report = _run(lambda: check_release(path, deep=deep))
    for line in report.lines:
        _say(line)
    if not report.ok:
        raise _fail(CheckFailed(report.summary, path=path))
    _say(report.summary)


@app.command()
def status(
    output: Annotated[
        Path,
        typer.Argument(metavar="OUTPUT", help="An output folder (or a release link in one)."),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="The status files as JSON.")] = False,
) -> None:
    """Show the running or the last build of each release in OUTPUT; exit 1 if one failed."""
    import json

    from h5etl.status import describe, read_statuses

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


def main() -> None:
    """Entry point of the ``h5etl`` command."""
    workers.limit_native_threads()  # numpy is not imported yet (a test holds this)
    app()


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
    from h5etl.preview import write_preview

    written = _run(lambda: write_preview(path, out, split=split, n=n))
    _say(f"preview: {written}")


# The commands over published releases register on the same app (kept apart for size).
from h5etl import cli_releases  # noqa: E402, F401
