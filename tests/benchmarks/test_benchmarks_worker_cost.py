"""worker_cost.py runs end to end on a tiny corpus, so it cannot rot; it asserts no timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent  # the scripts beside these tests
STEPS = ("libpng decode", "compress", "sha256 (files, chunks, rows)", "statistics", "other")


def test_prints_each_codecs_steps_for_h5etl_and_the_honest_limit(tmp_path: Path) -> None:
    # -j 1: no pool to start for 24 pairs (test_benchmarks_smoke.py writes one with -j 2)
    make = [sys.executable, str(BENCH / "corpus.py"), "--dir", str(tmp_path), "--samples", "24"]
    corpus = subprocess.run(
        [*make, "-j", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert corpus.returncode == 0, corpus.stderr
    (root,) = (p for p in tmp_path.iterdir() if p.name.startswith("corpus-n24-"))
    args = ["--corpus", str(root), "--samples", "24", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, str(BENCH / "worker_cost.py"), *args, "--profile", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for codec in ("lzf", "blosc-lz4"):
        table = done.stdout.split(f"### {codec}:", 1)[1].split("###", 1)[0]
        assert "| step | h5etl | honest |" in table
        for step in STEPS:
            assert f"| {step} | " in table
        assert "| **total, plain** | " in table
        assert "honest / h5etl (per-sample CPU, the limit's share): **" in table
        assert "decode_batch" in (tmp_path / f"p-{codec}.txt").read_text()  # h5etl's worker
