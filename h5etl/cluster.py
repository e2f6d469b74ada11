"""cluster: decode tasks on a Dask cluster (dask.distributed), results in task order.

The client (the build's process) keeps the task cutter and the single writer. Tasks go to the
scheduler through the same ordered, bounded window as the local pool (``schedule.in_order``:
at most ``2 * threads + 1`` not yet consumed) and come back as compressed whole chunks with
their digests. Workers read the sources by path: every worker must see them at the same
absolute path (a shared file system); one that cannot fails the build with one line naming
its host and the path, checked on every worker up front and again by each worker on its first
task (a worker that joins later). A worker that dies mid-task: the scheduler reruns its tasks
elsewhere (``distributed.scheduler.allowed-failures`` times); a task that killed that many
workers is split sample by sample as locally, so a crash costs only the sample that causes it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

from h5etl import __version__, decode, schedule, workers
from h5etl.errors import ClusterError
from h5etl.records import Barrier, BatchResult, DecodeTask, Roots

LOCAL = "local"
EXTRA = "pip install 'h5etl[dask]'"
CONNECT_SECONDS = 10.0  # reaching the scheduler
WORKERS_SECONDS = 30.0  # for the first worker to join a scheduler that has none yet
_SEEN: set[str] = set()  # in a worker process: source folders it has already found


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


def visible(folder: str) -> bool:
    """Whether this process sees ``folder`` (a test hides one from a worker here)."""
    return os.path.isdir(folder)


def unseen_source(roots: Sequence[str]) -> str | None:
    """The first of ``roots`` (source folders) this process cannot see, or None."""
    for root in roots:
        if root in _SEEN:
            continue
        if not visible(root):
            return root
        _SEEN.add(root)
    return None


def _not_shared(root: str, dask_worker: Any = None) -> str:
    return (
        f"{_where(dask_worker)} cannot see the source folder {root}: every worker must see "
        f"the sources at the same path (a shared file system mounted alike on every host)"
    )


def worker_facts(roots: Sequence[str], dask_worker: Any = None) -> tuple[str, str, str | None]:
    """Run on every worker up front (``Client.run`` passes ``dask_worker``): where it is, its
    h5etl version, and a source folder it cannot see."""
    missing = unseen_source(roots)
    problem = None if missing is None else _not_shared(missing, dask_worker)
    return _where(dask_worker), __version__, problem


def decode_on_worker(
    worker: schedule.Worker, task: DecodeTask, recipe: decode.DecodeRecipe
) -> BatchResult:
    """A decode task as a Dask worker runs it: sources checked once per process, then decoded.

    Raises:
        ClusterError: this worker cannot see a source folder (not a reject per file).
    """
    roots: Roots = task.samples[0].roots if task.samples else ()
    missing = unseen_source([root for _, root in roots])
    if missing is not None:
        raise ClusterError(_not_shared(missing))
    return schedule.run_remote(worker, task, recipe)


class Cluster:
    """One build's connection to a Dask scheduler; a context manager.

    Parameters:
        address: the scheduler, ``tcp://host:8786``.
        roots: the source folders every worker must see.
    """

    def __init__(self, address: str, roots: Sequence[str], *, timeout: float | None = None):
        self.address = address
        self.roots = tuple(roots)
        self.timeout = CONNECT_SECONDS if timeout is None else timeout
        self.client: Any = None
        self.threads = 0

    def __enter__(self) -> Cluster:
        distributed = _distributed()
        try:
            self.client = distributed.Client(
                self.address, timeout=self.timeout, set_as_default=False
            )
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at {self.address} ({exc}); start one with "
                f"`dask scheduler` and give its address"
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
        try:
            facts = self.client.run(worker_facts, self.roots)
        except ImportError as exc:  # the worker cannot unpickle h5etl's function
            raise _cannot_run(exc) from exc
        for where, version, problem in facts.values():
            if problem is not None:
                raise ClusterError(problem)
            if version != __version__:
                raise ClusterError(
                    f"{where} runs h5etl {version}, this build {__version__}: install the same "
                    f"h5etl on every worker"
                )
        self.threads = sum(self.client.nthreads().values())

    def run_tasks(
        self,
        tasks: Iterable[DecodeTask | Barrier],
        recipe: decode.DecodeRecipe,
        *,
        window: int | None = None,
        worker: schedule.Worker = decode.decode_batch,
    ) -> Iterator[BatchResult]:
        """Decode tasks on the cluster; yield results in task order (a ``schedule.Decoder``)."""
        assert self.client is not None, "Cluster used outside its with-block"
        distributed = _distributed()
        killed = distributed.KilledWorker
        shared = self.client.scatter(recipe, broadcast=True, hash=False)

        def submit(task: DecodeTask) -> Any:
            return self.client.submit(
                decode_on_worker,
                worker,
                task,
                shared,
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
            shared.release()

    def _collect(self, future: Any) -> Any:
        """A future's result; the cluster's own failures become one ``ClusterError`` line."""
        distributed = _distributed()
        try:
            return future.result()
        except (ClusterError, distributed.KilledWorker):
            raise
        except ImportError as exc:
            raise _cannot_run(exc) from exc
        except (OSError, distributed.client.FutureCancelledError) as exc:
            raise ClusterError(
                f"lost the Dask scheduler at {self.address} mid-build ({exc}); nothing was "
                f"published: --resume continues from the last checkpoint"
            ) from exc


@contextlib.contextmanager
def decoding(address: str, jobs: int, roots: Sequence[str]) -> Iterator[schedule.Decoder]:
    """A decoder for one build (or shard): ``jobs`` local processes when ``address`` is
    ``local``, else the Dask cluster of that scheduler, connected and checked."""
    if address == LOCAL:
        workers.warm_up(jobs)
        yield schedule.local(jobs)
        return
    with Cluster(address, roots) as remote:
        yield remote.run_tasks


def _cannot_run(exc: BaseException) -> ClusterError:
    return ClusterError(
        f"a Dask worker cannot run h5etl's tasks ({type(exc).__name__}: {exc}); install this "
        f"h5etl ({__version__}) with its extras on every worker"
    )
