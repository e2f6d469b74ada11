"""The decode worker processes: a pool of h5etl's own, started as early as possible.

The pool is h5etl's, not loky's process-wide reusable executor: joblib's ``Parallel`` shares
that one and expects its own set-up on it, so a build in a user's process (a notebook that
then calls ``Parallel``) broke joblib, and joblib's pool made first was shut down by a build.

This module is light on purpose (no numpy, no HDF5): the CLI starts the workers before it
imports the pipeline, so their start-up overlaps the parent's own imports, config loading and
planning. The CLI's workers are forked from a fork server that imported the decode stack once
(``serve_forks``), started from the bare arguments before the command line loads
(``h5etl.cli.early``): on two cores, two fresh interpreters importing it (0.15 CPU-s each)
competed with the parent's config loading, which is the critical path of a build's first
second. They run in the standard library's process pool, which a CLI (one pool for its life)
needs no more than. A process that builds in-process (a notebook, the tests) keeps a loky
pool and loky's own start: a fork server's environment and preloads are process-wide, and
loky's idle workers time out in a process that goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import os
import threading
import time
from collections.abc import MutableMapping
from concurrent.futures import Executor
from typing import Any, cast

from h5etl import timeline

# How long ``stop`` waits for the task queue's thread to end: milliseconds, unless it is stuck
# writing a task no worker will read (the pipe full, the workers killed): it never ends then
FEEDER_JOIN_SECONDS = 1.0
IDLE_SECONDS = 60  # workers outlive one build briefly, so a second one in-process reuses them
_started: Executor | None = None  # this process's pool (``pool``, ``discard``, ``stop``)
_size = 0  # its workers
_stop_registered = False  # ``stop`` runs at exit once a pool was started
_environment = ""  # the credentials environment its workers started with (a digest)
_forked = False  # workers come from a fork server (``serve_forks``), not loky's own start
_preloads: set[str] = set()  # what the fork server imports before it forks (``fork_server``)
_starting: threading.Thread | None = None  # ``warm_up``'s first submissions (fork server)
# What an object store's backend reads its credentials and endpoint from: a worker has the
# environment it started with (none is ever sent to it), so a pool started before a change
# (credentials set or rotated between two builds in one process) is replaced; so is one
# started before the S3 client of the workers' GETs was chosen (h5etl.remote.direct)
_CREDENTIAL_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "FSSPEC_", "H5ETL_S3_CLIENT")

# One thread for the native thread pools under numpy and friends (what joblib's Parallel sets
# for its workers too). A worker is already one of ``jobs`` processes on as many cores, and
# h5etl makes no BLAS calls; but OpenBLAS starts a thread per core on import that spins for
# about 0.1 CPU-s, in the parent and in every worker of every build.
NATIVE_THREAD_LIMITS = dict.fromkeys(
    (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ),
    "1",
)


def limit_native_threads(environ: MutableMapping[str, str] = os.environ) -> None:
    """Apply ``NATIVE_THREAD_LIMITS`` where not set: before numpy is imported, to count."""
    for name, value in NATIVE_THREAD_LIMITS.items():
        environ.setdefault(name, value)


def pool(jobs: int) -> Executor:
    """The pool of ``jobs`` workers (started now if none, or one of another size, or
    ``discard``-ed after a worker died). In-process, loky's: idle workers exit after
    ``IDLE_SECONDS``, and the pool starts new ones as work comes; the CLI's forked workers
    live as long as the CLI."""
    global _started, _size, _environment, _stop_registered
    environment = _credentials_environment()
    if _started is None or _size != jobs or _broken(_started) or _environment != environment:
        stop()
        if not _stop_registered:
            # A process that built in-process (a script, a notebook, the tests) and exits with
            # the pool alive: stopped before the interpreter tears modules down, when loky's
            # clean-up of a collected pool printed "Exception ignored ... weakref_cb".
            atexit.register(stop)
            _stop_registered = True
        if _forking():
            # The standard library's pool, not loky's: importing joblib for loky took 50 ms
            # of the CLI's path to its first task, and a CLI needs none of what loky adds
            # (idle workers timing out, workers started afresh): its pool lives as long as
            # it. A fork has the server's environment, of when it started: each worker takes
            # this process's of now, as loky's own start gives it (credentials set since).
            from concurrent.futures import ProcessPoolExecutor as StandardPool

            _started = StandardPool(
                max_workers=jobs,
                mp_context=fork_server(DECODE_STACK),
                initializer=_forked_worker,
                initargs=({**os.environ, **NATIVE_THREAD_LIMITS}, os.getpid()),
            )
        else:
            # Imported here: joblib imports numpy; the CLI limits native threads before that
            from joblib.externals.loky import ProcessPoolExecutor

            _started = ProcessPoolExecutor(
                max_workers=jobs, timeout=IDLE_SECONDS, env=NATIVE_THREAD_LIMITS
            )
        _size, _environment = jobs, environment
    return _started


def serve_forks(serve: bool = True) -> None:
    """Start this process's workers as forks of a fork server that has imported the decode
    stack (the CLI's choice, before any import it makes; where the platform has one), or,
    ``serve`` False, with loky's own start again."""
    global _forked
    _forked = serve  # the platform is asked when a pool starts: multiprocessing is loaded then


def start_fork_server() -> None:
    """Start the fork server of this process's workers now, importing the decode stack, if
    workers are forked here (``serve_forks``) and the platform has one; the pool that
    ``pool`` starts later forks from it. Nothing waits for its imports."""
    if _forking():
        fork_server(DECODE_STACK)
        timeline.mark("fork server starting")


def _forking() -> bool:
    """Whether this process's workers are forks of a fork server: it serves forks
    (``serve_forks``) and the platform has one."""
    import multiprocessing  # loaded when a pool starts, not with this module

    return _forked and "forkserver" in multiprocessing.get_all_start_methods()


def _forked_worker(environment: dict[str, str], owner: int) -> None:
    """In a forked worker: the environment of ``owner``, the process that started the pool,
    and a watch that ends the worker once ``owner`` is gone. A fork holds both ends of its
    task queue and the fork server's liveness pipe, so no end-of-file tells it that a killed
    CLI will send nothing more; without the watch it idled ``IDLE_SECONDS`` (as loky's own
    workers do), and the fork server with it."""
    os.environ.clear()
    os.environ.update(environment)
    threading.Thread(target=_watch, args=(owner,), name="h5etl-orphan-watch", daemon=True).start()


ORPHAN_POLL_SECONDS = 1.0


def _watch(owner: int) -> None:
    from h5etl.processes import pid_alive

    while pid_alive(owner):
        time.sleep(ORPHAN_POLL_SECONDS)
    os._exit(1)  # nothing of a dead build's to finish: its temp file is the next build's


def stop_fork_server() -> None:
    """Stop the fork server and wait for it (a process about to exit: the CLI). Its workers'
    CPU time is then the CLI's, as a process's reaped children's is (``time h5etl build``
    showed the parent's alone), and nothing of the build outlives it. Call after ``stop``."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        with contextlib.suppress(Exception):  # a private API: without it the server exits
            server._stop()  # once this process's end closes the liveness pipe


def preload_too(modules: tuple[str, ...]) -> None:
    """Have the fork server, once it starts, import ``modules`` as well (the shard writers'
    for a sharded build: the server is one per process and starts with the first pool)."""
    _preloads.update(modules)


def fork_server(modules: tuple[str, ...]) -> Any:
    """The ``forkserver`` context, its server running with ``modules`` imported (and those
    asked for before: one server per process, so the shard writers' and the decode workers'
    preloads are one list) and the native thread limits in its environment, as loky gives
    its own workers. A server started before (with fewer modules) is kept: what a fork lacks
    it imports itself."""
    import multiprocessing
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    _preloads.update(modules)
    context.set_forkserver_preload([*sorted(_preloads), SERVER_EXIT])
    saved = {name: os.environ.get(name) for name in NATIVE_THREAD_LIMITS}
    os.environ.update(NATIVE_THREAD_LIMITS)
    try:
        forkserver.ensure_running()  # the server starts importing now; nothing waits for it
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return context


def _credentials_environment() -> str:
    """A digest of the environment variables object stores read credentials from."""
    found = sorted((k, v) for k, v in os.environ.items() if k.startswith(_CREDENTIAL_PREFIXES))
    return hashlib.sha256(repr(found).encode()).hexdigest() if found else ""


def _broken(executor: Executor) -> bool:
    """Whether a worker's death broke ``executor``: loky's flag (its own reusable pool asks
    the same), or the standard library pool's reason."""
    return bool(
        getattr(getattr(executor, "_flags", None), "broken", None)
        or getattr(executor, "_broken", False)
    )


def death_note() -> str:
    """How the workers of this process's pool ended, once a death broke it: "; its workers'
    exit: SIGSEGV" (SIGKILL: the kernel's out-of-memory killer, most often). The standard
    library's pool says only that a process ended abruptly, where loky's message, which
    in-process builds keep, names the codes itself: for those, and while the pool is whole,
    ""."""
    executor = _started
    if executor is None or hasattr(executor, "_flags") or not getattr(executor, "_broken", None):
        return ""
    # its manager thread reaps the workers: their codes are read once it is done, not beside it
    manager = getattr(executor, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=FEEDER_JOIN_SECONDS * 5)
        if manager.is_alive():
            return ""
    codes = {p.exitcode for p in (getattr(executor, "_processes", None) or {}).values()}
    ended = sorted(_exit_name(code) for code in codes if code)
    if len(ended) > 1:  # the pool terminates the others once one is dead
        ended = [name for name in ended if name != "SIGTERM"]
    return f"; its workers' exit: {', '.join(ended)}" if ended else ""


def _exit_name(code: int) -> str:
    import signal

    if code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
        return f"signal {-code}"
    return f"exit code {code}"


def discard() -> None:
    """Forget a pool a worker's death broke (loky refuses work from then on): the next
    ``pool`` starts a fresh one. Its other workers are stopped."""
    stop()


def stop() -> None:
    """Stop the workers this process started, now: for a process about to exit (the CLI).

    They are killed, not asked to finish: what they hold is the parent's (shared memory,
    files), and a worker still importing or idle has nothing to finish. Asked, each would
    first tear its interpreter down while the exiting CLI waited; a config error would wait
    for workers that had not finished starting.
    """
    global _started, _starting
    if _starting is not None:
        # the first submissions wait on the fork server's imports (a fraction of a second)
        _starting.join(timeout=FEEDER_JOIN_SECONDS * 5)
        _starting = None
    if _started is not None:
        executor, _started = cast(Any, _started), None
        feeder = getattr(getattr(executor, "_call_queue", None), "_thread", None)
        if hasattr(executor, "_flags"):  # loky's
            executor.shutdown(wait=True, kill_workers=True)
        else:
            # the standard library's: ``kill_workers`` from Python 3.14, its processes before
            kill = getattr(executor, "kill_workers", None)
            if kill is not None:
                kill()
            else:
                for process in list((getattr(executor, "_processes", None) or {}).values()):
                    with contextlib.suppress(OSError):
                        process.kill()
            executor.shutdown(wait=True, cancel_futures=True)
        # loky leaves the feeder thread of its task queue running (a daemon it never joins
        # for a queue this process made), and that thread frees the queue's semaphores as it
        # ends: a process exiting first cut it short, and loky's resource tracker then
        # printed "leaked semlock objects" warnings under the CLI's one-line error.
        if feeder is not None:
            feeder.join(timeout=FEEDER_JOIN_SECONDS)


# What every task runs on: the decoding, and the pool's side of a task (its first task
# unpickles ``schedule.run_pooled``).
DECODE_STACK = ("h5etl.decode.task", "h5etl.execute.schedule")


# The fork server's last import: it exits without tearing its interpreter down
SERVER_EXIT = "h5etl.execute.server_exit"


def _import_modules(modules: tuple[str, ...]) -> None:
    import importlib

    for module in modules:
        # a missing library: the decode that needs it rejects, naming the extra to install
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    timeline.mark(f"worker: imported {', '.join(modules)}")


def _warm(modules: tuple[str, ...]) -> None:
    """In a worker: import ``modules``, then freeze what the imports made. It stays until
    the worker exits, so the garbage collector need not walk it again, neither while the
    worker decodes nor when it exits (that last walk kept each build waiting for its
    workers). The young garbage is collected first, so a task's leftovers are not frozen
    (a pool reused by a second build in one process warms again)."""
    _import_modules(modules)
    gc.collect(1)
    gc.freeze()


def warm_up(jobs: int) -> None:
    """Start the workers now and have each import the decode stack; returns at once."""
    global _starting
    if jobs > 1:
        executor = pool(jobs)

        def submit() -> None:
            for _ in range(jobs):
                executor.submit(_warm, DECODE_STACK)
            timeline.mark("pool: started (workers spawning)")

        def submit_quietly() -> None:
            # a pool that cannot start fails the build's own submissions, which say why
            with contextlib.suppress(Exception):
                submit()

        if _forked and _starting is None:
            # A fork is handed over only once the server has imported the stack: waited
            # for here, that would be 0.2 s of the critical path (the wait releases the GIL)
            _starting = threading.Thread(
                target=submit_quietly, name="h5etl-pool-start", daemon=True
            )
            _starting.start()
        else:
            submit()


def preload(jobs: int, modules: tuple[str, ...]) -> None:
    """Have each worker import ``modules`` (a config's kinds and the libraries they read
    with: pydicom for a CT series) while this process still imports the pipeline and
    plans; returns at once. Otherwise each worker's first task paid them (0.35 s of a
    200-slice case's 1.2)."""
    if jobs > 1 and modules:
        executor = pool(jobs)
        for _ in range(jobs):
            executor.submit(_warm, modules)
