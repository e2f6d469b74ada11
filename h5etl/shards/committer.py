"""committer: a build written by K shard writers in parallel and published by one committer.

The committer (the build's process) plans, deals the first round's tasks to K shard writer
processes (``h5etl.shards.writers``), waits for their commits, checks each manifest against the plan
(every sample given stored, rejected or deferred exactly once), then hands the build a
``Shards`` start (``h5etl.shards.stitch``): the stitch carries every shard's compressed chunks into
the release file in write order (no recompression, each chunk's SHA-256 checked), and the build
goes on as after a resume: it decodes and writes the tail (what the first round deferred)
and finishes the file. A killed build's committed shards are reused by ``--resume``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from h5etl import errors
from h5etl.config.spec import Spec, spec_sha256
from h5etl.dataflow import DecodeTask, Reject
from h5etl.decode.recipe import DecodeRecipe
from h5etl.errors import ClusterLost, H5EtlError, SchedulerUnreachable, ShardError, UsageError
from h5etl.execute import assembly
from h5etl.execute import pool as workers
from h5etl.history.build_report import BuildReport
from h5etl.kinds.columns import ArrayColumn, RaggedColumn, ScalarColumn, TextColumn
from h5etl.plan.result import Plan
from h5etl.plan.tasks import TaskCutter
from h5etl.release.folder import OutputFolder
from h5etl.release.naming import part_filename
from h5etl.shards import writers as shards
from h5etl.shards.stitch import Shards
from h5etl.sink.small_columns import SinkLayout

logger = logging.getLogger(__name__)
SHARD_WRITER = shards.run_shard  # the shard processes' entry (a test slows one down here)
ATTEMPTS = 2  # a shard writer that dies is started once more; dying twice fails the build


@dataclass(frozen=True, slots=True)
class Sharding:
    """How to shard a build: ``count`` writers, decoding on ``scheduler`` with ``jobs`` local
    processes each; ``reuse``: keep the committed shards of a killed build (``--resume``)."""

    count: int
    jobs: int
    scheduler: str
    roots: tuple[str, ...]
    reuse: bool = False
    virtual: bool = False  # publish a virtual-dataset release over the shard files


def write_shards(
    spec: Spec,
    plan: Plan,
    output: OutputFolder,
    *,
    layout: SinkLayout,
    recipe: DecodeRecipe,
    cutter: TaskCutter,
    sharding: Sharding,
    planned_rejects: Sequence[Reject],
    inputs: int,
    advance: Callable[[int], None] = lambda shards_done: None,
) -> Shards:
    """Run the shard writers (reusing committed shards when asked); return their commits.

    ``cutter`` is a fresh task cutter of the plan; it is used up dealing the tasks.

    Raises:
        ShardError: a shard writer died twice, or a shard does not account for its samples.
        BuildFailed, ClusterError, SinkError: as the shard writer raised them.
    """
    _check_columns(spec, layout, virtual=sharding.virtual)
    geometry = cutter.geometry
    ident = shards.identity(spec_sha256(spec), plan.fingerprint(), geometry, sharding.count)
    dealt = shards.deal(cutter, sharding.count)

    def make_job(index: int, tasks: Sequence[DecodeTask], jobs: int) -> shards.ShardJob:
        path = output.shard_path(ident, index)
        return shards.ShardJob(
            index,
            ident,
            path,
            OutputFolder.manifest_of(path),
            spec,
            layout,
            recipe,
            tuple(tasks),
            sharding.scheduler,
            jobs,
            sharding.roots,
            tuple(planned_rejects),
            inputs,
        )

    jobs = [
        make_job(i, part, max(1, sharding.jobs // sharding.count)) for i, part in enumerate(dealt)
    ]
    committed = _committed(jobs) if sharding.reuse else {}
    advance(len(committed))
    left = [job for job in jobs if job.index not in committed]
    try:
        ran = _run(left, advance)
    except ClusterLost as exc:
        # what --resume reuses: the committed shards that decoded something
        exc.kept(any(manifest["tasks"] for manifest in _committed(jobs).values()))
        raise
    manifests = {**committed, **ran}
    keys = {split: [sample.key for sample in members] for split, members in plan.splits.items()}
    for job in jobs:
        shards.check_manifest(manifests[job.index], job.tasks, keys)
    return Shards(
        [(job.path, manifests[job.index]) for job in jobs],
        tuple(plan.splits),
        geometry,
        {split: len(members) for split, members in plan.splits.items()},
        ident,
        reused=len(committed),
        tail_job=make_job(sharding.count, (), sharding.jobs) if sharding.virtual else None,
    )


def _check_columns(spec: Spec, layout: SinkLayout, *, virtual: bool) -> None:
    """Refuse, up front, a column the stitch cannot carry (one kind added after it), and a
    ragged column in a virtual release (docs/how-to/dask.md, docs/reference/file-format.md)."""
    carried = (ArrayColumn, ScalarColumn, TextColumn, RaggedColumn)
    for name, column in layout.columns.items():
        if not isinstance(column, carried):
            raise UsageError(
                f"--shards: field {name!r} is stored as a {type(column).__name__}, which a "
                f"sharded build does not carry; build it without --shards",
                path=spec.config_file,
            )
        if virtual and isinstance(column, RaggedColumn):
            raise UsageError(
                f"--vds: column {name!r} is ragged: its values run on across the parts "
                f"mid-chunk, so a virtual release could not keep their chunk digests; "
                f"build it with --shards and without --vds",
                path=spec.config_file,
            )


def _committed(jobs: Sequence[shards.ShardJob]) -> dict[int, dict[str, Any]]:
    """The manifests of the shards a killed build of the same plan committed, by index."""
    committed = {}
    for job in jobs:
        manifest = shards.read_manifest(job.manifest, job.ident)
        if manifest is not None and job.path.is_file():
            committed[job.index] = manifest
    logger.info("reusing %d committed shards of %d", len(committed), len(jobs))
    return committed


def start_sharded(
    spec: Spec,
    plan: Plan,
    output: OutputFolder,
    sharding: Sharding,
    layout: SinkLayout,
    recipe: DecodeRecipe,
    version: int,
    report: BuildReport,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> Shards:
    """Write (or reuse) the shards of a build, and for a virtual release its tail too: where
    the build goes on from (a ``resume.Start``)."""
    done = write_shards(
        spec,
        plan,
        output,
        layout=layout,
        recipe=recipe,
        cutter=assembly.cutter(spec, plan, None),
        sharding=sharding,
        planned_rejects=report.rejects,
        inputs=report.inputs,
        advance=(lambda n: progress("shards", n, None)) if progress else (lambda n: None),
    )
    report.shards, report.shards_reused, report.virtual = (
        sharding.count,
        done.reused,
        sharding.virtual,
    )
    if sharding.virtual:
        write_tail(done, assembly.cutter(spec, plan, done.queues), version=version, name=spec.name)
    return done


def write_tail(shards_done: Shards, cutter: TaskCutter, *, version: int, name: str) -> None:
    """For a virtual release: write the tail (cut from ``shards_done.queues`` by ``cutter``)
    as one more part in this process, and name the parts as ``version`` will publish them."""
    job = shards_done.tail_job
    assert job is not None, "the tail of a build that is not virtual"
    job.path.unlink(missing_ok=True)  # a killed build's tail: written anew
    manifest = shards.write_shard(job, cutter)
    shards_done.tail = (job.path, manifest)
    shards_done._queues = {
        split: {
            "consumed": queue.consumed,
            "deferred": list(queue.deferred),
            "rounds": list(queue.rounds),
            "cut": cutter.geometry,
        }
        for split, queue in cutter.queues.items()
    }
    count = len(shards_done.parts)
    shards_done.part_names = [part_filename(name, version, index) for index in range(count)]


def _context() -> Any:
    """Where shard writers start: a fork server that has imported the writer once (a fresh
    interpreter per writer costs about a second of imports), never a fork of this process,
    whose threads (a Dask client's, the fsync thread) a fork would copy mid-step."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return workers.fork_server(("h5etl.shards.writers",))
    return multiprocessing.get_context("spawn")


def _start(job: shards.ShardJob) -> tuple[BaseProcess, Connection]:
    for leftover in (job.path, job.manifest):
        leftover.unlink(missing_ok=True)  # a dead writer's file: the sink creates with mode x
    context = _context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=SHARD_WRITER, args=(job, send), name=f"h5etl-shard-{job.index}"
    )
    process.start()
    send.close()
    return process, receive


def _receive(receive: Connection) -> tuple[str, str, str] | None:
    """A shard writer's next message (``CONNECTED`` or its outcome), or None if it died."""
    try:
        got: tuple[str, str, str] = receive.recv()
    except EOFError:
        return None
    return got


def _ended(process: BaseProcess, receive: Connection, got: tuple[str, str, str] | None) -> bool:
    """Wait for a shard writer that sent its outcome ``got`` (None: it sent none); whether it
    ended well enough to take that outcome."""
    process.join()
    receive.close()
    return got is not None and process.exitcode == 0


def _started_again(
    job: shards.ShardJob, died: BaseProcess, attempt: int
) -> tuple[shards.ShardJob, BaseProcess, Connection, int]:
    """A shard writer that died, started once more (its ``running`` entry).

    Raises:
        ShardError: it has died ``ATTEMPTS`` times.
    """
    if attempt >= ATTEMPTS:
        raise ShardError(
            f"shard writer {job.index} died {attempt} times (exit code {died.exitcode}); "
            "nothing was published"
        )
    logger.warning(
        "shard writer %d died (exit code %s); starting it again", job.index, died.exitcode
    )
    return (job, *_start(job), attempt + 1)


def _run(
    jobs: Sequence[shards.ShardJob], advance: Callable[[int], None]
) -> dict[int, dict[str, Any]]:
    """Run shard writers side by side; restart one that dies, once; return their manifests.

    Outcomes are taken as they come, not in shard order: the first shard to fail stops the
    others at once. A shard that cannot connect to the scheduler after another one's decoder
    came up has lost it mid-build (it was connecting when the scheduler died).
    """
    running = {job.index: (job, *_start(job), 1) for job in jobs}
    manifests: dict[int, dict[str, Any]] = {}
    reached = False
    try:
        while running:
            ready = multiprocessing.connection.wait([entry[2] for entry in running.values()])
            ended: list[tuple[int, tuple[str, str, str] | None]] = []
            for index in sorted(i for i, entry in running.items() if entry[2] in ready):
                got = _receive(running[index][2])
                if got == shards.CONNECTED:
                    reached = True  # noted before any outcome that came with it is judged
                else:
                    ended.append((index, got))
            for index, got in ended:
                job, process, receive, attempt = running.pop(index)
                if not _ended(process, receive, got):
                    running[index] = _started_again(job, process, attempt)
                    continue
                assert got is not None
                if got[0] == SchedulerUnreachable.__name__ and reached:
                    raise ClusterLost(
                        f"lost the Dask scheduler at {job.scheduler} mid-build (shard writer "
                        f"{index} could not connect after another had); nothing was published"
                    )
                _raise_failed(got)
                manifest = shards.read_manifest(job.manifest, job.ident)
                if manifest is None:
                    raise ShardError(f"shard {index} has no readable manifest", path=job.manifest)
                manifests[index] = manifest
                advance(1)
    finally:
        for _, process, receive, _ in running.values():
            process.kill()  # our own shard writers, on the way out after an error
            process.join()
            receive.close()
    return manifests


def _raise_failed(outcome: tuple[str, str, str]) -> None:
    """Raise, in the committer, the error a shard writer stopped with."""
    kind, message, path = outcome
    if kind == "ok":
        return
    error = getattr(errors, kind, None)
    if not (isinstance(error, type) and issubclass(error, H5EtlError)):
        error = ShardError
    try:
        failed = error(message, path=path or None)
    except TypeError:  # an error class made otherwise (none a writer raises today)
        failed = ShardError(message, path=path or None)
    raise failed
