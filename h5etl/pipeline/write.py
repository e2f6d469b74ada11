"""write: one release written into a temp file — carried and resumed rows first, then the
decoded tasks in order, then the file's attributes, the loss guard and the sink's finish.

``pipeline.run`` decides what to write (resume, shards, carry, a second write after
decode-time rejects) and publishes it; this module only writes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from h5etl import timeline
from h5etl.config.spec import Spec
from h5etl.decode import memory
from h5etl.decode.recipe import DecodeRecipe
from h5etl.errors import ResumeMismatch
from h5etl.execute import assembly
from h5etl.execute.assembly import (
    LazyDecoder,
    Stopwatch,
    planned,
    processed,
    sink_layout,
)
from h5etl.format import contract as fileformat
from h5etl.history import clock, provenance
from h5etl.history.build_report import BuildReport, enforce_limit, guard, require_samples
from h5etl.history.release_notes import Annotator, stored_rejects
from h5etl.incremental import carry_record, reuse, uptodate
from h5etl.incremental.redo import Redo
from h5etl.pipeline import interrupts
from h5etl.pipeline.planning import ProgressHook
from h5etl.pipeline.status import BuildStatus
from h5etl.plan.result import Plan
from h5etl.plan.tasks import TaskCutter
from h5etl.release.folder import OutputFolder
from h5etl.resume import journal_use as resume
from h5etl.shards.committer import Sharding
from h5etl.shards.stitch import Shards
from h5etl.sink.writer import Sink
from h5etl.stats.tallies import Tallies, block_json


@dataclass(frozen=True, slots=True)
class BuildRun:
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


def write_release(
    run: BuildRun,
    plan: Plan,
    report: BuildReport,
    temp: Path,
    *,
    version: int,
    watch: Stopwatch,
    earlier: resume.Start | None,
    carried: reuse.CarryPlan | None = None,
    gate: uptodate.Gate | None = None,
    planned_as: Plan | None = None,
) -> tuple[str, carry_record.BlockLog] | None:
    """Write the release to ``temp``; return its fingerprint and block tallies (for its carry
    record), or None after a resume or a sharded build (their tallies are not per block).
    ``planned_as``: the plan the loss guard holds the counts against, when it is not ``plan``
    (the first plan, for the second write of a build whose decoding rejected samples)."""
    spec, hook, status = run.spec, run.hook, run.status
    recipe = assembly.recipe_of(plan)
    record = assembly.layout_record(spec, plan)
    state = earlier.queues if earlier is not None else None
    tallies = earlier.tallies() if earlier is not None else Tallies()
    todo = carried.decode if carried is not None and carried.decode is not None else plan
    try:
        cutter = assembly.cutter(spec, todo, state)
    except ValueError as exc:  # a journal of another h5etl: its tasks were cut otherwise
        raise ResumeMismatch(str(exc), path=temp) from exc
    redo, first = _redo_of(carried, cutter, recipe)
    checkpoints = resume.Checkpoints(
        OutputFolder.journal_of(temp), spec, todo, cutter, run.checkpoint_seconds, tallies
    )
    log = carry_record.BlockLog() if earlier is None else None
    fingerprint = hashlib.sha256()  # over key and file digests in write order: no list kept
    worker_seconds = writer_seconds = 0.0  # of other processes: the shards' workers and writers
    virtual = isinstance(earlier, Shards) and earlier.virtual
    linked = run.output.current_release()  # the parent, as for the splits
    annotate = Annotator(None if linked is None else linked[1])  # the change label
    created = threading.Event()
    # A first build decoding in local worker processes: they take the first tasks now, while
    # this process creates the file and reads the parent's snapshot (40 ms of 2.6 s at 3,000
    # pairs, the workers idle). Decoding in this process's threads waits for the file.
    at_once = carried is None and earlier is None and run.decoder.in_local_workers
    hook("decode+write", 0, todo.total + redo.left)  # opens as decoding starts; a decoded
    # batch is written at once
    settled = 0  # samples of ``todo`` stored or rejected so far
    try:
        with (
            # with chunks to copy first, the workers decode meanwhile (a thread pulls them),
            # from once the file exists, while the sink copies the parent's first rows or a
            # killed build's chunks (a resume after a kill at half time copied 1.7 s first)
            assembly.results(
                cutter,
                recipe,
                run.decoder,
                early=carried is not None or earlier is not None or at_once,
                start=None if at_once else created,
                before=first,
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
            timeline.mark("sink created")
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
                carried_lines, copied = reuse.copy_into(sink, carried, tallies, log, between)
                fingerprint.update(carried_lines.encode())
                report.reused, report.reused_bytes = carried.samples, copied
                report.redone = tuple(sorted(redo.fields))
                status.resumed(dict(sink.counts))  # carried rows are stored rows for status
                checkpoints.sync_soon(sink)  # while the decoding finishes (0.05-0.08 s here)
                watch.lap("carry")
            annotate.prepare()  # while the decoders work: read the parent's snapshot
            if earlier is not None:
                hook("decode+write", sum(sink.counts.values()), None)
            # the carried samples' fields made again come first, beside the copied columns
            redo.consume(results, sink, tallies, log, functools.partial(_redone, hook))
            for result in results:
                timeline.mark("result")
                interrupts.check()
                report.rejects.extend(result.rejects)
                enforce_limit(spec, report.rejects, report.inputs)
                sink.write(result)
                status.stored(result)
                tallies.add(result)
                if log is not None:
                    tallied = [block_json(b) for b in result.blocks]
                    log.add(result.task.split, tallied, carry_record.row_keys(result))
                    log.decoded(processed(result), result.seconds)
                lines = provenance.fingerprint_lines(result)
                fingerprint.update("".join(lines).encode())
                checkpoints.note(result, lines)
                settled += processed(result)
                # after the last result the build ends at once: no checkpoint (pulled ahead by
                # a thread, the cutter has seen results this loop has not written yet)
                if not (settled >= todo.total if at_once else cutter.finished):
                    checkpoints.maybe_write(sink)
                if checkpoints.due_for_trim():
                    memory.release_free_memory()
                worker_seconds += result.seconds
                hook("decode+write", processed(result), None)
                del result  # written: not held while the next is decoded (buildparts.decoded)
            watch.lap("decode_and_write")
            timeline.mark("last result written")
            report.samples = dict(sink.counts)
            require_samples(spec, report.samples, report)
            report.created_at = clock.created_at(run.epoch)
            attrs = provenance.file_attrs(spec, version, fingerprint, report.created_at)
            attrs[fileformat.LAYOUT_ATTR] = record.to_json()
            # the counts the file holds, decode-time rejects and a recording's windows counted
            policy = {**plan.policy, "counts": dict(report.samples)}
            attrs[fileformat.SPLIT_POLICY_ATTR] = json.dumps(policy)
            if isinstance(earlier, Shards) and virtual:  # what check and the readers verify
                attrs[fileformat.PARTS_ATTR] = earlier.part_record()
            if carried is not None:
                facts = reuse.facts(carried, report.reused_bytes, sum(report.samples.values()))
                attrs[fileformat.PARENT_ATTR] = json.dumps(facts)
            diagnostics = provenance.diagnostics(report, plan)
            diagnostics.update(tallies.diagnostics(record))
            report.conversions = tallies.conversions
            report.class_counts = tallies.class_counts(record)
            guard(spec, report, planned(planned_as or plan), annotate.before())
            memory.release_free_memory()
            timeline.mark("sink finish: start (attrs, guard done)")
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
            timeline.mark("sink finished")
            checkpoints.drain()
    finally:
        checkpoints.close()
    timeline.mark("sink closed")
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


def _redo_of(
    carried: reuse.CarryPlan | None, cutter: TaskCutter, recipe: DecodeRecipe
) -> tuple[Redo, tuple[TaskCutter, DecodeRecipe] | None]:
    """The fields made again for the carried samples (``Redo.none()``: none), and the tasks
    that make them, decoded before the others."""
    if carried is None or carried.redo is None:
        return Redo.none(), None
    redo = carried.redo
    return redo, (redo.cutter(cutter.block, cutter.sample_bytes), redo.recipe(recipe))


def _redone(hook: ProgressHook, samples: int) -> None:
    """A result of the fields made again was written (``Redo.consume``)."""
    interrupts.check()
    hook("decode+write", samples, None)
