"""Measure h5etl as it runs installed: its modules byte-compiled.

pip compiles a package's modules when it installs it, and a checkout installed editable writes
them on first import. With ``PYTHONDONTWRITEBYTECODE`` set (some CI and sandbox shells set it)
neither happens, and every process of every build compiles h5etl from source again: about
0.15 s of CPU in the parent and as much again in each worker, for every build, which a work
limit importing little of h5etl does not pay. So each benchmark byte-compiles the trees it
measures first (into their ``__pycache__``, as an install would), whatever the shell says.
"""

from __future__ import annotations

import compileall
from collections.abc import Iterable
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
