"""The benchmark scripts run end to end on a tiny corpus, so they cannot rot; no timings."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import h5etl

BENCH = Path(__file__).parent / "benchmarks"
SAMPLES = "40"

CONTENDERS = [
    "h5etl build -j1 (lzf)",
    "h5etl build -j2 (lzf)",
    "serial loop (lzf, h5py's automatic chunks)",
    "serial loop (lzf, one chunk per batch of 32)",
    "work limit: decode+pad+lzf, all cores",
    "work limit: decode+pad+blosc-lz4, all cores",
    "work limit with the required SHA-256: decode+pad+lzf+hashes, all cores",
    "decode limit: decode+pad, all cores",
    "disk limit: same bytes, sequential+fsync",
    "h5etl API -j2 (lzf, writer CPU)",
    "h5etl build -j2 (gzip)",
    "h5etl build -j2 (blosc-lz4)",
    "h5etl build -j2 (zstd)",
]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench")


def test_corpus_is_written_once_then_cached(bench_dir: Path) -> None:
    first = _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES, "-j", "2")
    root = next(bench_dir.glob("corpus-n40-*"))
    assert len(list((root / "images").glob("*.png"))) == 40
    assert len(list((root / "masks").glob("*.png"))) == 40
    for codec in ("lzf", "gzip", "blosc-lz4", "zstd"):
        assert (root / f"{codec}.yaml").exists()
    stamp = (root / "images" / "s000000.png").stat().st_mtime_ns
    second = _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES)
    assert (root / "images" / "s000000.png").stat().st_mtime_ns == stamp
    assert first.splitlines()[0].split("(")[0] == second.splitlines()[0].split("(")[0]


def test_runner_prints_every_contender(bench_dir: Path) -> None:
    output = bench_dir / "tables.md"
    text = _run(
        "build.py",
        "--dir",
        str(bench_dir),
        "--samples",
        SAMPLES,
        "--repeats",
        "1",
        "--output",
        str(output),
        "--variant",
        f"same={BENCH.parents[1]}",
    )
    for name in CONTENDERS:
        assert f"| {name} |" in text
    for codec in ("lzf", "gzip", "blosc-lz4", "zstd"):
        assert f"| {codec} |" in text
    assert "h5etl -j2 lzf / work limit" in text
    assert "h5etl -j2 blosc-lz4 / its work limit" in text
    assert "h5etl -j2 lzf / work limit with the SHA-256 a release must carry" in text
    assert f"h5etl {h5etl.__version__} from" in text
    assert "| h5etl build -j2 (lzf) [same] |" in text
    assert "-j2 lzf [same] / -j2 lzf (tree as is)" in text
    assert "parent busy during decode+write" in text
    assert output.read_text() in text


def test_both_serial_loops_store_the_same_pixels(bench_dir: Path) -> None:
    import h5py
    import numpy as np

    _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES)
    root = next(bench_dir.glob("corpus-n40-*"))
    stored = {}
    for chunks in ("auto", "batch"):
        out = bench_dir / f"serial-{chunks}.h5"
        _run(
            "build.py",
            "--run",
            "serial",
            "--corpus",
            str(root),
            "--out",
            str(out),
            "--chunks",
            chunks,
        )
        with h5py.File(out, "r") as f:
            stored[chunks] = (f["image"][:], f["mask"][:], f["image"].chunks)
    assert stored["batch"][2] == (32, 3, 224, 224)
    assert stored["auto"][2] != stored["batch"][2]  # h5py's guess, what tutorials get
    assert stored["auto"][0].shape == (40, 3, 224, 224)
    np.testing.assert_array_equal(stored["auto"][0], stored["batch"][0])
    np.testing.assert_array_equal(stored["auto"][1], stored["batch"][1])
    assert set(np.unique(stored["auto"][1])) <= {0, 1}


def _load_corpus_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_corpus", BENCH / "corpus.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def test_corpus_pairs_are_deterministic() -> None:
    corpus = _load_corpus_module()
    params = corpus.CorpusParams(samples=4)
    image, mask = corpus.make_pair(0, 3, params)
    again_image, again_mask = corpus.make_pair(0, 3, params)
    assert (image == again_image).all()
    assert (mask == again_mask).all()
    assert set(mask.flatten().tolist()) <= {0, 255}
    assert image.ndim == 3
    assert image.shape[2] == 3
    assert max(image.shape[:2]) <= corpus.FIELD_SIZE
