"""The decode worker processes: joblib's reusable loky pool, started as early as possible.

This module is light on purpose (no numpy, no HDF5): the CLI starts the workers before it
imports the pipeline, so their start-up (an interpreter and the decode stack, about half a
second) overlaps the parent's own imports, config loading and planning.
"""

from __future__ import annotations

import gc
import os
from collections.abc import MutableMapping
from concurrent.futures import Executor

from h5etl import timeline

IDLE_SECONDS = 60  # workers outlive one build briefly, so a second one in-process reuses them

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
    """The shared pool of ``jobs`` workers (re-created if one died)."""
    # Imported here: joblib imports numpy, and the CLI limits native threads before that.
    from joblib.externals.loky import get_reusable_executor

    executor: Executor = get_reusable_executor(
        max_workers=jobs, timeout=IDLE_SECONDS, env=NATIVE_THREAD_LIMITS
    )
    return executor


_frozen = False  # in a worker: its imports were frozen (``_imported``)


def _imported() -> None:
    """In a worker, once its imports are done: they stay until it exits, so the garbage
    collector need not walk them again, neither while it decodes nor when it exits (that
    final walk kept the build waiting for its workers: 0.1 s at the end of every build).
    Once a process, the young garbage collected first: nothing of a task's is frozen."""
    global _frozen
    if not _frozen:
        gc.collect(1)
        gc.freeze()
        _frozen = True


def _import_decode_stack() -> None:
    import h5etl.decode.task  # noqa: F401  (the import is the work)

    _imported()
    timeline.mark("worker: decode stack imported", once=True)


def _import_modules(modules: tuple[str, ...]) -> None:
    import contextlib
    import importlib

    for module in modules:
        # a missing library: the decode that needs it rejects, naming the extra to install
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    _imported()
    timeline.mark("worker: the config's modules imported", once=True)


def warm_up(jobs: int) -> None:
    """Start the workers now and have each import the decode stack; returns at once."""
    if jobs > 1:
        executor = pool(jobs)
        for _ in range(jobs):
            executor.submit(_import_decode_stack)
        timeline.mark("pool: started (workers spawning)")


def preload(jobs: int, modules: tuple[str, ...]) -> None:
    """Have each worker import ``modules`` (a config's kinds and the libraries they read
    with: pydicom for a CT series) while this process still imports the pipeline and
    plans; returns at once. Otherwise each worker's first task paid them (0.35 s of a
    200-slice case's 1.2)."""
    if jobs > 1 and modules:
        executor = pool(jobs)
        for _ in range(jobs):
            executor.submit(_import_modules, modules)
