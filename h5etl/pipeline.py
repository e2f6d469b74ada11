"""The build: wires discover -> clean -> decode -> sink -> release; no I/O of its own."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h5py

from h5etl import __version__, clean, decode, discover, journal, workers
from h5etl.chunkcodec import ChunkLayout
from h5etl.errors import BuildFailed
from h5etl.records import BatchResult, Reject, valid_text
from h5etl.release import OutputFolder
from h5etl.sink import ResumeMismatch, Sink, SinkLayout
from h5etl.spec import Spec, spec_sha256, spec_text

logger = logging.getLogger(__name__)

ProgressHook = Callable[[str, int, int | None], None]
"""``hook(stage, advance, total)``: ``advance=0`` opens the next stage (``total`` steps, or None
if unknown); stages come one after another: discover, probe, decode+write."""


@dataclass(slots=True)
class BuildReport:
    """What a build did; the CLI renders it, tests assert on it."""

    name: str
    inputs: int
    samples: dict[str, int]
    rejects: list[Reject]
    seconds: dict[str, float]
    version: int | None = None
    path: Path | None = None
    link: Path | None = None
    rejects_path: Path | None = None
    raw_bytes: int = 0
    stored_bytes: int = 0
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    chunk_paths: dict[str, int] = field(default_factory=dict)
    resumed: int = 0  # samples copied from a killed build instead of decoded again

    @property
    def reject_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.reason for r in self.rejects).items()))


def layouts_of(spec: Spec) -> dict[str, ChunkLayout]:
    layouts = {}
    for name in spec.image_fields:
        field_spec = spec.fields[name]
        assert field_spec.shape is not None
        layouts[name] = ChunkLayout(
            field_spec.shape,
            field_spec.dtype,
            spec.chunks_of(name),
            spec.compression_of(name),
            spec.shuffle_of(name),
        )
    return layouts


def _reject_limit(spec: Spec, inputs: int) -> int | None:
    if spec.on_error == "fail":
        return 0
    if spec.max_rejects is None:
        return None
    if isinstance(spec.max_rejects, float):
        return int(spec.max_rejects * inputs)
    return spec.max_rejects


def _enforce_limit(spec: Spec, rejects: list[Reject], inputs: int) -> None:
    limit = _reject_limit(spec, inputs)
    if limit is None or len(rejects) <= limit:
        return
    if spec.on_error == "fail":
        first = rejects[0]
        raise BuildFailed(
            f"{first.reason}: {first.detail} (on_error: fail; no release was made)",
            path=first.path,
        )
    tally = ", ".join(
        f"{reason} {count}" for reason, count in Counter(r.reason for r in rejects).items()
    )
    raise BuildFailed(
        f"{len(rejects)} of {inputs} inputs rejected, over max_rejects {spec.max_rejects} "
        f"({tally}); no release was made, see the reasons with --dry-run",
        path=spec.output,
    )


class _Stopwatch:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self._mark = self._start

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + now - self._mark, 4)
        self._mark = now

    def total(self) -> float:
        return round(time.perf_counter() - self._start, 4)


@dataclass(frozen=True, slots=True)
class _Resume:
    state: journal.ResumeState
    partial: Path


def build(
    spec: Spec,
    *,
    jobs: int = 1,
    dry_run: bool = False,
    resume: bool = False,
    progress: ProgressHook | None = None,
    checkpoint_seconds: float = 2.0,
) -> BuildReport:
    """Build one release from ``spec``; with ``dry_run``, stop after planning.

    With ``resume``, a build that was killed part-way is continued from its journal: the chunks
    it stored are copied (verified) and only the rest is decoded. Without it, leftovers of dead
    builds are removed and the build starts clean.

    Raises:
        BuildFailed: rejects under ``on_error: fail`` or past ``max_rejects``.
        LockHeld: another build of the same name is writing to the same folder.
        SinkError, ReleaseError: the file could not be written or published.
    """
    hook = progress or (lambda stage, advance, total: None)
    output = OutputFolder(spec.output, spec.name)
    if dry_run:
        return _plan_only(spec, hook, jobs)[0]
    with output.locked():
        workers.warm_up(jobs)
        previous = output.resumables() if resume else []
        if not previous:
            output.remove_stale_partials()
        report, plan, watch = _plan_only(spec, hook, jobs)
        _enforce_limit(spec, report.rejects, report.inputs)
        version = output.next_version()
        earlier = _usable_resume(previous, spec, plan)
        planned_rejects = list(report.rejects)
        while True:
            report.rejects = list(planned_rejects)
            try:
                with output.staged() as temp:
                    _write(
                        spec,
                        plan,
                        report,
                        temp,
                        jobs=jobs,
                        hook=hook,
                        version=version,
                        watch=watch,
                        resume=earlier,
                        checkpoint_seconds=checkpoint_seconds,
                        output=output,
                    )
                    info = output.publish(temp, report.rejects, version=version)
                break
            except ResumeMismatch as exc:
                if earlier is None:
                    raise
                logger.warning("cannot resume (%s); building from the start", exc)
                earlier = None
                report.resumed = 0
        output.remove_stale_partials()
        watch.lap("publish")
    report.seconds = {**watch.seconds, "total": watch.total()}
    report.version, report.path, report.link = info.version, info.path, output.link
    report.rejects_path = info.rejects
    return report


def _usable_resume(
    candidates: list[tuple[Path, Path]], spec: Spec, plan: clean.Plan
) -> _Resume | None:
    """The newest killed build whose journal holds a checkpoint of this config and plan.

    A build killed again before its first checkpoint leaves a journal with nothing in it
    beside an older one that still holds its work; a build of another config may have been
    killed after one of this config.
    """
    if not candidates:
        logger.info("nothing to resume; building from the start")
        return None
    changed = False
    for partial, journal_path in candidates:
        state = journal.read(journal_path)
        if state is None or (not state.chunks and not state.samples):
            logger.info("the journal %s holds no checkpoint", journal_path)
            continue
        if state.config_sha256 != spec_sha256(spec) or state.plan_sha256 != plan.fingerprint():
            logger.info("the journal %s is of another config or other inputs", journal_path)
            changed = True
            continue
        return _Resume(state, partial)
    if changed:
        logger.warning(
            "the config or the inputs changed since the killed build; building from the start"
        )
    else:
        logger.warning("no journal of a killed build holds a checkpoint; building from the start")
    return None


def _plan_only(
    spec: Spec, hook: ProgressHook, jobs: int
) -> tuple[BuildReport, clean.Plan, _Stopwatch]:
    watch = _Stopwatch()
    hook("discover", 0, None)
    found = discover.find_samples(spec, lambda n: hook("discover", n, None))
    watch.lap("discover")
    hook("probe", 0, len(found.samples))
    plan = clean.plan(
        spec,
        found.samples,
        lambda n: hook("probe", n, None),
        mapper=lambda fn, batches: decode.map_in_workers(fn, batches, jobs=jobs),
    )
    watch.lap("clean")
    samples = {split: len(members) for split, members in plan.splits.items()}
    report = BuildReport(
        spec.name, found.files_seen, samples, [*found.rejects, *plan.rejects], dict(watch.seconds)
    )
    return report, plan, watch


class _Checkpoints:
    """Feeds the resume journal: what the sink stored durably, plus the pipeline's own state.

    The fsync that makes a checkpoint durable runs in a thread beside the writer (it can take
    a while on a slow disk and must not stall the workers); the journal line is appended only
    after it. ``every=0`` checkpoints after each batch, synchronously (for tests).
    """

    def __init__(self, path: Path, spec: Spec, plan: clean.Plan, every: float):
        self.writer = journal.JournalWriter(
            path, config_sha256=spec_sha256(spec), plan_sha256=plan.fingerprint()
        )
        self.every = every
        self.last = time.monotonic()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="h5etl-fsync")
        self._pending: Future[None] | None = None
        self._trimmed = time.monotonic()
        self.consumed: dict[str, int] = {}
        self.rejected: Counter[str] = Counter()
        self.fingerprint: list[str] = []
        self.rejects: list[Reject] = []

    def seed(self, state: journal.ResumeState, sink: Sink) -> None:
        """Carry a resumed build's state into this journal, and record it at once.

        This journal replaces the old one, so it must hold everything copied from it (the
        sink keeps the copied chunks and rows unjournaled): a build killed again and resumed
        again then finds the whole prefix here.
        """
        self.consumed.update(state.consumed)
        self.rejected.update(state.decode_rejected)
        self.fingerprint = list(state.fingerprint)
        self.rejects = [Reject(**r) for r in state.rejects]
        self.write_now(sink)

    def note(self, result: BatchResult, lines: list[str]) -> None:
        task = result.task
        self.consumed[task.split] = task.start + len(task.samples)
        self.rejected[task.split] += len(task.samples) - result.accepted
        self.fingerprint.extend(lines)
        self.rejects.extend(result.rejects)

    def maybe_write(self, sink: Sink) -> None:
        if time.monotonic() - self.last < self.every or not sink.consistent:
            return
        if self._pending is not None:
            if not self._pending.done():
                return  # the previous fsync is still running; checkpoint later
            self._pending.result()  # re-raise a failed fsync here, in the build
        delta = self._delta(sink)
        if self.every == 0:
            self._commit(sink, delta)
        else:
            self._pending = self._thread.submit(self._commit, sink, delta)

    def write_now(self, sink: Sink) -> None:
        """A checkpoint now, in this thread (the sink must be consistent)."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        self._commit(sink, self._delta(sink))

    def _delta(self, sink: Sink) -> dict[str, Any]:
        delta = sink.checkpoint()
        delta.update(
            consumed=dict(self.consumed),
            decode_rejected=dict(self.rejected),
            fingerprint=self.fingerprint,
            rejects=[r.as_json() for r in self.rejects],
        )
        self.fingerprint, self.rejects = [], []
        self.last = time.monotonic()
        return delta

    def due_for_trim(self) -> bool:
        """True about once a second: when to hand freed batch buffers back to the OS."""
        now = time.monotonic()
        if now - self._trimmed < 1.0:
            return False
        self._trimmed = now
        return True

    def _commit(self, sink: Sink, delta: dict[str, Any]) -> None:
        sink.sync()
        self.writer.checkpoint(delta)

    def drain(self) -> None:
        """Wait for the checkpoint in flight: a failed fsync of the file fails the build."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.writer.close()


def _write(
    spec: Spec,
    plan: clean.Plan,
    report: BuildReport,
    temp: Path,
    *,
    jobs: int,
    hook: ProgressHook,
    version: int,
    watch: _Stopwatch,
    resume: _Resume | None,
    checkpoint_seconds: float,
    output: OutputFolder,
) -> None:
    layouts = layouts_of(spec)
    sink_layout = SinkLayout(
        tuple(spec.splits),
        layouts,
        tuple(spec.text_fields),
        tuple(spec.sources),
        spec.batch_samples,
    )
    recipe = decode.DecodeRecipe.from_spec(spec, layouts)
    checkpoints = _Checkpoints(OutputFolder.journal_of(temp), spec, plan, checkpoint_seconds)
    fingerprint = hashlib.sha256()  # over key and file digests in write order: no list kept
    worker_seconds = 0.0
    try:
        with Sink(temp, sink_layout) as sink:
            if resume is not None:
                sink.restore(resume.state, resume.partial)
                checkpoints.seed(resume.state, sink)
                # This build's journal now holds everything the killed builds' files did.
                output.remove_stale_partials(keep={temp, OutputFolder.journal_of(temp)})
                fingerprint.update("".join(resume.state.fingerprint).encode())
                report.rejects.extend(Reject(**r) for r in resume.state.rejects)
                report.resumed = resume.state.samples
                watch.lap("resume_copy")
            cutter = clean.TaskCutter(
                plan,
                spec.batch_samples,
                consumed=checkpoints.consumed,
                rejected=dict(checkpoints.rejected),
            )
            hook("decode+write", 0, plan.total)  # in order: a decoded batch is written at once
            if resume is not None:
                hook("decode+write", sum(checkpoints.consumed.values()), None)
            split = ""
            for result in decode.run_tasks(cutter, recipe, jobs=jobs):
                cutter.note_rejects(result.task.split, len(result.task.samples) - result.accepted)
                report.rejects.extend(result.rejects)
                _enforce_limit(spec, report.rejects, report.inputs)
                if result.task.split != split:
                    # Writing the first batch of a split finishes the previous one: its last
                    # partial chunk is padded and compressed here, the parent's largest
                    # allocation. On a trimmed heap it reuses freed pages.
                    split = result.task.split
                    decode.release_free_memory()
                sink.write(result)
                lines = _fingerprint_lines(result)
                fingerprint.update("".join(lines).encode())
                checkpoints.note(result, lines)
                checkpoints.maybe_write(sink)
                if checkpoints.due_for_trim():
                    decode.release_free_memory()
                worker_seconds += result.seconds
                hook("decode+write", len(result.task.samples), None)
            watch.lap("decode_and_write")
            report.samples = dict(sink.counts)
            attrs = _file_attrs(spec, version, fingerprint)
            diagnostics = _diagnostics(report, watch, worker_seconds, sink.seconds, plan)
            decode.release_free_memory()
            report.datasets = sink.finish(attrs, diagnostics)
            report.chunk_paths = sink.chunk_paths
            checkpoints.drain()
    finally:
        checkpoints.close()
    watch.lap("finish")
    report.raw_bytes = sum(d["raw_bytes"] for d in report.datasets.values())
    report.stored_bytes = sum(d["stored_bytes"] for d in report.datasets.values())


def _fingerprint_lines(result: BatchResult) -> list[str]:
    """``key<TAB>sha256,sha256<LF>`` per accepted sample."""
    return [
        f"{key}\t{','.join(hashes)}\n"
        for key, hashes in zip(result.keys, result.lineage, strict=True)
    ]


def _file_attrs(spec: Spec, version: int, fingerprint: hashlib._Hash) -> dict[str, Any]:
    source_fingerprint = fingerprint.hexdigest()
    return {
        **spec.attrs,
        "name": spec.name,
        "version": version,
        "description": spec.description,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "config": spec_text(spec),
        "config_sha256": spec_sha256(spec),
        "h5etl_version": __version__,
        "h5py_version": h5py.version.version,
        "hdf5_version": h5py.version.hdf5_version,
        "source_fingerprint": source_fingerprint,
    }


def _diagnostics(
    report: BuildReport,
    watch: _Stopwatch,
    worker_seconds: float,
    write_seconds: float,
    plan: clean.Plan,
) -> dict[str, Any]:
    out: dict[str, Any] = {f"seconds_{stage}": value for stage, value in watch.seconds.items()}
    out["seconds_workers_decode"] = round(worker_seconds, 4)
    out["seconds_writer"] = round(write_seconds, 4)
    out["inputs"] = report.inputs
    out["rejects_total"] = len(report.rejects)
    for reason, count in report.reject_counts.items():
        out[f"rejects_{reason}"] = count
    for split, count in report.samples.items():
        out[f"samples_{split}"] = count
    out["renamed_keys"] = [f"{valid_text(old)} -> {new}" for old, new in plan.renamed]
    return out
