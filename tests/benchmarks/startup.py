"""Start-up benchmark: how long the ``h5etl`` commands take to answer, and what they import.

    python tests/benchmarks/startup.py                 # 20 runs of each command
    python tests/benchmarks/startup.py --runs 50 --output startup.md
    python tests/benchmarks/startup.py --variant before=/tmp/h5etl-old   # A/B, interleaved

Builds the demo (``h5etl demo``) in a scratch folder, then runs each quick command ``--runs``
times (interleaved: every command once, then again) and prints the median wall of each, beside
the floors no change to h5etl can go below: Python itself, and Python importing typer (the
command line's parser). A second table runs each command once under ``python -X importtime``
(``build`` too: a real build of the demo) and shows how many modules it imports, what the
imports cost, and which heavy libraries and h5etl packages it loaded: a command should import
only what it uses (``status`` no pydantic or Pillow; ``--help`` none of them).

Commands run as the ``h5etl`` console script beside this Python when there is one (what users
run), else ``python -m h5etl``; ``PYTHONPATH`` picks the h5etl measured, and the header names
it. ``--variant NAME=PYTHONPATH`` (repeatable) also runs another source tree, each of its runs
right after the same run of the tree as is, so both see the same load. A benchmark, not a
test: it prints times and never asserts them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Libraries a command should load only when it needs them, and h5etl's heavier packages.
WATCHED = (
    "pydantic",
    "yaml",
    "numpy",
    "h5py",
    "hdf5plugin",
    "imagecodecs",
    "PIL",
    "joblib",
    "tqdm",
    "dask",
    "distributed",
    "torch",
    "scipy",
    "pydicom",
    "nibabel",
    "h5etl.config",
    "h5etl.kinds",
    "h5etl.pipeline.run",
    "h5etl.sink",
    "h5etl.report_html",
    "h5etl.preview",
)


@dataclass(frozen=True, slots=True)
class Imports:
    """One process's imports, from ``-X importtime``."""

    count: int
    seconds: float  # the sum of the top-level imports' cumulative times
    loaded: frozenset[str]
    heaviest: tuple[tuple[str, float], ...]  # top-level imports by cumulative seconds


def h5etl_command() -> list[str]:
    script = Path(sys.executable).parent / "h5etl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "h5etl"]


def parse_importtime(stderr: str, top: int = 6) -> Imports:
    """The lines ``import time: self | cumulative | name`` (two-space indents nest)."""
    names, roots = [], []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        names.append(name.strip())
        if name.startswith(" ") and not name.startswith("   "):  # one space: top level
            roots.append((name.strip(), int(cumulative) / 1e6))
    heaviest = tuple(sorted(roots, key=lambda item: -item[1])[:top])
    loaded = frozenset(w for w in WATCHED if any(n == w or n.startswith(w + ".") for n in names))
    return Imports(len(names), sum(s for _, s in roots), loaded, heaviest)


Env = dict[str, str] | None


def imports_of(args: Sequence[str], cwd: Path, env: Env = None) -> Imports:
    cmd = [sys.executable, "-X", "importtime", "-m", "h5etl", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd, env=env)
    return parse_importtime(done.stderr)


def wall(cmd: Sequence[str], cwd: Path, env: Env = None) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False, cwd=cwd, env=env)
    return time.perf_counter() - started


def demo(folder: Path) -> dict[str, list[str]]:
    """The demo built in ``folder``; each command measured, with its arguments."""
    subprocess.run(
        [*h5etl_command(), "demo", "--dir", str(folder), "--quiet", "--jobs", "1"],
        check=True,
        capture_output=True,
    )
    config = next(folder.glob("*.yaml"))
    releases = folder / "releases"
    link = next(p for p in releases.glob("*.h5") if p.is_symlink())
    return {
        "--version": ["--version"],
        "--help": ["--help"],
        "build --help": ["build", "--help"],
        "validate CONFIG": ["validate", str(config)],
        "check RELEASE": ["check", str(link)],
        "status OUTPUT": ["status", str(releases)],
        "releases FOLDER": ["releases", str(releases)],
        "build CONFIG (unchanged: nothing to do)": ["build", str(config), "--quiet", "-j", "1"],
        "build CONFIG --full -j1": ["build", str(config), "--full", "--quiet", "-j", "1"],
    }


FLOORS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
}
TIMED_OUT = ("build CONFIG --full -j1",)  # too slow to repeat here: imports only


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _trees(variants: Sequence[str]) -> dict[str, Env]:
    """The tree as is (``PYTHONPATH`` as given), then each ``NAME=PYTHONPATH``."""
    trees: dict[str, Env] = {"": None}
    for variant in variants:
        name, path = variant.split("=", 1)
        trees[f" [{name}]"] = {**os.environ, "PYTHONPATH": path}
    return trees


def run(runs: int, variants: Sequence[str] = ()) -> str:
    folder = Path(tempfile.mkdtemp(prefix="h5etl-startup-"))
    trees = _trees(variants)
    try:
        commands = demo(folder / "demo")
        base = h5etl_command()
        cmds: dict[str, tuple[list[str], Env]] = {k: (v, None) for k, v in FLOORS.items()}
        for name, args in commands.items():
            if name not in TIMED_OUT:
                cmds.update({name + tag: ([*base, *args], env) for tag, env in trees.items()})
        walls: dict[str, list[float]] = {name: [] for name in cmds}
        load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
        for _ in range(runs):
            for name, (cmd, env) in cmds.items():
                walls[name].append(wall(cmd, folder, env))
        imports = {
            name + tag: imports_of(args, folder, env)
            for name, args in commands.items()
            for tag, env in trees.items()
        }
        load += f" before, {' / '.join(f'{v:.2f}' for v in os.getloadavg())} after"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _tables(walls, imports, runs, load)


def _tables(
    walls: dict[str, list[float]], imports: dict[str, Imports], runs: int, load: str
) -> str:
    import h5etl

    lines = [
        f"## h5etl start-up\n\n{' '.join(h5etl_command())} ({h5etl.__file__}), median of "
        f"{runs} interleaved runs; load average (1/5/15 min) {load}.\n",
        "| command | median ms | min ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for name, values in walls.items():
        lines.append(
            f"| {name} | {_ms(statistics.median(values))} | {_ms(min(values))} "
            f"| {_ms(max(values))} |"
        )
    lines += [
        "",
        "| command (`python -X importtime -m h5etl ...`) | modules | import ms "
        "| watched libraries and packages loaded | heaviest top-level imports (ms) |",
        "|---|---:|---:|---|---|",
    ]
    for name, found in imports.items():
        heavy = ", ".join(f"{n} {_ms(s)}" for n, s in found.heaviest)
        lines.append(
            f"| {name} | {found.count} | {_ms(found.seconds)} "
            f"| {', '.join(sorted(found.loaded)) or '-'} | {heavy} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each command")
    parser.add_argument("--output", type=Path, help="also write the tables here")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="also run the h5etl found on PYTHONPATH, interleaved (A/B a change); repeatable",
    )
    args = parser.parse_args(argv)
    text = run(args.runs, args.variant)
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
