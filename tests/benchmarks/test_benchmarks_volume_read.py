"""volume_bench.py and read_release.py run end to end on tiny inputs, so they cannot rot
unseen (no test ran them; the other scripts each have one). No timings are asserted."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

from conftest import MakeRaw, WriteConfig

from h5etl.config.load import load_spec
from h5etl.pipeline.run import build

BENCH = Path(__file__).parent


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_volume_bench_builds_dicom_cases_and_compares_with_its_limit(tmp_path: Path) -> None:
    text = _run(
        str(BENCH / "volume_bench.py"), "--dir", str(tmp_path), "--cases", "2",
        "--slices", "8", "--size", "32", "--repeats", "1", "--patches", "4",
    )  # fmt: skip
    assert "| build / limit throughput (ratio of the medians) | **" in text
    assert "| random 3-D patches (64, 128, 128) per s: release |" in text
    assert "| on disk: DICOM inputs |" in text


def test_the_volume_limit_compresses_chunks_of_several_slices_itself(tmp_path: Path) -> None:
    # with --chunks of several slices the kind hands the voxels over whole (the writer cuts
    # them): the limit crashed expecting them encoded
    import volume_bench

    root = volume_bench.ensure_corpus(tmp_path, 2, 6, 32, npy=False)
    volume_bench.write_config(root, 32, (4, 16, 16))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        volume_bench.run_limit(root, 1)
    assert json.loads(printed.getvalue())["stored"] > 0


def test_the_release_read_bench_reads_a_real_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=12)
    report = build(load_spec(write_config(tmp_path)), jobs=1)
    assert report.path is not None
    text = _run(
        str(BENCH / "read_release.py"), str(report.path), "--probes", "20", "--warmup", "2",
        "--epochs", "1", "--dir", str(tmp_path / "bench"),
    )  # fmt: skip
    assert "| Release.read |" in text
    assert "| np.load(mmap_mode='r') |" in text
