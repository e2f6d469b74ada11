"""The worker pool: native thread pools limited to one thread, in workers and in the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from h5etl.execute import pool as workers
from h5etl.processes import pid_alive


def _environment(names: list[str]) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def test_workers_run_native_libraries_on_one_thread() -> None:
    names = sorted(workers.NATIVE_THREAD_LIMITS)
    seen = [workers.pool(2).submit(_environment, names).result() for _ in range(4)]
    assert all(env == dict.fromkeys(names, "1") for env in seen)


def test_limits_apply_where_the_user_set_nothing() -> None:
    environ = {"OMP_NUM_THREADS": "4"}
    workers.limit_native_threads(environ)
    assert environ["OMP_NUM_THREADS"] == "4"  # an explicit choice stays
    assert environ["OPENBLAS_NUM_THREADS"] == "1"


def test_the_cli_limits_threads_before_numpy_is_imported() -> None:
    code = (
        "import sys, h5etl.cli.app as cli\n"
        "assert 'numpy' not in sys.modules, 'importing the CLI imported numpy'\n"
        "sys.argv = ['h5etl', '--version']\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "import os\n"
        "print(os.environ['OPENBLAS_NUM_THREADS'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1"


def test_imported_ahead_means_imported_and_a_missing_library_is_left_to_the_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "h5etl_test_ahead.py").write_text("LOADED = True\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "h5etl_test_ahead", raising=False)
    workers._import_modules(("h5etl_no_such_library", "h5etl_test_ahead"))
    assert sys.modules["h5etl_test_ahead"].LOADED


def test_preload_asks_every_worker_and_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[tuple[Any, ...]] = []

    class Recorder:
        def submit(self, *call: Any) -> None:
            submitted.append(call)

    monkeypatch.setattr(workers, "pool", lambda jobs: Recorder())
    workers.preload(3, ("pydicom",))
    assert submitted == [(workers._warm, ("pydicom",))] * 3
    submitted.clear()
    workers.preload(1, ("pydicom",))  # --jobs 1 decodes in this process: no pool
    workers.preload(2, ())
    assert submitted == []


def test_a_worker_decodes_images_without_loading_hdf5_yaml_or_pydantic() -> None:
    # each worker imported h5py, hdf5plugin and yaml for names and a check the parent makes
    # (codec.has_direct): 0.1 CPU-s a worker, at the start of every build
    modules = (*workers.DECODE_STACK, "h5etl.kinds.image", "h5etl.kinds.mask", "h5etl.kinds.text")
    code = (
        "import sys\n"
        f"from h5etl.execute.pool import _import_modules\n_import_modules({modules!r})\n"
        "print(sorted(m for m in ('h5py', 'hdf5plugin', 'yaml', 'pydantic') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_worker_trusting_the_parents_verdict_encodes_hdf5s_bytes_without_hdf5() -> None:
    from h5etl.format import codec

    layout = codec.ChunkLayout(
        (3, 8, 8), "uint8", (4, 3, 8, 8), codec.Codec("blosc", 5, "lz4", "byte"), True
    )
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from h5etl.format import codec\n"
        "from h5etl.format.codec import ChunkLayout, Codec\n"
        f"layout = {layout!r}\n"
        "codec.trust_direct({layout: True})\n"
        "rows = (np.arange(4 * 3 * 64) % 7).astype(np.uint8).reshape(4, 3, 8, 8)\n"
        "[chunk] = codec.encode_direct(layout, rows)\n"
        "print('h5py' in sys.modules, chunk.data.hex())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = (np.arange(4 * 3 * 64) % 7).astype(np.uint8).reshape(4, 3, 8, 8)
    scratch, dataset = codec._scratch(layout)  # HDF5's own filter pipeline, here
    with scratch:
        dataset.write_direct(rows)
        _, stored = dataset.id.read_direct_chunk((0, 0, 0, 0))
    assert done.stdout.split() == ["False", bytes(stored).hex()]


def test_stop_waits_for_the_task_queues_thread_so_an_exiting_cli_prints_nothing() -> None:
    # The queue's thread frees loky's named semaphores as it ends; a process that exits
    # before it did left loky's resource tracker printing "leaked semlock objects" warnings
    # under a failed build's one-line error (one CLI run in ten).
    script = (
        "import threading\n"
        "from h5etl.execute import pool\n"
        "pool.pool(2).submit(abs, -1).result()\n"
        "pool.stop()\n"
        "print(sorted(t.name for t in threading.enumerate() if t.name == 'QueueFeederThread'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
    assert done.stderr == ""


FORKED_WORKERS = """
import json, os, resource, sys
from multiprocessing import forkserver
from h5etl.execute import pool as workers

def spin():
    return sum(i * i for i in range(3_000_000))

def facts(names):
    return {
        "parent": os.getppid(),
        "environment": {name: os.environ.get(name) for name in names},
        "stack imported": all(module in sys.modules for module in workers.DECODE_STACK),
        "config loaded": any(module.startswith("h5etl.config") for module in sys.modules),
    }

if __name__ == "__main__":
    names = [*sorted(workers.NATIVE_THREAD_LIMITS), "H5ETL_TEST_SET_LATER"]
    os.environ["OMP_NUM_THREADS"] = "3"  # the workers' own limit wins, as with loky's start
    workers.serve_forks()
    workers.warm_up(2)  # the fork server starts with this environment
    workers.stop()
    os.environ["H5ETL_TEST_SET_LATER"] = "yes"  # credentials set between two builds
    seen = [workers.pool(2).submit(facts, names).result() for _ in range(4)]
    [workers.pool(2).submit(spin).result() for _ in range(4)]
    server = forkserver._forkserver._forkserver_pid
    workers.stop()
    workers.stop_fork_server()  # as the CLI does at exit: the server reaped, its workers' CPU ours
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = children.ru_utime + children.ru_stime
    print(json.dumps({"me": os.getpid(), "seen": seen, "server": server, "cpu": cpu}))
"""


def test_the_clis_workers_are_forks_of_a_server_with_the_decode_stack_and_todays_environment(
    tmp_path: Path,
) -> None:
    script = tmp_path / "forked_workers.py"
    script.write_text(FORKED_WORKERS, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "H5ETL_TEST_SET_LATER"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout.strip().splitlines()[-1])
    seen = told["seen"]
    assert all(facts["parent"] != told["me"] for facts in seen)  # the server's children
    assert all(facts["stack imported"] and not facts["config loaded"] for facts in seen)
    expected = {**dict.fromkeys(workers.NATIVE_THREAD_LIMITS, "1"), "H5ETL_TEST_SET_LATER": "yes"}
    assert all(facts["environment"] == expected for facts in seen)
    # stopped and reaped, the server's workers' CPU (their spinning) counts as the caller's:
    # `time h5etl build` showed the CLI's own alone
    assert not pid_alive(told["server"])
    assert told["cpu"] > 0.2


KILLED_OWNER = """
import os, signal, sys
from h5etl.execute import pool as workers

if __name__ == "__main__":
    workers.serve_forks()
    executor = workers.pool(2)
    pids = {executor.submit(os.getpid).result() for _ in range(8)}
    print(" ".join(map(str, sorted(pids))), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a CLI killed mid-build: nothing cleans up
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_forked_workers_end_soon_after_their_cli_is_killed(tmp_path: Path) -> None:
    import time

    script = tmp_path / "killed_owner.py"
    script.write_text(KILLED_OWNER, encoding="utf-8")
    command = [sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids
    deadline = time.monotonic() + 10 * workers.ORPHAN_POLL_SECONDS
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(pid_alive, pids)), "a worker outlived its killed CLI"


FORKED_CRASH = """
import os, signal
from concurrent.futures.process import BrokenProcessPool
from h5etl.execute import pool as workers
from h5etl.execute import schedule

def die():
    os.kill(os.getpid(), signal.SIGKILL)  # as a native decoder's crash

if __name__ == "__main__":
    workers.serve_forks()
    first = workers.pool(2)
    first.submit(os.getpid).result()
    try:
        schedule.submit_to_pool(2, die).result()
        print("no crash")
    except BrokenProcessPool as exc:
        print("broken", type(exc).__module__)
        print(workers.death_note())
    again = workers.pool(2)
    print("fresh", again is not first, again.submit(os.getpid).result() != os.getpid())
    workers.stop()
    workers.stop_fork_server()
"""


def test_a_clis_pool_broken_by_a_dead_worker_is_replaced_and_exits_quietly(
    tmp_path: Path,
) -> None:
    # the CLI's forked workers run in the standard library's pool, not loky's
    script = tmp_path / "forked_crash.py"
    script.write_text(FORKED_CRASH, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "broken concurrent.futures.process",
        "; its workers' exit: SIGKILL",  # what loky's message said, the pool's does not
        "fresh True True",
    ]
    assert done.stderr == ""  # no leaked semaphores, no traceback from the pool's threads
