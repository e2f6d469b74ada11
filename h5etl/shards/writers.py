"""writers: a sharded build's plan, its shard writers and their manifests.

The write order of each split is cut into decode tasks exactly as for one writer (the task
cutter); the first round's tasks of each split are dealt out in K contiguous runs, one per
shard. Each shard writer, a process of its own with its own decoder (local processes, or a
connection to the Dask cluster), decodes its tasks and writes them with a ``Sink`` as a shard
file of whole chunks, then commits it: the file fsynced, then a manifest renamed into place
(per task: what it stored, rejected and deferred; the SHA-256 of every chunk its workers
compressed). What the first round defers (spare reserves, samples past whole chunks) is the
tail: the committer cuts it from the manifests as the cutter would and writes it after the
shards, so the release is the one-writer build's, row for row.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from h5etl.config.spec import Spec
from h5etl.dataflow import BatchResult, DecodeTask, Reject
from h5etl.decode.recipe import DecodeRecipe
from h5etl.errors import H5EtlError, ShardError
from h5etl.execute import dask_cluster as cluster
from h5etl.execute import pool as workers
from h5etl.format import journal
from h5etl.format.contract import SHARD_ATTR, SHARD_INDEX_ATTR
from h5etl.history.build_report import enforce_limit
from h5etl.history.provenance import fingerprint_lines
from h5etl.plan.tasks import TaskCutter
from h5etl.release.durable import write_atomically
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink
from h5etl.stats.tallies import Tallies

FORMAT = 1
logger = logging.getLogger(__name__)


def deal(cutter: TaskCutter, count: int) -> list[list[DecodeTask]]:
    """The first round's tasks of every split, dealt to ``count`` shards in contiguous runs.

    ``cutter`` must be fresh and is used up: nothing is noted, so its later rounds are empty.
    A split's final task (a split small enough for one task) goes with its shard like any.
    """
    first: dict[str, list[DecodeTask]] = {}
    for item in cutter:
        if isinstance(item, DecodeTask):
            first.setdefault(item.split, []).append(item)
    dealt: list[list[DecodeTask]] = [[] for _ in range(count)]
    for tasks in first.values():
        for index in range(count):
            start, stop = index * len(tasks) // count, (index + 1) * len(tasks) // count
            dealt[index].extend(tasks[start:stop])
    return dealt


def identity(config_sha256: str, plan_sha256: str, geometry: Sequence[int], count: int) -> str:
    """What a committed shard must have been made for, to be reused: 12 hex digits."""
    text = json.dumps([FORMAT, config_sha256, plan_sha256, list(geometry), count])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class ShardJob:
    """Everything a shard writer process needs; pickled to it."""

    index: int
    ident: str
    path: Path  # the shard file, created with mode x
    manifest: Path
    spec: Spec  # for the reject limits
    layout: SinkLayout
    recipe: DecodeRecipe
    tasks: tuple[DecodeTask, ...]
    scheduler: str
    jobs: int
    roots: tuple[str, ...]
    planned_rejects: tuple[Reject, ...]  # the plan's, so a shard stops at max_rejects too
    inputs: int


def task_entry(result: BatchResult) -> dict[str, Any]:
    """One consumed task as a manifest records it (plain JSON)."""
    task = result.task
    return {
        "split": task.split,
        "start": task.start,
        "rows": result.accepted,
        "fingerprint": fingerprint_lines(result),
        "rejects": [reject.as_json() for reject in result.rejects],
        "deferred": [task.members[position] for position in result.deferred],
    }


def write_shard(
    job: ShardJob, cutter: TaskCutter | None = None, connected: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Decode the job's tasks, write them to its shard file, commit it; return the manifest.

    With ``cutter``, its tasks instead (the tail of a virtual release, cut as results come).
    ``connected`` is called once its decoder is up (connected to the cluster and checked).

    Raises:
        BuildFailed: its rejects pass ``on_error`` or ``max_rejects``.
        SinkError, ClusterError: as a build.
    """
    started = time.perf_counter()
    entries: list[dict[str, Any]] = []
    tallies = Tallies()
    rejects = list(job.planned_rejects)
    worker_seconds = 0.0
    with (
        cluster.decoding(job.scheduler, job.jobs, job.roots) as decoder,
        Sink(job.path, job.layout) as sink,
    ):
        connected()
        for result in decoder(job.tasks if cutter is None else cutter, job.recipe):
            if cutter is not None:
                cutter.note(result)
            rejects.extend(result.rejects)
            enforce_limit(job.spec, rejects, job.inputs)
            sink.write(result)
            tallies.add(result)
            entries.append(task_entry(result))
            worker_seconds += result.seconds
        sink.store_partial_chunks()  # a ragged column's last chunk: in the manifest like the others
        delta = sink.checkpoint()
        sink.finish({SHARD_ATTR: job.ident, SHARD_INDEX_ATTR: job.index}, {}, None)
    sink.sync()
    chunks: dict[str, list[list[Any]]] = {}
    for record in journal.unpack_chunks(delta["chunks"]):
        chunks.setdefault(record.dataset, []).append([list(record.offset), record.sha256])
    manifest = {
        "format": FORMAT,
        "shard": job.ident,
        "index": job.index,
        "rows": dict(sink.counts),
        "tasks": entries,
        "chunks": chunks,
        "tallies": tallies.snapshot(),
        "seconds": {
            "workers": round(worker_seconds, 4),
            "writer": round(sink.seconds, 4),
            "wall": round(time.perf_counter() - started, 4),
        },
    }
    write_atomically(job.manifest, json.dumps(manifest, ensure_ascii=False))
    return manifest


def _quiet_dask_logs() -> None:
    """A lost scheduler's reconnect tracebacks stay out of the terminal, as in the parent
    (``h5etl.cli``): the committer says what went wrong in one line. A root handler, as the
    parent has, keeps distributed from adding its own stderr handlers when it is imported;
    the ones it added already (imported by the fork server) are dropped."""
    logging.basicConfig(level=logging.WARNING, format="h5etl: %(message)s")
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in DASK_LOGGERS]
    for name in {*DASK_LOGGERS, *names}:
        logger = logging.getLogger(name)
        logger.handlers = [logging.NullHandler()]
        logger.propagate = False


DASK_LOGGERS = ("distributed", "tornado", "bokeh")


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the committer dies (no orphan writes on)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


CONNECTED = ("connected", "", "")  # a note before the outcome: this writer's decoder is up


def run_shard(job: ShardJob, outcome: Connection) -> None:
    """A shard writer process's entry: write the shard; send ``CONNECTED`` once its decoder
    is up, then ``("ok", "", "")`` or the error."""
    _die_with_parent()
    workers.limit_native_threads()
    _quiet_dask_logs()
    try:
        write_shard(job, connected=lambda: outcome.send(CONNECTED))
    except H5EtlError as exc:
        outcome.send((type(exc).__name__, exc.message, str(exc.path or "")))
    else:
        outcome.send(("ok", "", ""))
    finally:
        outcome.close()


def read_manifest(path: Path, ident: str) -> dict[str, Any] | None:
    """A committed shard's manifest, or None if it is not one of this build (or unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("shard") != ident:
        return None
    return data


def chunk_digests(manifest: Mapping[str, Any]) -> dict[str, dict[tuple[int, ...], str]]:
    """The SHA-256 of every chunk a shard's workers compressed, by dataset and offset."""
    return {
        path: {tuple(offset): sha for offset, sha in records}
        for path, records in manifest["chunks"].items()
    }


def check_manifest(
    manifest: Mapping[str, Any], tasks: Sequence[DecodeTask], keys: Mapping[str, Sequence[str]]
) -> None:
    """Every sample the plan gave a shard is stored, rejected or deferred, exactly once.

    ``keys`` holds each split's sample keys in write order (the plan's members).

    Raises:
        ShardError: the manifest is of other tasks, or loses or repeats a sample.
    """
    entries = manifest["tasks"]
    index = manifest["index"]
    given = [(t.split, t.start) for t in tasks]
    if [(e["split"], e["start"]) for e in entries] != given:
        raise ShardError(f"shard {index} holds other tasks than the plan gave it")
    for task, entry in zip(tasks, entries, strict=True):
        members = keys[task.split]
        stored = [line.split("\t", 1)[0] for line in entry["fingerprint"]]
        rejected = {r["key"] for r in entry["rejects"]}
        deferred = [members[i] for i in entry["deferred"]]
        seen = [*stored, *sorted(rejected), *deferred]
        planned = [members[i] for i in task.members]
        if sorted(seen) != sorted(planned) or len(stored) != entry["rows"]:
            missing = sorted(set(planned) - set(seen)) or sorted(set(seen) - set(planned))
            raise ShardError(
                f"shard {index}: task {task.split}@{task.start} does not account for each of its "
                f"{len(planned)} samples exactly once (e.g. {missing[:1] or 'a repeat'})"
            )
    rows: dict[str, int] = {}
    for entry in entries:
        rows[entry["split"]] = rows.get(entry["split"], 0) + entry["rows"]
    if any(manifest["rows"].get(split, 0) != count for split, count in rows.items()):
        raise ShardError(f"shard {index}: its row counts do not add up to its tasks'")
