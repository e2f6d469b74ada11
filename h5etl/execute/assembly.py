"""assembly: what a build is made of, derived from its spec and plan.

The decode recipe, the sink's layout, the layout record, the task cutter, the decoder (the
local pool or a Dask cluster) and the stage stopwatch: plain derivations the pipeline, the
sharded build and tests share.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from h5etl.config import scheduler_address
from h5etl.config.spec import Spec
from h5etl.dataflow import Barrier, BatchResult, DecodeTask
from h5etl.decode import worker_memory
from h5etl.decode.recipe import DecodeRecipe
from h5etl.execute import dask_cluster as cluster
from h5etl.execute import local_threads, schedule
from h5etl.execute.prefetch import Ahead
from h5etl.format import contract as fileformat
from h5etl.format.codec import ChunkLayout
from h5etl.kinds.columns import ArrayColumn, TextColumn
from h5etl.plan import tasks
from h5etl.plan.kind_registry import decode_order, layout_of, layout_records
from h5etl.plan.result import Plan
from h5etl.plan.user_code import with_transforms
from h5etl.sink.small_columns import SinkLayout

logger = logging.getLogger(__name__)


def recipe_of(plan: Plan) -> DecodeRecipe:
    """What workers decode with: the plan's kinds (bound to the inputs), in decode order."""
    return DecodeRecipe.of(plan.kinds, decode_order(plan.kinds), plan.probes, plan.transforms)


def layouts_of(spec: Spec) -> dict[str, ChunkLayout]:
    """How each array field is stored (shape, dtype, chunks, filters)."""
    return {name: layout_of(spec, name) for name in spec.image_fields}


def sink_layout(spec: Spec, plan: Plan) -> SinkLayout:
    """What the sink creates: every field's storage column, in the config's layout."""
    return SinkLayout(
        tuple(spec.splits),
        {
            **{name: column for kind in plan.kinds for name, column in kind.columns.items()},
            **{name: TextColumn() for name in fileformat.SAMPLE_KEYS},  # the sample keys
        },
        tuple(spec.sources),
        spec.layout,
        {split: len(samples) for split, samples in plan.splits.items()},
        page_size=spec.storage.page_size,
    )


@contextlib.contextmanager
def decoding(spec: Spec, jobs: int, scheduler: str | None = None) -> Iterator[schedule.Decoder]:
    """Where this build decodes: ``jobs`` local processes, or the Dask scheduler at
    ``scheduler`` (default: the config's ``decode.scheduler``), connected and checked."""
    with cluster.decoding(scheduler or spec.decode.scheduler, jobs, source_roots(spec)) as decoder:
        yield decoder


class LazyDecoder:
    """A ``schedule.Decoder`` that starts the local workers (or connects to the Dask cluster)
    on ``start`` or its first call, not before: a build that turns out up to date decodes
    nothing and pays no start-up, and a small increment may decode in this process's threads
    instead (``decode_here_if_cheap``, ``local_threads``). A context manager; the exit
    stops what it started."""

    def __init__(self, spec: Spec, jobs: int, scheduler: str | None = None):
        self.spec, self.jobs, self.scheduler = spec, jobs, scheduler
        self._stack = contextlib.ExitStack()
        self._decoder: schedule.Decoder | None = None
        self.refused: str | None = None  # why this build keeps each crash in a worker
        self.where = ""  # where it decodes, once started (the build facts' ``decoded_in``)
        self._threads = False  # decoding in this process's threads (``decode_here_if_cheap``)

    @property
    def address(self) -> str:
        return self.scheduler or self.spec.decode.scheduler

    def start(self) -> schedule.Decoder:
        """Start the workers now (they import the decode stack while this process works)."""
        if self._decoder is None:
            self._decoder = self._stack.enter_context(
                decoding(self.spec, self.jobs, self.scheduler)
            )
            local = self.address == scheduler_address.LOCAL
            self.where = ("workers" if self.jobs > 1 else "this process") if local else self.address
        return self._decoder

    def cheap_here(self, samples: int, rate: float | None) -> local_threads.Choice:
        """Whether ``samples`` at ``rate`` seconds each would decode here (``local_threads``)."""
        if self.jobs <= 1 or self.address != scheduler_address.LOCAL:
            return local_threads.Choice(False, "not a local pool")
        return local_threads.choose(samples, rate, self.refused)

    def decode_here_if_cheap(self, samples: int, rate: float | None) -> None:
        """Decode the ``samples`` left in threads of this process when that costs less than
        starting the workers (``local_threads``), else start them now; once started,
        nothing changes."""
        if self._decoder is not None or samples == 0:
            return  # started, or nothing to decode (every block carried): nothing to start
        choice = self.cheap_here(samples, rate)
        if not choice.here:
            self.start()
            return
        logger.info("decoding in this process (%d threads): %s", self.jobs, choice.why)
        self._decoder = local_threads.threads(self.jobs)
        self._threads = True
        self.where = f"this process ({self.jobs} threads)"

    @property
    def parallel(self) -> bool:
        """Whether decoding runs beside this process's writer (worker processes, threads
        here, a cluster)."""
        return self.jobs > 1 or self.address != scheduler_address.LOCAL

    @property
    def in_local_workers(self) -> bool:
        """Whether decoding runs in the local pool's worker processes: a sample that kills its
        decoder cannot take this process down with it, so the workers may start on the first
        tasks before this process has created its temp file. (A Dask build connects and
        checks its workers' sources first, in this process: not before the file.)"""
        local = self.address == scheduler_address.LOCAL
        return local and self.jobs > 1 and not self._threads

    def __call__(
        self, todo: Iterable[DecodeTask | Barrier], recipe: DecodeRecipe
    ) -> Iterator[BatchResult]:
        if isinstance(todo, tasks.TaskCutter) and todo.empty:
            return iter(())  # nothing to decode (every sample carried): no start-up to pay
        return self.start()(todo, recipe)

    def __enter__(self) -> LazyDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()


def source_roots(spec: Spec) -> list[str]:
    """The source folders, as the workers must see them."""
    return [str(source.dir) for source in spec.sources.values()]


def layout_record(spec: Spec, plan: Plan) -> fileformat.LayoutRecord:
    return fileformat.LayoutRecord(
        spec.layout,
        tuple(spec.splits),
        with_transforms(layout_records(plan.kinds), plan.transforms),
        samples=fileformat.SAMPLE_KEYS,
    )


def planned(plan: Plan) -> dict[str, int]:
    """Samples per split of a plan."""
    return {split: len(members) for split, members in plan.splits.items()}


def planned_classes(plan: Plan) -> dict[str, dict[str, dict[str, int]]]:
    """Samples per class, per split and label field, as planned: a label is a plan-side value
    (a class folder, a table row), so a dry run that decodes nothing knows every class."""
    side = [kind for kind in plan.kinds if kind.plan_side]
    out: dict[str, dict[str, dict[str, int]]] = {}
    for column, kind in enumerate(side):
        classes = kind.record().extra.get(fileformat.CLASSES_ATTR)
        if classes is None:
            continue
        for split, samples in plan.splits.items():
            counts = Counter(sample.extras[column] for sample in samples)
            out.setdefault(split, {})[kind.name] = {
                str(label): counts.get(i, 0) for i, label in enumerate(classes)
            }
    return out


def processed(result: BatchResult) -> int:
    """Samples a result settled (stored or rejected); deferred ones come again later."""
    return len(result.task.samples) - len(result.deferred)


def decoded(
    cutter: tasks.TaskCutter, recipe: DecodeRecipe, decoder: schedule.Decoder
) -> Iterator[BatchResult]:
    """Every task's result in order; the cutter learns each result before the next is cut."""
    for result in decoder(cutter, recipe):
        cutter.note(result)
        worker_memory.trim_when_gone(result)  # a CT case's chunks: give the heap back once written
        yield result
        # not held while the next result is awaited: a CT case's 100 MB would stay alive
        # beside the next one arriving
        del result


@contextlib.contextmanager
def results(
    cutter: tasks.TaskCutter,
    recipe: DecodeRecipe,
    decoder: LazyDecoder,
    *,
    early: bool,
    start: threading.Event | None = None,
    before: tuple[tasks.TaskCutter, DecodeRecipe] | None = None,
) -> Iterator[Iterator[BatchResult]]:
    """The decode results in order (``decoded``); ``early``: pulled by a thread
    (``h5etl.execute.prefetch``)
    once ``start`` is set, so the workers decode while this process works on (copies a
    parent's chunks). The build sets it once its temp file exists: a sample that kills this
    process's decoding threads must leave that file, or the next build would not know to
    decode in workers (``local_threads``). Decoding in this process (``--jobs 1``) is
    pulled as it is used. ``before``: tasks decoded first, with their own recipe (an
    incremental build's fields made again for the samples it carries)."""
    source = decoded(cutter, recipe, decoder)
    if before is not None:
        source = itertools.chain(decoded(*before, decoder), source)
    if not early or not decoder.parallel or (cutter.empty and before is None):
        yield source
        return
    with Ahead(source, start=start) as ahead:
        yield ahead


class Stopwatch:
    """Wall time per stage of a build (the build facts' ``seconds``)."""

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


def cutter(spec: Spec, plan: Plan, state: dict[str, dict[str, Any]] | None) -> tasks.TaskCutter:
    """The task cutter of a plan (from ``state``: a journal's or the shards' queues)."""
    sample_bytes = sum(kind.sample_nbytes for kind in plan.kinds)
    return tasks.TaskCutter(plan, block_of(plan), sample_bytes=sample_bytes, state=state)


def block_of(plan: Plan) -> int:
    """Samples per block: a whole chunk of every fixed array column, of every kind (their
    lcm), so a task's rows are whole chunks of each and the workers compress them all."""
    return math.lcm(
        *(
            column.layout.rows
            for kind in plan.kinds
            for column in kind.columns.values()
            if isinstance(column, ArrayColumn)
        )
    )
