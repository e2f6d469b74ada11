"""Fault report: inflict each failure mode on a real build and print what it left behind.

    python tests/benchmarks/faults.py [--dir DIR]

For every failure mode: the exit status, where the link points, the previous release's
SHA-256 before and after, and the files left in the output folder. The same failures are
asserted in tests/pipeline/test_reliability.py; this script shows them side by side for a report.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

import h5etl
import h5etl.plan.tasks
import h5etl.sink.array_writer
from h5etl.config.load import load_spec
from h5etl.release.folder import OutputFolder

# The same failure scripts the reliability tests run.
# (tests/pipeline since the tests mirror the package; this script had not run since)
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / folder) for folder in ("", "pipeline")]
from test_reliability import KILLED_BUILD, TASK_SAMPLES, interrupt_slow_build  # noqa: E402


def make_project(root: Path, samples: int) -> Path:
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (root / "raw" / folder).mkdir(parents=True, exist_ok=True)
    for index in range(samples):
        size = (int(rng.integers(8, 25)), int(rng.integers(8, 25)))
        image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        mask = np.where(rng.random(size) < 0.5, 255, 0).astype(np.uint8)
        Image.fromarray(image).save(root / "raw" / "images" / f"s{index:04d}.png")
        Image.fromarray(mask).save(root / "raw" / "masks" / f"s{index:04d}.png")
    config = {
        "name": "cells",
        "output": "releases",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "fields": {
            "image": {"shape": [3, 24, 24]},
            "mask": {"shape": [1, 24, 24]},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": 2},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "-"


def state(folder: Path) -> tuple[str, list[str]]:
    link = folder / "cells.h5"
    target = os.readlink(link) if link.is_symlink() else "-"
    return target, sorted(os.listdir(folder)) if folder.exists() else []


def run_killed(args: list[str], script: str) -> int:
    with open(os.devnull, "w") as devnull:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            stdout=devnull,
            stderr=devnull,
            start_new_session=True,
        )
        code = proc.wait(timeout=300)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return code


def fresh(root: Path, samples: int) -> tuple[Path, Path]:
    shutil.rmtree(root, ignore_errors=True)
    config = make_project(root, samples)
    h5etl.build(load_spec(config))
    return config, root / "releases"


def sigkill(where: str) -> Callable[[Path, Path], str]:
    def inflict(config: Path, folder: Path) -> str:
        code = run_killed([str(config), "30", "2", where], KILLED_BUILD)
        return f"exit {code}"

    return inflict


def sigint(config: Path, folder: Path) -> str:
    _, returncode, err = interrupt_slow_build(config, folder)
    return f"exit {returncode}: {err.strip()}"


def concurrent(config: Path, folder: Path) -> str:
    # the lock held as a running build holds it (a hand-written lock file is judged stale)
    with OutputFolder(folder, "cells").locked():
        try:
            h5etl.build(load_spec(config))
        except h5etl.H5EtlError as exc:
            return f"refused: {str(exc)[-120:]}"
    return "built (unexpected)"


def disk_full(config: Path, folder: Path) -> str:
    original = h5etl.sink.array_writer.ArrayWriter._store
    calls = 0

    def failing(self: object, row: int, chunks: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, row, chunks)  # type: ignore[arg-type]

    h5etl.sink.array_writer.ArrayWriter._store = failing  # type: ignore[method-assign]
    try:
        h5etl.build(load_spec(config), full=True)  # else up to date: nothing is written
    except h5etl.H5EtlError as exc:
        return f"failed: {exc}"
    finally:
        h5etl.sink.array_writer.ArrayWriter._store = original  # type: ignore[method-assign]
    return "built (unexpected)"


def too_many_rejects(config: Path, folder: Path) -> str:
    for index in range(3):
        (config.parent / "raw" / "images" / f"zz{index}.png").write_bytes(b"")
        (config.parent / "raw" / "masks" / f"zz{index}.png").write_bytes(b"")
    spec = load_spec(config).model_copy(update={"max_rejects": 2})
    try:
        h5etl.build(spec)
    except h5etl.H5EtlError as exc:
        return f"failed: {str(exc)[-100:]}"
    return "built (unexpected)"


def killed_then_resumed(config: Path, folder: Path) -> str:
    code = run_killed([str(config), "30", "2", "decode"], KILLED_BUILD)
    cut = h5etl.plan.tasks.TASK_SAMPLES
    h5etl.plan.tasks.TASK_SAMPLES = TASK_SAMPLES  # cut as the killed build did, or no resume
    try:
        report = h5etl.build(load_spec(config), resume=True)
    finally:
        h5etl.plan.tasks.TASK_SAMPLES = cut
    return f"killed (exit {code}), resumed: {report.resumed} samples copied, v{report.version}"


MODES: dict[str, Callable[[Path, Path], str]] = {
    "SIGKILL while workers decode": sigkill("decode"),
    "SIGKILL inside the sink": sigkill("sink"),
    "SIGINT (Ctrl-C)": sigint,
    "second build while locked": concurrent,
    "write error (ENOSPC)": disk_full,
    "max_rejects exceeded": too_many_rejects,
    "SIGKILL, then --resume": killed_then_resumed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "h5etl-faults")
    parser.add_argument("--samples", type=int, default=120)
    args = parser.parse_args()
    print("| failure | outcome | link after | v0001 sha256 before / after | files left |")
    print("|---|---|---|---|---|")
    for name, inflict in MODES.items():
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # a folder of its own
        config, folder = fresh(args.dir / slug, args.samples)
        before = sha(folder / "cells-v0001.h5")
        outcome = inflict(config, folder).replace("|", "/").replace("\n", " ")
        target, files = state(folder)
        after = sha(folder / "cells-v0001.h5")
        print(f"| {name} | {outcome} | {target} | {before} / {after} | {', '.join(files)} |")


if __name__ == "__main__":
    main()
