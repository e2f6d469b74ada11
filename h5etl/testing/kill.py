"""A build killed with SIGKILL part-way, in a subprocess, for resume tests.

The cheapest reliable kill: the build's own progress hook kills its process once enough
samples went through the sink, checkpointing after every task (no sleeps, no races).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

# Samples per decode task in a killed build; a build resumed from it must cut its tasks the
# same way (set ``h5etl.plan.tasks.TASK_SAMPLES`` to it), else it cannot reuse the chunks.
KILLED_TASK_SAMPLES = 2

KILLED_BUILD = """
    import os, signal, sys
    import h5etl, h5etl.plan.tasks
    h5etl.plan.tasks.TASK_SAMPLES = int(sys.argv[4])
    config, after, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    seen = 0
    def hook(stage, advance, total):
        global seen
        if stage == "decode+write" and total is None:
            seen += advance
            if seen >= after:
                os.kill(os.getpid(), signal.SIGKILL)
    h5etl.build(h5etl.load_spec(config), jobs=jobs, progress=hook, checkpoint_seconds=0)
"""


def run_killed_build(config: Path, after: int, jobs: int = 1, prelude: str = "") -> int:
    """Build ``config`` in a fresh session, SIGKILLed once ``after`` samples were written.

    Returns the return code (``-SIGKILL`` if the build got that far). Tasks hold
    ``KILLED_TASK_SAMPLES`` samples and each is checkpointed; the child inherits this
    process's environment (``SOURCE_DATE_EPOCH``). ``prelude`` is Python run first (a
    test-only kind put in place, say).
    """
    script = textwrap.dedent(prelude) + textwrap.dedent(KILLED_BUILD)
    argv = [str(config), str(after), str(jobs), str(KILLED_TASK_SAMPLES)]
    with open(os.devnull, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=120)
        finally:  # its decode workers are in its session: none outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
