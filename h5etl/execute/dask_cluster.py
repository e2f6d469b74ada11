"""dask_cluster: decode tasks on a Dask cluster (dask.distributed), results in task order.

The client (the build's process) keeps the task cutter and the single writer. Tasks go to the
scheduler through the same ordered, bounded window as the local pool (``schedule.in_order``:
at most ``2 * threads + 1`` not yet consumed) and come back as compressed whole chunks with
their digests. Workers read the sources by path: every worker must see them at the same
absolute path (a shared file system), as the build does (``sourceviews``: not an empty mount
point, not another copy); one that does not fails the build with one line naming it and the
folder, checked on every worker up front and by each worker on its first task (a worker that
joins later), before it decodes anything. Up front is twice: the source folders' first level as
soon as the cluster is reached (while the build plans), then a spread of the files the plan
will hand the workers, before the first task goes out (class folders there but empty). A
worker that dies mid-task: the scheduler reruns its tasks elsewhere
(``distributed.scheduler.allowed-failures`` times); a task that killed that many workers is
split sample by sample as locally, so a crash costs only the sample that causes it. The
scheduler lost mid-build is ``ClusterLost``: the build keeps its temp file and journal for
``--resume``.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import socket
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from h5etl._version import __version__
from h5etl.config import scheduler_address
from h5etl.config.scheduler_address import scheduler_problem
from h5etl.dataflow import Barrier, BatchResult, DecodeTask, Sample
from h5etl.decode import task as decode
from h5etl.decode.recipe import DecodeRecipe
from h5etl.errors import ClusterError, ClusterLost, SchedulerUnreachable, UsageError
from h5etl.execute import pool as workers
from h5etl.execute import schedule, sourceviews

EXTRA = "pip install 'h5etl[dask]'"
CONNECT_SECONDS = 10.0  # reaching the scheduler
WORKERS_SECONDS = 30.0  # for the first worker to join a scheduler that has none yet
Views = tuple[tuple[str, sourceviews.View], ...]
"""(source folder, the build's view of it): what every worker must see alike."""
_SEEN: set[tuple[str, sourceviews.View]] = set()  # in a worker: folders it saw as the build


@runtime_checkable
class Planned(Protocol):
    """Tasks that know their plan up front (``tasks.TaskCutter``): the samples they will hold."""

    def samples(self) -> Iterator[Sample]: ...


def planned_inputs(todo: Iterable[DecodeTask | Barrier]) -> Iterator[tuple[str, str]]:
    """Every input file the tasks ``todo`` will read, (source folder, relative path), in
    plan order; none from a one-shot iterator (it cannot be looked at before it is run)."""
    if isinstance(todo, Planned):
        samples: Iterable[Sample] = todo.samples()
    elif isinstance(todo, Sequence):
        samples = (s for task in todo if isinstance(task, DecodeTask) for s in task.samples)
    else:
        return
    for sample in samples:
        for (_, root), relpath in zip(sample.roots, sample.relpaths, strict=True):
            yield root, relpath


def _distributed() -> Any:
    """``dask.distributed``, imported on demand: it is an optional extra."""
    try:
        import distributed
    except ImportError as exc:
        raise ClusterError(f"decoding on a Dask cluster needs dask.distributed: {EXTRA}") from exc
    return distributed


def _where(dask_worker: Any = None) -> str:
    """This worker as a message names it: its address and its host."""
    if dask_worker is None:
        try:
            from distributed import get_worker

            dask_worker = get_worker()  # in a task
        except (ImportError, ValueError):
            return f"worker process {os.getpid()} on host {socket.gethostname()}"
    return f"worker {dask_worker.address} on host {socket.gethostname()}"


def _checked(views: Views, dask_worker: Any = None, *, again: bool = False) -> str | None:
    """A line saying how this worker sees a source folder otherwise than the build (``views``),
    or None. A folder this process saw alike is not looked at again on its next tasks;
    ``again``: look all the same (a long-lived worker's share may have gone since)."""
    for root, expected in views:
        if again:
            _SEEN.discard((root, expected))
        if (root, expected) in _SEEN:
            continue
        different = sourceviews.difference(root, expected)
        if different is not None:
            need = (
                "every worker must reach the object store with credentials of its own (its "
                "environment or the backend's config files: none are sent to it)"
                if sourceviews.is_url(root)
                else "every worker must see the same sources at the same path (a shared file "
                "system mounted alike on every host)"
            )
            return f"{_where(dask_worker)} {different}: {need}"
        _SEEN.add((root, expected))
    return None


def worker_facts(views: Views, dask_worker: Any = None) -> tuple[str, str, str | None]:
    """Run on every worker up front (``Client.run`` passes ``dask_worker``): where it is, its
    h5etl version, and how it sees a source folder otherwise than the build (or None)."""
    return _where(dask_worker), __version__, _checked(views, dask_worker, again=True)


def decode_on_worker(
    worker: schedule.Worker, task: DecodeTask, recipe: DecodeRecipe, views: Views
) -> BatchResult:
    """A decode task as a Dask worker runs it: the sources compared with the build's once per
    process (a worker that joined after the up-front check), then decoded.

    Raises:
        ClusterError: this worker sees a source folder otherwise (not a reject per file).
    """
    problem = _checked(views)
    if problem is not None:
        raise ClusterError(problem)
    return schedule.run_remote(worker, task, recipe)


class Cluster:
    """One build's connection to a Dask scheduler; a context manager.

    Parameters:
        address: the scheduler, ``tcp://host:8786``.
        roots: the source folders every worker must see as this process does.
    """

    def __init__(self, address: str, roots: Sequence[str], *, timeout: float | None = None):
        self.address = address
        self.roots = tuple(roots)
        self.timeout = CONNECT_SECONDS if timeout is None else timeout
        self.client: Any = None
        self.threads = 0
        self.views: Views = ()

    def __enter__(self) -> Cluster:
        problem = scheduler_problem(self.address)
        if problem is not None:  # distributed would wait 20 s to close the failed client
            raise UsageError(f"scheduler: {problem}")
        distributed = _distributed()
        try:
            self.client = distributed.Client(
                self.address, timeout=self.timeout, set_as_default=False
            )
        except (OSError, TimeoutError, ValueError) as exc:
            raise SchedulerUnreachable(
                f"cannot reach the Dask scheduler at {self.address} ({_one_line(exc)}); start "
                f"one with `dask scheduler` and give its address"
            ) from exc
        try:
            self._check_workers()
        except BaseException:
            self.client.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def _check_workers(self) -> None:
        try:
            self.client.wait_for_workers(1, timeout=WORKERS_SECONDS)
        except TimeoutError as exc:
            raise ClusterError(
                f"the Dask scheduler at {self.address} has no workers after "
                f"{WORKERS_SECONDS:.0f} s; start some with `dask worker {self.address}`"
            ) from exc
        except OSError as exc:  # it died while we waited
            raise self._lost(exc) from exc
        # the build's own view of its sources, before any worker is asked for its
        self.views = tuple((root, sourceviews.view_of(root)) for root in self.roots)
        self._ask_workers()
        self.threads = sum(self.client.nthreads().values())

    def _ask_workers(self) -> None:
        """Every worker runs ``worker_facts``: one that cannot (no h5etl there), runs another
        h5etl or sees the sources otherwise fails the build in one line naming it."""
        try:
            facts = self.client.run(worker_facts, self.views, on_error="return")
        except OSError as exc:
            raise self._lost(exc) from exc
        for address, got in sorted(facts.items()):
            if isinstance(got, BaseException):
                raise _cannot_run(got, address) from got
            where, version, problem = got
            if problem is not None:
                raise ClusterError(problem)
            if version != __version__:
                raise ClusterError(
                    f"{where} runs h5etl {version}, this build {__version__}: install the same "
                    f"h5etl on every worker ({_install()})"
                )

    def _check_inputs(self, todo: Iterable[DecodeTask | Barrier]) -> None:
        """Every worker must see a spread of the files ``todo`` will hand it as this process
        does (``sourceviews.planned``), on top of the first level checked on connecting: a
        share whose class folders were made again but hold nothing fails here, in one line."""
        files = sourceviews.planned(planned_inputs(todo))
        if not files:
            return
        roots = dict.fromkeys([*self.roots, *files])
        self.views = tuple((root, sourceviews.view_of(root, files.get(root, ()))) for root in roots)
        self._ask_workers()

    def run_tasks(
        self,
        tasks: Iterable[DecodeTask | Barrier],
        recipe: DecodeRecipe,
        *,
        window: int | None = None,
        worker: schedule.Worker = decode.decode_batch,
    ) -> Iterator[BatchResult]:
        """Decode tasks on the cluster; yield results in task order (a ``schedule.Decoder``)."""
        assert self.client is not None, "Cluster used outside its with-block"
        distributed = _distributed()
        killed = distributed.KilledWorker
        self._check_inputs(tasks)
        try:
            shared = self.client.scatter(recipe, broadcast=True, hash=False)
            # in a list: a tuple would be scattered item by item
            (views,) = self.client.scatter([self.views], broadcast=True, hash=False)
        except OSError as exc:
            raise self._lost(exc) from exc

        def submit(task: DecodeTask) -> Any:
            return self.client.submit(
                decode_on_worker,
                worker,
                task,
                shared,
                views,
                pure=False,
                key=f"h5etl-decode-{task.split}-{task.start}-{os.urandom(4).hex()}",
            )

        def run_alone(task: DecodeTask) -> BatchResult:
            got: BatchResult = self._collect(submit(task))
            return got

        def result(task: DecodeTask, future: Any) -> BatchResult:
            try:
                got: BatchResult = self._collect(future)
            except killed:
                got = schedule.isolate(task, recipe, run_alone, killed)
            got.task = task
            return got

        limit = window or 2 * max(1, self.threads) + 1
        try:
            yield from schedule.in_order(tasks, submit, result, limit)
        finally:
            with contextlib.suppress(Exception):  # a lost scheduler: the error above says so
                shared.release()
                views.release()

    def _collect(self, future: Any) -> Any:
        """A future's result; the cluster's own failures become one ``ClusterError`` line."""
        distributed = _distributed()
        try:
            return future.result()
        except (ClusterError, distributed.KilledWorker):
            raise
        except ImportError as exc:  # a worker that joined late without h5etl
            self._ask_workers()  # names it, while it is there
            raise _cannot_run(exc) from exc
        except (OSError, distributed.client.FutureCancelledError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> ClusterLost:
        reason = getattr(exc, "reason", None) or _one_line(exc)
        return ClusterLost(
            f"lost the Dask scheduler at {self.address} mid-build ({reason}); nothing was "
            "published"  # the release folder adds what --resume can do (ClusterLost.kept)
        )


@contextlib.contextmanager
def decoding(address: str, jobs: int, roots: Sequence[str]) -> Iterator[schedule.Decoder]:
    """A decoder for one build (or shard): ``jobs`` local processes when ``address`` is
    ``local``, else the Dask cluster of that scheduler, connected and checked."""
    if address == scheduler_address.LOCAL:
        workers.warm_up(jobs)
        yield schedule.local(jobs)
        return
    with Cluster(address, roots) as remote:
        yield remote.run_tasks


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _install() -> str:
    return f"pip install 'h5etl[dask]=={__version__}' with the extras your fields need"


# Client.run sends back a worker's error as Exception("ImportError('...')"): its text only
_WRAPPED = re.compile(r"^(\w+)\((.*)\)$", re.DOTALL)


def _unquoted(text: str) -> str:
    """A repr'd string without its quotes, and only those: "No module named 'h5etl'"
    keeps the quote that closes the module's name."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _cannot_run(exc: BaseException, address: str | None = None) -> ClusterError:
    """One line for a worker that cannot run h5etl's functions (``address``: which)."""
    kind, text = type(exc).__name__, _one_line(exc)
    wrapped = _WRAPPED.match(text) if kind == "Exception" else None
    if wrapped is not None:
        kind, text = wrapped[1], _unquoted(wrapped[2])
    who = f"the Dask worker {address}" if address else "a Dask worker"
    if issubclass(getattr(builtins, kind, Exception), ImportError):
        return ClusterError(
            f"{who} cannot run h5etl ({kind}: {text}): install h5etl {__version__} in that "
            f"worker's environment ({_install()}) and restart it"
        )
    return ClusterError(f"{who} cannot run h5etl's tasks ({kind}: {text})")
