"""The worker pool: native thread pools limited to one thread, in workers and in the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from h5etl.execute import pool as workers


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
    assert submitted == [(workers._import_modules, ("pydicom",))] * 3
    submitted.clear()
    workers.preload(1, ("pydicom",))  # --jobs 1 decodes in this process: no pool
    workers.preload(2, ())
    assert submitted == []
