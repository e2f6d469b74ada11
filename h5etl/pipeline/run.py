"""The build: wires discover -> clean -> decode -> sink -> release; no I/O of its own."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from h5etl.config.spec import Spec, spec_text
from h5etl.decode import memory
from h5etl.errors import BuildFailed, ResumeMismatch
from h5etl.execute import assembly as buildparts
from h5etl.execute import local_threads as inprocess
from h5etl.execute import pool as workers
from h5etl.execute.assembly import (
    LazyDecoder,
    Stopwatch,
    decoding,
    planned,
    processed,
    sink_layout,
    source_roots,
)
from h5etl.format import contract as fileformat
from h5etl.history import clock as reproducible
from h5etl.history import provenance
from h5etl.history.build_report import BuildReport, enforce_limit, guard, require_samples
from h5etl.history.release_notes import Annotator, stored_rejects
from h5etl.incremental import parent, uptodate
from h5etl.incremental import reuse as carry
from h5etl.pipeline import interrupts, planning, settle
from h5etl.pipeline.planning import ProgressHook
from h5etl.pipeline.status import BuildStatus
from h5etl.plan import kind_registry as registry
from h5etl.plan.result import Plan
from h5etl.release.folder import OutputFolder
from h5etl.resume import journal_use as resume
from h5etl.shards.committer import Sharding, Shards, start_sharded
from h5etl.sink.writer import Sink
from h5etl.stats.tallies import Tallies, block_json

logger = logging.getLogger(__name__)

# Where they lived before buildparts: tests and benchmarks derive recipes and layouts here.


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
    hook = progress or (lambda stage, advance, total: None)
    epoch = reproducible.source_date_epoch()  # a malformed one fails now, not after the work
    registry.check_installed(spec)  # a missing extra too, not as a reject per sample
    if dry_run and not decode:
        workers.warm_up(jobs)  # the header probes run there
        return planning.dry_run(spec, hook, jobs, None)
    if dry_run:
        with decoding(spec, jobs, scheduler) as decoder:
            return planning.dry_run(spec, hook, jobs, decoder)
    output = OutputFolder(spec.output, spec.name)
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

        run = _Run(spec, output, jobs, both, status, checkpoint_seconds, epoch, decoder, sharding)
        try:  # the status says how it ended, also when the cluster fails its check
            if full or resume or sharding is not None or output.current_release() is None:
                decoder.start()  # it will decode: the workers start while this process plans
            elif remote:
                decoder.start()  # a cluster that cannot be reached fails now, not after planning
            return _build_locked(run, resume=resume, full=full or sharding is not None)
        except BaseException as exc:
            status.failed(exc)  # under the lock: the next build's status cannot be overwritten
            raise


@dataclass(frozen=True, slots=True)
class _Run:
    """What every step of one build needs beside the plan: where, how, who listens."""

    spec: Spec
    output: OutputFolder
    jobs: int
    hook: ProgressHook  # the status file's, then the caller's
    status: BuildStatus
    checkpoint_seconds: float
    epoch: datetime | None  # SOURCE_DATE_EPOCH
    decoder: LazyDecoder  # the local pool or the Dask cluster, started when needed
    sharding: Sharding | None = None  # K shard writers (--shards)


def _build_locked(run: _Run, *, resume: bool, full: bool) -> BuildReport:
    spec, output, jobs, hook, status = run.spec, run.output, run.jobs, run.hook, run.status
    previous = output.resumables() if resume else []
    # --resume keeps every leftover until the release is out: shards have no journal
    discarded = [] if resume else output.remove_stale_partials()
    # --resume with nothing to resume is a plain build: up to date if nothing changed
    gate = uptodate.Gate(output, run.decoder, always=full or bool(previous))
    killed = [p for p in discarded if p.suffix == ".h5"]
    run.decoder.refused = inprocess.refusal(
        killed=bool(killed), resume=bool(previous), record=gate.record
    )
    report, plan, watch, origin = planning.plan_only(spec, hook, jobs, discovered=gate.discovered)
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
    watch.lap("publish")
    report.seconds = {**report.seconds, **watch.seconds, "total": watch.total()}
    report.version, report.path, report.link = info.version, info.path, output.link
    report.rejects_path = info.rejects
    # the build's own: why nothing was carried, what the loss guard let through
    report.warnings = [*plan.warnings, *report.warnings, *redone]
    status.succeeded(
        version=info.version, path=info.path, samples=report.samples, seconds=watch.total()
    )
    return report


def _up_to_date(
    run: _Run, report: BuildReport, watch: Stopwatch, warnings: list[str]
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
    run: _Run,
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
        layout_seen = buildparts.layout_record(spec, plan)
        carried, why = carry.decide(
            plan, origin, output, spec_text(spec), layout_seen, record
        )  # the carry record the up-to-date check read (5 MB of JSON at 30,000 pairs)
        if why is not None:
            report.warnings.append(f"every sample decoded: {why}")
        if carried is not None and carried.decode is not None:
            run.decoder.decode_here_if_cheap(carried.decode.total, carried.rate)
        else:
            run.decoder.start()  # everything is decoded: the workers start while the sink opens
    planned_rejects = list(report.rejects)
    while True:
        report.rejects = list(planned_rejects)
        try:
            with output.staged() as temp:
                warned = len(report.warnings)
                written = _write(
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
                            _write, run, version=version, watch=watch, earlier=sharded,
                            gate=gate, planned_as=plan,
                        )  # fmt: skip
                        written = settle.rewrite(
                            rewrite, (plan, settled), report, again, origin=origin,
                            output=output, config=spec_text(spec),
                            layout=buildparts.layout_record(spec, settled), record=record,
                        )  # fmt: skip
                        info = _publish(run, report, again, version, sharded)
                    stored = settled
            if written is not None:  # a record only of builds that saw every block's tally
                late = report.rejects[len(planned_rejects) :]  # rejected while decoding
                rejected = uptodate.rejected_of(spec, plan, late)
                inherited = None if carried is None else carried.rate
                carry.leave_record(
                    output, stored, version, *written, rejected=rejected, inherited=inherited
                )
            return info
        except ResumeMismatch as exc:
            if earlier is None:
                raise
            logger.warning("cannot resume (%s); building from the start", exc)
            earlier = None
            report.resumed = 0


def _sharded(run: _Run, plan: Plan, report: BuildReport, version: int, watch: Stopwatch) -> Shards:
    """The first round of ``plan`` written by the shard writers (``--shards K``)."""
    assert run.sharding is not None
    run.hook("shards", 0, run.sharding.count)
    layout, recipe = sink_layout(run.spec, plan), buildparts.recipe_of(plan)
    started = start_sharded(
        run.spec, plan, run.output, run.sharding, layout, recipe, version, report, run.hook
    )
    watch.lap("shards")
    return started


def _publish(
    run: _Run, report: BuildReport, temp: Path, version: int, earlier: resume.Start | None
) -> Any:
    facts = provenance.build_facts(report, run.jobs)
    facts["shards"] = run.sharding.count if run.sharding else 0
    facts["decoded_in"] = run.decoder.where  # "": nothing was decoded
    facts["allowed_losses"] = [w for w in report.warnings if w.startswith("--allow")]
    parts = earlier.parts if isinstance(earlier, Shards) and earlier.virtual else []
    interrupts.check()  # never publish after a Ctrl-C, even one Python lost
    return run.output.publish(temp, report.rejects, version=version, facts=facts, parts=parts)


def _write(
    run: _Run,
    plan: Plan,
    report: BuildReport,
    temp: Path,
    *,
    version: int,
    watch: Stopwatch,
    earlier: resume.Start | None,
    carried: carry.CarryPlan | None = None,
    gate: uptodate.Gate | None = None,
    planned_as: Plan | None = None,
) -> tuple[str, carry.BlockLog] | None:
    """Write the release to ``temp``; return its fingerprint and block tallies (for its carry
    record), or None after a resume or a sharded build (their tallies are not per block).
    ``planned_as``: the plan the loss guard holds the counts against, when it is not ``plan``
    (the first plan, for the second write of a build whose decoding rejected samples)."""
    spec, hook, status = run.spec, run.hook, run.status
    recipe = buildparts.recipe_of(plan)
    record = buildparts.layout_record(spec, plan)
    state = earlier.queues if earlier is not None else None
    tallies = earlier.tallies() if earlier is not None else Tallies()
    todo = carried.decode if carried is not None and carried.decode is not None else plan
    try:
        cutter = buildparts.cutter(spec, todo, state)
    except ValueError as exc:  # a journal of another h5etl: its tasks were cut otherwise
        raise ResumeMismatch(str(exc), path=temp) from exc
    checkpoints = resume.Checkpoints(
        OutputFolder.journal_of(temp), spec, todo, cutter, run.checkpoint_seconds, tallies
    )
    log = carry.BlockLog() if earlier is None else None
    fingerprint = hashlib.sha256()  # over key and file digests in write order: no list kept
    worker_seconds = writer_seconds = 0.0  # of other processes: the shards' workers and writers
    virtual = isinstance(earlier, Shards) and earlier.virtual
    linked = run.output.current_release()  # the parent, as for the splits
    annotate = Annotator(None if linked is None else linked[1])  # the change label
    created = threading.Event()
    try:
        with (
            # with chunks to copy first, the workers decode meanwhile (a thread pulls them),
            # from once the file exists, while the sink copies the parent's first rows or a
            # killed build's chunks (a resume after a kill at half time copied 1.7 s first)
            buildparts.results(
                cutter,
                recipe,
                run.decoder,
                early=carried is not None or earlier is not None,
                start=created,
            ) as results,
            Sink(
                temp,
                sink_layout(spec, plan),
                virtual=virtual,
                seed=None if carried is None else carried.seed(),
                on_rows=annotate.rows,
                on_created=created.set,
            ) as sink,
        ):
            if earlier is not None:
                restored = earlier.restore(sink, checkpoints)
                # This build's journal now holds everything the killed builds' files did
                # (a virtual release keeps its parts: they are published beside it).
                parts = earlier.parts if isinstance(earlier, Shards) and virtual else []
                keep = {temp, OutputFolder.journal_of(temp), *parts}
                run.output.remove_stale_partials(keep=keep)
                fingerprint.update(restored.fingerprint.encode())
                report.rejects.extend(restored.rejects)
                report.resumed = restored.samples if restored.resumed else 0
                status.resumed(dict(sink.counts))
                watch.lap(restored.stage)
                worker_seconds, writer_seconds = restored.worker_seconds, restored.writer_seconds
            if carried is not None and log is not None:
                # the copied chunks fsynced as they are copied (and the page cache handed back)
                between = functools.partial(checkpoints.sync_soon, sink)
                carried_lines, copied = carry.copy_into(sink, carried, tallies, log, between)
                fingerprint.update(carried_lines.encode())
                report.reused, report.reused_bytes = carried.samples, copied
                status.resumed(dict(sink.counts))  # carried rows are stored rows for status
                checkpoints.sync_soon(sink)  # while the decoding finishes (0.05-0.08 s here)
                watch.lap("carry")
            annotate.prepare()  # while the decoders work: read the parent's snapshot
            hook("decode+write", 0, todo.total)  # in order: a decoded batch is written at once
            if earlier is not None:
                hook("decode+write", sum(sink.counts.values()), None)
            for result in results:
                interrupts.check()
                report.rejects.extend(result.rejects)
                enforce_limit(spec, report.rejects, report.inputs)
                sink.write(result)
                status.stored(result)
                tallies.add(result)
                if log is not None:
                    tallied = [block_json(b) for b in result.blocks]
                    log.add(result.task.split, tallied, carry.row_keys(result))
                    log.decoded(processed(result), result.seconds)
                lines = provenance.fingerprint_lines(result)
                fingerprint.update("".join(lines).encode())
                checkpoints.note(result, lines)
                if not cutter.finished:  # after the last result the build ends at once
                    checkpoints.maybe_write(sink)
                if checkpoints.due_for_trim():
                    memory.release_free_memory()
                worker_seconds += result.seconds
                hook("decode+write", processed(result), None)
                del result  # written: not held while the next is decoded (buildparts.decoded)
            watch.lap("decode_and_write")
            report.samples = dict(sink.counts)
            require_samples(spec, report.samples, report)
            report.created_at = reproducible.created_at(run.epoch)
            attrs = provenance.file_attrs(spec, version, fingerprint, report.created_at)
            attrs[fileformat.LAYOUT_ATTR] = record.to_json()
            # the counts the file holds, decode-time rejects and a recording's windows counted
            policy = {**plan.policy, "counts": dict(report.samples)}
            attrs[fileformat.SPLIT_POLICY_ATTR] = json.dumps(policy)
            if isinstance(earlier, Shards) and virtual:  # what check and the readers verify
                attrs[fileformat.PARTS_ATTR] = earlier.part_record()
            if carried is not None:
                facts = carry.facts(carried, report.reused_bytes, sum(report.samples.values()))
                attrs[fileformat.PARENT_ATTR] = json.dumps(facts)
            diagnostics = provenance.diagnostics(report, plan)
            diagnostics.update(tallies.diagnostics(record))
            report.conversions = tallies.conversions
            report.class_counts = tallies.class_counts(record)
            guard(spec, report, planned(planned_as or plan), annotate.before())
            memory.release_free_memory()
            report.datasets = sink.finish(
                attrs,
                diagnostics,
                tallies.dataset_attrs(record),
                rejects=stored_rejects(spec, report.rejects),
                annotate=annotate,
            )
            if gate is not None and gate.nothing_new(annotate.same_rows):
                raise uptodate.NothingNew
            report.change = annotate.line()
            report.chunk_paths = sink.chunk_paths
            checkpoints.drain()
    finally:
        checkpoints.close()
    watch.lap("finish")
    # How long things took is a build fact (build.json), not part of the reproducible file.
    report.seconds = {
        **watch.seconds,
        "workers_decode": round(worker_seconds, 4),
        "writer": round(writer_seconds + sink.seconds, 4),
    }
    report.raw_bytes = sum(d["raw_bytes"] for d in report.datasets.values())
    report.stored_bytes = sum(d["stored_bytes"] for d in report.datasets.values())
    return None if log is None else (attrs[fileformat.FINGERPRINT_ATTR], log)
