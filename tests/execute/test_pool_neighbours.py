"""h5etl's worker pool lives beside joblib's own in one process (a notebook builds, then
calls ``Parallel``): each keeps its pool."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Run in a fresh interpreter: loky's process-wide executor is what the two shared.
SCRIPT = textwrap.dedent(
    """
    import os
    from joblib import Parallel, delayed
    from h5etl.execute import pool

    order = os.environ["ORDER"]
    if order == "joblib-first":
        assert Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]
    assert pool.pool(2).submit(abs, -3).result() == 3
    assert Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]
    assert pool.pool(2).submit(abs, -5).result() == 5
    # a worker's death breaks h5etl's pool only, and the next call gets a fresh one
    try:
        pool.pool(2).submit(os._exit, 1).result()
    except Exception as exc:
        print(type(exc).__name__)
    assert pool.pool(2).submit(abs, -7).result() == 7
    assert Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(2)) == [0, 1]
    pool.stop()
    print("ok")
    """
)


@pytest.mark.parametrize("order", ["h5etl-first", "joblib-first"])
def test_joblib_parallel_and_h5etl_pool_share_a_process(order: str) -> None:
    # joblib's Parallel crashed (no _temp_folder_manager) after a build had made loky's
    # process-wide executor its own
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env={**os.environ, "ORDER": order},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TerminatedWorkerError", "ok"]
