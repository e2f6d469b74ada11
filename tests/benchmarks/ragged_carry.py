"""Carrying and stitching ragged columns: CT volumes built fully, incrementally and sharded.

The corpus is ``volume_bench.py``'s (DICOM series of int16 slices, cached under ``--dir``,
here without the raw ``.npy`` copies). Each repeat runs these builds, each ``h5etl build``
in its own process (interpreter start and imports included), one after another:

    full        a fresh output folder: every case decoded                     (v1)
    unchanged   the same inputs again, with new notes (without, the build is up
                to date and publishes nothing): every case's chunks copied    (v2)
    one touched the files of one case touched (its stamp changes): that case
                decoded again, the others' chunks copied                      (v3)
    --full      the same inputs with --full: every case decoded              (v4)
    shards 2    a fresh output folder, ``--shards 2``: the stitch copies the shards' chunks

and the table gives the medians over the repeats and each build's ratio to ``full`` (and of
``one touched`` to ``--full``, the same work without carrying).

    python tests/benchmarks/ragged_carry.py [--cases 8] [--slices 120] [--size 512] \
        [--repeats 3] [--jobs 2] [--dir /tmp/h5etl-ragged-carry-bench]

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): each build's child code
runs in this process instead (h5etl imported once), from its arguments to its JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from installed import exec_child

HERE = Path(__file__).resolve()
DEFAULT_DIR = Path(os.environ.get("H5ETL_BENCH_DIR", "/tmp/h5etl-ragged-carry-bench"))
Run = tuple[float, float, int]  # process wall s, build call s, cases carried
SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"
STEPS = ("full", "unchanged", "one touched", "--full", "shards 2")


CHILD = """
import json, sys, time
import h5etl
spec = h5etl.load_spec(sys.argv[1])
extra = json.loads(sys.argv[3])
if "notes" in extra:  # a new release of the same inputs (else: up to date, no release)
    spec = spec.model_copy(update={"notes": extra.pop("notes")})
begun = time.perf_counter()
report = h5etl.build(spec, jobs=int(sys.argv[2]), **extra)
print(json.dumps({"build": time.perf_counter() - begun, "reused": report.reused}))
"""


def _build(root: Path, jobs: int, **extra: object) -> tuple[float, dict[str, object]]:
    """One build in a child process (imports and workers' start included): its wall time
    and what it carried."""
    args = [str(root / "bench.yaml"), str(jobs), json.dumps(extra)]
    started = time.perf_counter()
    if SMOKE:
        out = exec_child(CHILD, args)
    else:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, *args], check=True, capture_output=True, text=True
        )
        out = done.stdout
    wall = time.perf_counter() - started
    found: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return wall, found


def _touch(folder: Path) -> None:
    now = time.time()
    for path in sorted(folder.iterdir()):
        os.utime(path, (now, now))


def repeat(root: Path, jobs: int) -> dict[str, Run]:
    out: dict[str, Run] = {}
    shutil.rmtree(root / "releases", ignore_errors=True)
    out["full"] = _wall(_build(root, jobs))
    out["unchanged"] = _wall(_build(root, jobs, notes="the same cases again"))
    _touch(sorted((root / "raw" / "ct").iterdir())[0])
    out["one touched"] = _wall(_build(root, jobs))
    out["--full"] = _wall(_build(root, jobs, full=True))
    shutil.rmtree(root / "releases", ignore_errors=True)
    out["shards 2"] = _wall(_build(root, jobs, shards=2))
    return out


def _wall(found: tuple[float, dict[str, object]]) -> Run:
    wall, summary = found
    build, reused = summary["build"], summary["reused"]
    assert isinstance(build, float)
    assert isinstance(reused, int)
    return wall, build, reused


def table(results: list[dict[str, Run]], cases: int) -> str:
    def median(step: str, index: int) -> float:
        return statistics.median(r[step][index] for r in results)

    lines = [
        "| build | process s | / full | build call s | / full | cases carried |",
        "|---|---|---|---|---|---|",
    ]
    for step in STEPS:
        wall, call = median(step, 0), median(step, 1)
        ratios = f"{wall / median('full', 0):.2f} | {call:.2f} | {call / median('full', 1):.2f}"
        lines.append(f"| {step} | {wall:.2f} | {ratios} | {results[-1][step][2]} of {cases} |")
    touched = [median("one touched", i) / median("--full", i) for i in (0, 1)]
    lines.append(f"| one touched / --full | | {touched[0]:.2f} | | {touched[1]:.2f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--slices", type=int, default=120)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from installed import byte_compile
    from volume_bench import ensure_corpus, write_config

    byte_compile()

    root = ensure_corpus(args.dir, args.cases, args.slices, args.size, npy=False)
    write_config(root, args.size, None)
    results = [repeat(root, args.jobs) for _ in range(args.repeats)]
    print(
        f"{args.cases} cases of {args.slices} x {args.size}^2 int16 DICOM slices, "
        f"--jobs {args.jobs}, {args.repeats} repeats"
    )
    print(table(results, args.cases))


if __name__ == "__main__":
    main()
