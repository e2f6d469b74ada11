"""Reproducible bytes on the bench corpus: build it several times and compare the files.

Each build is ``h5etl build CONFIG --jobs N --quiet`` in a child process, from its own copy of
the corpus's config in its own scratch folder (another folder every time), ``--jobs`` 2 and 1
in turn, with ``SOURCE_DATE_EPOCH`` set (``--epoch``; ``--epoch ''`` leaves it unset, and then
only ``created_at`` may differ). The table gives each build's size, SHA-256 and wall time, and
whether the builds of one tree are byte-identical. ``--variant NAME=PYTHONPATH`` (repeatable)
builds with another h5etl tree as well, e.g. the commit before reproducible builds:

    python tests/benchmarks/reproducible.py                          # 3000 pairs, 2 builds
    mkdir -p /tmp/old && git archive 67a7f29 h5etl pipelines configs | tar -x -C /tmp/old
    python tests/benchmarks/reproducible.py --builds 3 --variant old=/tmp/old

Nothing here asserts a time; ``tests/benchmarks/test_benchmarks_smoke.py`` runs it on a tiny corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from corpus import DEFAULT_SAMPLES, CorpusParams, ensure_corpus

DEFAULT_EPOCH = "1700000000"


@dataclass(frozen=True, slots=True)
class Built:
    tree: str
    jobs: int
    size: int
    sha256: str
    wall: float
    differing: int | None  # bytes that differ from its tree's first build; None: other size


def _config(source: Path, scratch: Path) -> Path:
    """The corpus config, its sources absolute, building into ``scratch/releases``."""
    data = yaml.safe_load(source.read_text("utf-8"))
    for entry in data["sources"].values():
        entry["dir"] = str((source.parent / entry["dir"]).resolve())
    data["output"] = "releases"
    scratch.mkdir(parents=True)
    config = scratch / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return config


def build_once(
    source: Path,
    scratch: Path,
    jobs: int,
    env: dict[str, str],
    tree: str,
    first: np.ndarray | None,
) -> tuple[Built, np.ndarray]:
    config = _config(source, scratch)
    started = time.perf_counter()
    subprocess.run(
        ["h5etl", "build", str(config), "--jobs", str(jobs), "--quiet"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    (release,) = [p for p in (scratch / "releases").glob("*.h5") if not p.is_symlink()]
    data = release.read_bytes()
    array = np.frombuffer(data, dtype=np.uint8)
    if first is None:
        differing: int | None = 0
    else:
        differing = int(np.count_nonzero(array != first)) if len(first) == len(array) else None
    built = Built(tree, jobs, len(data), hashlib.sha256(data).hexdigest(), wall, differing)
    shutil.rmtree(scratch)
    return built, array


def table(builds: list[Built]) -> list[str]:
    lines = [
        "| tree | build | --jobs | bytes | SHA-256 (first 16) | bytes unlike its tree's first"
        " | wall, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, b in enumerate(builds):
        unlike = "other size" if b.differing is None else f"{b.differing:,}"
        lines.append(
            f"| {b.tree} | {index + 1} | {b.jobs} | {b.size:,} | {b.sha256[:16]} | {unlike} "
            f"| {b.wall:.1f} |"
        )
    lines.append("")
    for tree in dict.fromkeys(b.tree for b in builds):
        mine = [b for b in builds if b.tree == tree]
        sizes = "equal" if len({b.size for b in mine}) == 1 else "differ"
        same = "yes" if len({b.sha256 for b in mine}) == 1 else "no"
        lines.append(f"{tree}: {len(mine)} builds, sizes {sizes}, byte-identical: {same}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "h5etl-bench"
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--codec", default="lzf")
    parser.add_argument("--builds", type=int, default=2, help="builds per tree (jobs 2, 1, 2...)")
    parser.add_argument("--epoch", default=DEFAULT_EPOCH, help="SOURCE_DATE_EPOCH ('' unsets it)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH")
    args = parser.parse_args(argv)
    corpus = ensure_corpus(args.dir, CorpusParams(samples=args.samples))
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    if args.epoch:
        env["SOURCE_DATE_EPOCH"] = args.epoch
    trees = [("as is", env)]
    for variant in args.variant:
        name, _, path = variant.partition("=")
        trees.append((name, {**env, "PYTHONPATH": path}))
    scratch = args.dir / "work" / f"reproducible-{os.getpid()}"
    builds = []
    firsts: dict[str, np.ndarray] = {}
    for index in range(args.builds):  # interleaved: each tree's builds meet the same machine
        jobs = 2 if index % 2 == 0 else 1
        for name, tree_env in trees:
            target = scratch / f"{name.replace(' ', '-')}-{index}"
            source = corpus.config(args.codec)
            built, data = build_once(source, target, jobs, tree_env, name, firsts.get(name))
            firsts.setdefault(name, data)
            builds.append(built)
    shutil.rmtree(scratch, ignore_errors=True)
    epoch = f"SOURCE_DATE_EPOCH={args.epoch}" if args.epoch else "SOURCE_DATE_EPOCH unset"
    print(f"### Reproducible bytes: {args.samples} pairs, {args.codec}, {epoch}\n")
    print("\n".join(table(builds)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
