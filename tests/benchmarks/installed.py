"""Measure h5etl as it runs installed (its modules byte-compiled), on inputs already read once.

pip compiles a package's modules when it installs it, and a checkout installed editable writes
them on first import. With ``PYTHONDONTWRITEBYTECODE`` set (some CI and sandbox shells set it)
neither happens, and every process of every build compiles h5etl from source again: about
0.15 s of CPU in the parent and as much again in each worker, for every build, which a work
limit importing little of h5etl does not pay. So each benchmark byte-compiles the trees it
measures first (into their ``__pycache__``, as an install would), whatever the shell says.

``warm`` reads a corpus once before the timed repeats. Each repeat runs h5etl's build before
its work limit, so on a page cache that other jobs emptied the first build alone read the
inputs from disk: the first repeat's ratio came out 0.52-0.79 where the others gave 0.8-1.0,
in every benchmark, always against h5etl. Both contenders now start from the same warm cache.

``exec_child`` and ``h5etl_here`` run a child's ``python -c`` code or its ``h5etl`` command
line in this process instead: the test suite's smoke runs (``H5ETL_BENCH_SMOKE=1``, no figure
meant) pay the imports once.
"""

from __future__ import annotations

import compileall
import contextlib
import io
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path


def byte_compile(trees: Iterable[str | Path] = ()) -> list[Path]:
    """Compile the h5etl this process imports and the ``h5etl`` package of each source tree
    in ``trees`` (a variant's PYTHONPATH entries); returns the packages compiled."""
    import h5etl

    packages = [Path(h5etl.__file__).resolve().parent]
    for tree in trees:
        for entry in str(tree).split(":"):
            package = Path(entry) / "h5etl"
            if entry and package.is_dir():
                packages.append(package.resolve())
    done: list[Path] = []
    for package in dict.fromkeys(packages):
        compileall.compile_dir(package, quiet=1)
        done.append(package)
    return done


WARM_BLOCK = 1 << 20


OUTPUTS = frozenset({"releases", "work"})  # what the benchmarks write beside their inputs


def warm(*roots: str | Path) -> int:
    """Read every input file under ``roots`` once (into the page cache), not the releases the
    benchmarks write beside them (``OUTPUTS`` folders); returns the bytes read."""
    total = 0
    for root in roots:
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = [name for name in subfolders if name not in OUTPUTS]
            for name in names:
                path = os.path.join(folder, name)
                if not os.path.isfile(path):
                    continue  # opening a FIFO would wait for a writer
                try:
                    with open(path, "rb", buffering=0) as handle:
                        while block := handle.read(WARM_BLOCK):
                            total += len(block)
                except OSError:
                    continue  # unreadable: the build reports it
    return total


def h5etl_here(args: Sequence[str]) -> None:
    """``h5etl ARGS`` in this process, as its entry point runs it; a failure raises."""
    from h5etl.cli.app import main

    argv = sys.argv
    sys.argv = ["h5etl", *args]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"h5etl {' '.join(args)} failed ({exc.code})") from exc
    finally:
        sys.argv = argv


def exec_child(code: str, args: Sequence[str], cwd: Path | None = None) -> str:
    """What ``python -c CODE ARGS`` (run in ``cwd``) prints, run in this process."""
    text, argv = io.StringIO(), sys.argv
    sys.argv = ["-c", *args]
    try:
        with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(text):
            exec(code, {"__name__": "__main__"})
    finally:
        sys.argv = argv
    return text.getvalue()
