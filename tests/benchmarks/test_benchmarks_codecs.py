"""The codec benchmark runs end to end on a tiny corpus, so it cannot rot; no timings."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import h5etl
from h5etl import load_spec

BENCH = Path(__file__).parent  # the scripts beside these tests


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / "codec_bench.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, "H5ETL_BENCH_SMOKE": "1"},  # no figure meant: builds and reads here
    )


def _load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """codec_bench.py as a module."""
    monkeypatch.syspath_prepend(str(BENCH))  # it imports its neighbours build and corpus
    spec = importlib.util.spec_from_file_location("bench_codecs", BENCH / "codec_bench.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_runner_measures_the_candidates_against_the_default(tmp_path: Path) -> None:
    output = tmp_path / "codecs.md"
    args = ["--dir", str(tmp_path), "--samples", "40", "--repeats", "1", "--output", str(output)]
    args += ["--min-seconds", "0", "--probes", "5"]  # one epoch of each read, five random reads
    done = _run(*args, "--candidates", "blosc-lz4", "--chunks", "8")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert output.read_text() in text
    assert f"h5etl {h5etl.__version__} from" in text
    assert text.count("load average:") == 2  # uptime before and after
    main, ratios, per_repeat = text.split("\n\n| codec |")[1:4]
    for table in (main, ratios, per_repeat):
        rows = [line.split(" | ")[:2] for line in table.splitlines()[2:] if line.startswith("|")]
        # the default lzf/32 is measured even when not asked for, first
        assert rows == [["| lzf", "32"], ["| blosc-lz4", "8"]]
    baseline = next(line for line in ratios.splitlines() if line.startswith("| lzf | 32 |"))
    assert baseline.count("| 1.00x") == 8  # every ratio of the default against itself
    assert "| h5py; elsewhere the LZF filter plugin" in main  # each codec's portability
    assert "| hdf5plugin in Python; elsewhere the Blosc filter plugin" in main
    corpus = next(tmp_path.glob("corpus-n40-*"))
    assert not list((corpus / "releases" / "codecs").iterdir())  # each release deleted after


def test_every_candidate_config_loads_with_its_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _load(monkeypatch)
    corpus = bench.Corpus(tmp_path, bench.CorpusParams(samples=40))
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    for name in bench.CANDIDATES:
        for chunk in (8, 32):
            spec = load_spec(bench.write_config(corpus, name, chunk))
            storage = spec.storage
            assert storage.chunk_samples == chunk
            codec, *rest = name.split("-")
            assert storage.compression.codec == codec
            level = int(rest[-1]) if rest and rest[-1].isdigit() else None
            if level is not None:
                assert storage.compression.effective_level == level
            if codec == "blosc":
                assert storage.compression.cname == rest[0]
                assert storage.compression.blosc_shuffle == "byte"
            assert spec.output == tmp_path / "releases" / "codecs" / f"{name}-c{chunk}"


def test_an_unknown_candidate_is_a_usage_error(tmp_path: Path) -> None:
    done = _run("--dir", str(tmp_path), "--candidates", "lz5")
    assert done.returncode == 2
    assert "invalid choice: 'lz5'" in done.stderr
    assert not list(tmp_path.iterdir())  # refused before any corpus is written
