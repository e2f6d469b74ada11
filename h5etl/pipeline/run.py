"""The build: wires discover -> clean -> decode -> sink -> release; no I/O of its own."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from h5etl import timeline
from h5etl.config.spec import Spec, spec_text
from h5etl.errors import BuildFailed, ResumeMismatch, UsageError
from h5etl.execute import assembly, local_threads
from h5etl.execute import pool as workers
from h5etl.execute.assembly import (
    LazyDecoder,
    Stopwatch,
    decoding,
    planned,
    sink_layout,
    source_roots,
)
from h5etl.history import clock, provenance
from h5etl.history.build_report import BuildReport, enforce_limit, require_samples
from h5etl.incremental import carry_record, parent, reuse, uptodate
from h5etl.incremental.redo import RedoRejected
from h5etl.pipeline import interrupts, planning, settle, write
from h5etl.pipeline.planning import ProgressHook
from h5etl.pipeline.status import BuildStatus
from h5etl.pipeline.write import BuildRun
from h5etl.plan import kind_registry as registry
from h5etl.plan.result import Plan
from h5etl.release.remote_folder import output_folder
from h5etl.resume import journal_use as resume
from h5etl.shards.committer import Sharding, start_sharded
from h5etl.shards.stitch import Shards

logger = logging.getLogger(__name__)


def build(
    spec: Spec,
    *,
    jobs: int = 1,
    scheduler: str | None = None,
    shards: int = 1,
    virtual: bool = False,
    dry_run: bool = False,
    decode: bool = False,
    resume: bool = False,
    full: bool = False,
    progress: ProgressHook | None = None,
    checkpoint_seconds: float = resume.CHECKPOINT_SECONDS,
) -> BuildReport:
    """Build one release from ``spec``; with ``dry_run``, predict it and write nothing.

    A dry run discovers and probes headers; with ``decode`` it also decodes every sample (the
    same tasks as a build), so its rejects and counts are exactly a build's. It honours
    ``max_rejects`` as a build does. With ``resume``, a build that was killed part-way is
    continued from its journal: the chunks it stored are copied (verified) and only the rest
    is decoded. Without it, leftovers of dead builds are removed and the build starts clean.
    When the link points at a release built with the same layout, its unchanged samples'
    chunks are copied, not decoded (``h5etl.incremental.reuse``); ``full`` decodes everything (and
    so does a sharded build).
    With ``scheduler`` (or the config's ``decode.scheduler``) a Dask address, the tasks are
    decoded on that cluster; this process plans and writes. With ``shards`` K > 1, K writer
    processes write the first round's chunks as shard files side by side, and this process
    stitches them into the release (``h5etl.shards.committer``); ``resume`` then reuses the shards a
    killed build committed; with ``virtual`` the release maps its array datasets onto the
    shard files (published beside it) instead of copying them.

    Raises:
        BuildFailed: rejects under ``on_error: fail`` or past ``max_rejects``, or nothing to
            store; a real build writes the per-file rejects first (``BuildFailed.report``).
        LockHeld: another build of the same name is writing to the same folder.
        ConfigError: an optional library the fields are read with is not installed.
        SinkError, ReleaseError: the file could not be written or published.
        ClusterError: the Dask cluster cannot run the build (``ClusterLost``: it was lost
            mid-build; the temp file and journal stay for ``resume``).
        UsageError: ``scheduler`` is no address a Dask scheduler can have.
        ShardError: a shard writer died twice, or a shard does not hold what it committed.
    """
    timeline.mark("pipeline imported")
    hook = progress or (lambda stage, advance, total: None)
    epoch = clock.source_date_epoch()  # a malformed one fails now, not after the work
    registry.check_installed(spec)  # a missing extra too, not as a reject per sample
    registry.check_user_code(spec)  # a transform that cannot run: a config error before any work
    if dry_run and not decode:
        workers.warm_up(jobs)  # the header probes run there
        return planning.dry_run(spec, hook, jobs, None)
    if dry_run:
        with decoding(spec, jobs, scheduler) as decoder:
            return planning.dry_run(spec, hook, jobs, decoder)
    output = output_folder(spec.output, spec.name)
    if virtual and output.published_url(1):
        raise UsageError("--virtual cannot publish to object storage (its parts are local files)")
    sharding = None
    if shards > 1:
        address = scheduler or spec.decode.scheduler
        roots = tuple(source_roots(spec))
        sharding = Sharding(shards, jobs, address, roots, reuse=resume, virtual=virtual)
    with (
        output.locked(),
        BuildStatus(output, config=spec.config_file, jobs=jobs) as status,
        LazyDecoder(spec, jobs, scheduler) as decoder,
    ):
        remote = (scheduler or spec.decode.scheduler) != "local"

        def both(stage: str, advance: int, total: int | None) -> None:
            status(stage, advance, total)
            hook(stage, advance, total)

        run = BuildRun(
            spec, output, jobs, both, status, checkpoint_seconds, epoch, decoder, sharding
        )
        try:  # the status says how it ended, also when the cluster fails its check
            if full or resume or sharding is not None or output.current_release() is None:
                decoder.start()  # it will decode: the workers start while this process plans
            elif remote:
                decoder.start()  # a cluster that cannot be reached fails now, not after planning
            return _build_locked(run, resume=resume, full=full or sharding is not None)
        except BaseException as exc:
            status.failed(exc)  # under the lock: the next build's status cannot be overwritten
            raise


def _build_locked(run: BuildRun, *, resume: bool, full: bool) -> BuildReport:
    spec, output, jobs, hook, status = run.spec, run.output, run.jobs, run.hook, run.status
    previous = output.resumables() if resume else []
    # --resume keeps every leftover until the release is out: shards have no journal
    discarded = [] if resume else output.remove_stale_partials()
    # --resume with nothing to resume is a plain build: up to date if nothing changed
    gate = uptodate.Gate(output, run.decoder, always=full or bool(previous))
    killed = [p for p in discarded if p.suffix == ".h5"]
    run.decoder.refused = local_threads.refusal(
        killed=bool(killed), resume=bool(previous), record=gate.record
    )
    report, plan, watch, origin = planning.plan_only(spec, hook, jobs, discovered=gate.discovered)
    timeline.mark("planned")
    status.planned(planned(plan), report.rejects)
    redone = (
        [
            f"the temp file of a killed build ({killed[0].name}) was removed: --resume "
            f"continues a killed build instead"
        ]
        if killed and not resume
        else []
    )
    planned_rejects = len(report.rejects)
    try:
        if gate.up_to_date(spec, plan, report, origin):
            return _up_to_date(run, report, watch, [*plan.warnings, *redone])
        info = _build_planned(run, plan, report, watch, previous, None if full else origin, gate)
    except uptodate.NothingNew:  # it decoded only samples the parent does not store: rejected
        gate.settle(report, report.rejects[planned_rejects:])
        return _up_to_date(run, report, watch, [*plan.warnings, *redone])
    except BuildFailed as exc:
        path = output.write_failed_rejects(report.rejects)
        raise BuildFailed(
            f"{exc.message}; per-file reasons in {path}",
            path=exc.path,
            rejects=report.rejects,
            report=path,
            docs=exc.docs,
        ) from exc
    output.remove_stale_partials()
    timeline.mark("stale partials removed")
    watch.lap("publish")
    report.seconds = {**report.seconds, **watch.seconds, "total": watch.total()}
    report.version, report.path, report.link = info.version, info.path, output.link
    report.url = output.published_url(info.version)
    report.rejects_path = info.rejects
    # the build's own: why nothing was carried, what the loss guard let through
    report.warnings = [*plan.warnings, *report.warnings, *redone]
    status.succeeded(
        version=info.version, path=info.path, samples=report.samples, seconds=watch.total()
    )
    timeline.mark("status written")
    return report


def _up_to_date(
    run: BuildRun, report: BuildReport, watch: Stopwatch, warnings: list[str]
) -> BuildReport:
    """An up-to-date build's end: no release, the linked one named, as ``report`` says."""
    report.seconds = {**watch.seconds, "total": watch.total()}
    report.warnings = warnings
    run.status.succeeded(
        version=report.version,
        path=report.path,
        samples=report.samples,
        seconds=watch.total(),
        up_to_date=True,
        rejects=report.rejects,  # the parent's decode-time ones too
    )
    return report


def _build_planned(
    run: BuildRun,
    plan: Plan,
    report: BuildReport,
    watch: Stopwatch,
    previous: list[tuple[Path, Path]],
    origin: parent.Parent | None,
    gate: uptodate.Gate,
) -> Any:
    spec, output, record = run.spec, run.output, gate.record
    enforce_limit(spec, report.rejects, report.inputs)
    require_samples(spec, report.samples, report)
    version = output.next_version()
    earlier: resume.Start | None = resume.usable_resume(previous, spec, plan)
    if earlier is None and run.sharding is not None:
        earlier = _sharded(run, plan, report, version, watch)
    carried = None
    if earlier is None and origin is not None:
        layout_seen = assembly.layout_record(spec, plan)
        carried, why = reuse.decide(
            plan, origin, output, spec_text(spec), layout_seen, record
        )  # the carry record the up-to-date check read (5 MB of JSON at 30,000 pairs)
        if why is not None:
            report.warnings.append(f"every sample decoded: {why}")
        if carried is not None and carried.decode is not None:
            run.decoder.decode_here_if_cheap(carried.decoding, carried.rate)
        else:
            run.decoder.start()  # everything is decoded: the workers start while the sink opens
    planned_rejects = list(report.rejects)
    while True:
        report.rejects = list(planned_rejects)
        try:
            with output.staged() as temp:
                warned = len(report.warnings)
                written = write.write_release(
                    run, plan, report, temp, version=version, watch=watch, earlier=earlier,
                    carried=carried, gate=gate,
                )  # fmt: skip
                stored = plan
                settled = settle.resettled(spec, plan, report.rejects[len(planned_rejects) :])
                if settled is not None:  # what the first write warned of is the second's to say
                    del report.warnings[warned:]
                if settled is None:
                    info = _publish(run, report, temp, version, earlier)
                else:  # decoding rejected samples the splits counted on: split them again
                    with output.staged() as again:
                        # as the first write was: by shard writers, else carried from origin
                        sharded, reused = None, report.shards_reused
                        if isinstance(earlier, Shards):
                            sharded = _sharded(run, settled, report, version, watch)
                            report.shards_reused += reused  # those of the first write too
                        rewrite = functools.partial(
                            write.write_release, run, version=version, watch=watch, earlier=sharded,
                            gate=gate, planned_as=plan,
                        )  # fmt: skip
                        written = settle.rewrite(
                            rewrite, (plan, settled), report, again, origin=origin,
                            output=output, config=spec_text(spec),
                            layout=assembly.layout_record(spec, settled), record=record,
                        )  # fmt: skip
                        info = _publish(run, report, again, version, sharded)
                    stored = settled
            if written is not None:  # a record only of builds that saw every block's tally
                late = report.rejects[len(planned_rejects) :]  # rejected while decoding
                rejected = uptodate.rejected_of(spec, plan, late)
                inherited = None if carried is None else carried.rate
                carry_record.leave_record(
                    output, stored, version, *written, rejected=rejected, inherited=inherited
                )
                timeline.mark("carry record written")
            return info
        except (RedoRejected, ResumeMismatch) as exc:
            earlier, carried = _start_over(exc, run, report, earlier, carried)


def _start_over(
    exc: RedoRejected | ResumeMismatch,
    run: BuildRun,
    report: BuildReport,
    earlier: resume.Start | None,
    carried: reuse.CarryPlan | None,
) -> tuple[resume.Start | None, reuse.CarryPlan | None]:
    """What the next write starts from after one was given up: nothing carried when the
    changed code rejected a carried sample (its other columns were copied already), nothing
    resumed when the killed build's chunks are not what its journal says (re-raised when
    the write resumed nothing)."""
    if isinstance(exc, RedoRejected):
        report.warnings.append(f"every sample decoded: {exc}")
        report.reused = report.reused_bytes = 0
        report.redone = ()
        run.decoder.start()
        return earlier, None
    if earlier is None:
        raise exc
    logger.warning("cannot resume (%s); building from the start", exc)
    report.resumed = 0
    return None, carried


def _sharded(
    run: BuildRun, plan: Plan, report: BuildReport, version: int, watch: Stopwatch
) -> Shards:
    """The first round of ``plan`` written by the shard writers (``--shards K``)."""
    assert run.sharding is not None
    run.hook("shards", 0, run.sharding.count)
    layout, recipe = sink_layout(run.spec, plan), assembly.recipe_of(plan)
    started = start_sharded(
        run.spec, plan, run.output, run.sharding, layout, recipe, version, report, run.hook
    )
    watch.lap("shards")
    return started


def _publish(
    run: BuildRun, report: BuildReport, temp: Path, version: int, earlier: resume.Start | None
) -> Any:
    facts = provenance.build_facts(report, run.jobs)
    facts["shards"] = run.sharding.count if run.sharding else 0
    facts["decoded_in"] = run.decoder.where  # "": nothing was decoded
    facts["allowed_losses"] = [w for w in report.warnings if w.startswith("--allow")]
    parts = earlier.parts if isinstance(earlier, Shards) and earlier.virtual else []
    interrupts.check()  # never publish after a Ctrl-C, even one Python lost
    timeline.mark("publish: start")
    info = run.output.publish(temp, report.rejects, version=version, facts=facts, parts=parts)
    timeline.mark("published")
    return info
