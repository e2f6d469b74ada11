"""The ``h5etl build`` command: options, progress bars, the summary, many configs at once.

Registered on the one app (``h5etl.cli.common``), before the other commands (``h5etl.cli.app``
imports it first). It parses, starts the workers early, calls the pipeline, renders.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from h5etl import docrefs, timeline
from h5etl.cli import early
from h5etl.cli.common import app
from h5etl.cli.common import fail as _fail
from h5etl.cli.common import run as _run
from h5etl.cli.common import say as _say
from h5etl.errors import BuildFailed, UsageError
from h5etl.execute import pool as workers
from h5etl.pipeline import interrupts
from h5etl.release.naming import has_link as _has_link
from h5etl.units import human_size

# The pipeline, pydantic and HDF5 load inside the command: it starts its workers first, so
# their start-up overlaps these imports.
if TYPE_CHECKING:
    from tqdm import tqdm

    from h5etl.config.spec import Spec
    from h5etl.dataflow import Reject
    from h5etl.history.build_report import BuildReport

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
            # tqdm loads on the first bar: 15 ms (its version lookup reads package metadata)
            # that --help, --quiet and runs without a terminal never need
            from tqdm import tqdm

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
        from h5etl.history.build_report import rejects_said

        reasons = ", ".join(f"{reason} {n}" for reason, n in report.reject_counts.items())
        counts = report.reject_counts  # one reason: its own section; more: the page
        see = docrefs.reject(next(iter(counts))) if len(counts) == 1 else docrefs.REJECTS
        _say(f"rejects: {rejects_said(report.rejects)} ({reasons}); see {see}")
    else:
        _say("rejects: none")
    from h5etl.history.build_report import CONVERSIONS

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
        if report.url:  # object storage: the pointer <name>.h5.json names the release
            pointer = f"{report.name}.h5.json"
            _say(f"release: {report.url} (v{report.version:04d}); {pointer} -> {report.path.name}")
        else:
            _say(
                f"release: {report.path} (v{report.version:04d}); {report.link} -> "
                f"{report.path.name}"
            )
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
    pooled: bool = False  # the worker pool was started (warm_up): it can import ahead
    allow_loss: bool = False  # the loss guards warn instead of failing (Spec.allowing_loss)


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
    allow_loss: Annotated[
        bool,
        typer.Option(
            "--allow-loss",
            help="Publish although the loss guards (max_rejects, max_shrink, allow_empty) "
            "would refuse: for the one build whose loss is intended; it says what was lost.",
        ),
    ] = False,
    quiet: QuietOption = False,
) -> None:
    """Build a new release from each CONFIG (a folder: each config in it)."""
    if decode and not dry_run:
        raise _fail(UsageError("--decode needs --dry-run (a build decodes everything anyway)"))
    if vds and shards < 2:
        raise _fail(UsageError("--vds needs --shards K (K >= 2): it maps the shard files"))
    if scheduler is not None:
        _check_scheduler(scheduler)
    timeline.mark("cli: command parsed (the CLI's imports done)")
    single = len(configs) == 1 and not configs[0].is_dir()
    pooled = scheduler in (None, "local") and not (single and not full and _has_link(configs[0]))
    if pooled:
        if shards > 1:
            workers.preload_too(("h5etl.shards.writers",))
        workers.warm_up(jobs)  # a config naming a cluster leaves these idle; they time out
    options = _BuildOptions(
        jobs, dry_run, decode, resume, quiet, full, scheduler, shards, vds, notes, pooled,
        allow_loss=allow_loss,
    )  # fmt: skip
    if single:
        spec = _run(lambda: _load(configs[0], options))
        timeline.mark("config loaded")
        with _progress(quiet) as bars:
            report = _run(lambda: _build_spec(spec, options, bars), bars)
        _render_build(report, dry_run=dry_run)
        timeline.mark("cli: summary printed")
        return
    _build_many(configs, options)


def _load(path: Path, options: _BuildOptions) -> Spec:
    from h5etl.config.load import load_spec

    spec = load_spec(path).with_notes(options.notes)
    return spec.allowing_loss() if options.allow_loss else spec


def _build_spec(spec: Spec, options: _BuildOptions, bars: _Bars) -> BuildReport:
    if options.pooled:
        from h5etl.plan.kind_registry import worker_modules

        workers.preload(options.jobs, worker_modules(spec))  # while the pipeline imports
    from h5etl import dataflow
    from h5etl.pipeline import run as pipeline

    def progress(stage: str, advance: int, total: int | None) -> None:
        if stage not in _PLANNING_STAGES:
            early.resume_collection()  # the start is over: it decodes (or writes shards)
        bars(stage, advance, total)

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
            progress=progress,
        )
    except BuildFailed as exc:
        if options.dry_run:  # what the dry run found before it stopped, as the build would
            bars.close()
            _reject_lines([r for r in exc.rejects if isinstance(r, dataflow.Reject)])
        raise
    finally:
        early.resume_collection()  # one that decoded nothing (up to date, a dry run)


_PLANNING_STAGES = ("discover", "plan", "probe")  # the pipeline's stages before decoding


def _build_many(paths: list[Path], options: _BuildOptions) -> None:
    """Each config in turn, each under its own lock; a summary table; the worst exit code."""
    from h5etl.pipeline import batch

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

    with interrupts.catching():  # a Ctrl-C Python swallows still stops the builds
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
    """A scheduler address that cannot work is a usage error, found before connecting."""
    from h5etl.config.scheduler_address import scheduler_problem

    problem = scheduler_problem(address)
    if problem is None and address.startswith("inproc://"):
        problem = f"{address!r} names a scheduler inside another process: give tcp://host:8786"
    if problem is not None:
        raise _fail(UsageError(f"--scheduler: {problem}"))


def _render_build(report: BuildReport, *, dry_run: bool) -> None:
    if report.up_to_date:
        from h5etl.incremental.uptodate import message

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
        if report.redone:
            redone = ", ".join(report.redone)
            _say(f"made again for those samples (their transform changed): {redone}")
    if report.shards:
        reused = (
            f", {report.shards_reused} reused from the killed build" if report.shards_reused else ""
        )
        how = "mapped by the release (virtual datasets)" if report.virtual else "stitched"
        _say(f"shards: {report.shards} written side by side and {how}{reused}")
    _summary(report)
    for warning in report.warnings:
        _say(f"warning: {warning}")
