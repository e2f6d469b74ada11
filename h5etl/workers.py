"""The decode worker processes: joblib's reusable loky pool, started as early as possible.

This module is light on purpose (no numpy, no HDF5): the CLI starts the workers before it
imports the pipeline, so their start-up (an interpreter and the decode stack, about half a
second) overlaps the parent's own imports, config loading and planning.
"""

from __future__ import annotations

from concurrent.futures import Executor

from joblib.externals.loky import get_reusable_executor

IDLE_SECONDS = 60  # workers outlive one build briefly, so a second one in-process reuses them


def pool(jobs: int) -> Executor:
    """The shared pool of ``jobs`` workers (re-created if one died)."""
    executor: Executor = get_reusable_executor(max_workers=jobs, timeout=IDLE_SECONDS)
    return executor


def _import_decode_stack() -> None:
    import h5etl.decode  # noqa: F401  (the import is the work)


def warm_up(jobs: int) -> None:
    """Start the workers now and have each import the decode stack; returns at once."""
    if jobs > 1:
        executor = pool(jobs)
        for _ in range(jobs):
            executor.submit(_import_decode_stack)
