"""The benchmark scripts run end to end on a tiny corpus, so they cannot rot; no timings."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import h5etl

BENCH = Path(__file__).parent  # the scripts beside these tests
SAMPLES = "40"

CONTENDERS = [
    "h5etl build -j1 (lzf)",
    "h5etl build -j2 (lzf)",
    "h5etl build -j2 (lzf, messy corpus)",
    "serial loop (lzf, h5py's automatic chunks)",
    "serial loop (lzf, one chunk per batch of 32)",
    "work limit: decode+pad+lzf, all cores",
    "work limit: decode+pad+blosc-lz4, all cores",
    "work limit with what a release carries (SHA-256, statistics): decode+pad+lzf+hashes+stats",
    "work limit with what a release carries (SHA-256, statistics): decode+pad+blosc-lz4+hashes"
    "+stats",
    "honest work limit, no h5etl imported: decode+pad+lzf+hashes+stats",
    "honest work limit, no h5etl imported: decode+pad+blosc-lz4+hashes+stats",
    "decode limit: decode+pad, all cores",
    "disk limit: same bytes, sequential+fsync",
    "h5etl API -j2 (lzf, writer CPU)",
    "h5etl API -j2 (lzf, messy corpus, writer CPU)",
    "h5etl build -j2 (blosc-lz4)",
    "h5etl build -j2 (lzf, chunks of 1)",
    "h5etl build -j2 (lzf, chunks of 32)",
]
# H5ETL_BENCH_SMOKE=1 (the runner's smoke run): of the codec builds lzf and blosc-lz4, of the
# chunk sweep 1 and 32; a full run adds gzip, zstd, 8 and 64 (the same contenders, other configs)
SMOKE_ENV = {**os.environ, "H5ETL_BENCH_SMOKE": "1"}
# --gap --variant same=...: -j2 against the work limits; each h5etl run is followed by the
# same run of the variant tree (the messy corpus's rows are the default run's)
GAP_WITH_VARIANT = [
    "h5etl build -j2 (lzf)",
    "h5etl build -j2 (lzf) [same]",
    "work limit with what a release carries (SHA-256, statistics): decode+pad+lzf+hashes+stats",
    "work limit with what a release carries (SHA-256, statistics): decode+pad+blosc-lz4+hashes"
    "+stats",
    "honest work limit, no h5etl imported: decode+pad+lzf+hashes+stats",
    "honest work limit, no h5etl imported: decode+pad+blosc-lz4+hashes+stats",
    "honest work limit that also writes its chunks to disk (blosc-lz4)",
    "h5etl API -j2 (lzf, writer CPU)",
    "h5etl API -j2 (lzf, writer CPU) [same]",
    "h5etl build -j2 (blosc-lz4)",
    "h5etl build -j2 (blosc-lz4) [same]",
]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=SMOKE_ENV,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _clean_root(bench_dir: Path) -> Path:
    name = _load_corpus_module().CorpusParams(samples=int(SAMPLES)).folder_name
    return bench_dir / str(name)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench")


def test_corpus_is_written_once_then_cached(bench_dir: Path) -> None:
    first = _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES, "-j", "2")
    root = _clean_root(bench_dir)
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
        "build.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--repeats", "1",
        "--output", str(output),
    )  # fmt: skip
    assert _contenders(text) == CONTENDERS
    for codec in ("lzf", "blosc-lz4"):
        assert f"| {codec} |" in text
    assert "h5etl -j2 lzf / work limit" in text
    assert "h5etl -j2 blosc-lz4 / its work limit" in text
    assert "h5etl -j2 lzf / work limit with the SHA-256 and statistics a release carries" in text
    assert f"h5etl {h5etl.__version__} from" in text
    assert "parent busy during decode+write" in text
    assert "re-cut and compressed (chunk_paths :rechunked, target 0) | 0 |" in text
    assert "### Messy corpus" in text
    assert "| **per stored sample: messy / clean** |" in text
    # the build drops the one spoiled pair at decode, and no block is compressed twice
    assert "| stored samples, clean / messy | 40 / 39 | - |" in text
    assert "by reason | 1 mask_values | all mask_values |" in text
    assert "| blocks the writer re-cut and compressed, clean / messy (API) | 0 / 0 | 0 |" in text
    # issue 30: h5etl against the limit that imports none of it, per codec
    for codec in ("lzf", "blosc-lz4"):
        assert f"| h5etl -j2 {codec} / honest limit ({codec}) |" in text
    for chunks in (1, 32):
        assert f"| tree as is | {chunks} |" in text
    assert output.read_text() in text


def _contenders(text: str) -> list[str]:
    """The first column of the main table, in order."""
    table = text.split("| contender |", 1)[1].split("\n\n", 1)[0]
    return [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]]


def test_flags_pick_rows_and_variants_follow_each_run(bench_dir: Path) -> None:
    # before --messy, --sweep, --gap every run built all contenders, with no messy corpus
    text = _run(
        "build.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--repeats", "1",
        "--gap", "--variant", f"same={BENCH.parents[1]}",
    )  # fmt: skip
    assert _contenders(text) == GAP_WITH_VARIANT
    assert "### Messy corpus" not in text
    assert "| writer (parent) process, h5etl -j2 lzf, medians | tree as is | same |" in text
    assert "(chunk_paths :rechunked, target 0) | 0 | 0 |" in text
    assert "### Chunk sweep" not in text
    for codec in ("lzf", "blosc-lz4"):
        assert f"| h5etl -j2 {codec} / honest limit ({codec}) |" in text
        assert f"-j2 {codec} [same] / honest limit ({codec})" in text
    assert "| h5etl -j2 blosc-lz4 / honest limit that writes (blosc-lz4) |" in text


def test_messy_copy_spoils_three_percent_of_masks_and_links_the_rest(bench_dir: Path) -> None:
    import numpy as np
    from PIL import Image

    out = _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--messy")
    root = _clean_root(bench_dir)
    messy = bench_dir / f"{root.name}-messy0.03"
    assert f"messy copy: {messy} (1 masks with a pixel of 7)" in out
    changed = []
    for kind in ("images", "masks"):
        for path in sorted((root / kind).iterdir()):
            copy = messy / kind / path.name
            if copy.stat().st_ino != path.stat().st_ino:
                changed.append(copy)
    assert [p.name for p in changed] == ["s000022.png"]  # round(3% of 40), by seeded hash
    assert changed[0].parent.name == "masks"
    clean = np.asarray(Image.open(root / "masks" / "s000022.png"))
    spoiled = np.asarray(Image.open(changed[0]))
    assert spoiled.shape == clean.shape
    assert (spoiled != clean).sum() == 1
    assert set(np.unique(spoiled)) - {0, 255} == {7}
    assert (messy / "lzf.yaml").exists()
    assert (messy / "lzf-chunks8.yaml").exists()
    stamp = changed[0].stat().st_mtime_ns
    _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--messy")
    assert changed[0].stat().st_mtime_ns == stamp  # cached


def test_runner_makes_a_missing_corpus_in_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Made in the runner, the corpus's pool and resource trackers stayed its children, and
    # measure() waited 30 s after every run for them to exit (ten minutes for a tiny run).
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_build", BENCH / "build.py")
    assert spec is not None
    assert spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, build)
    spec.loader.exec_module(build)
    before = _children()  # another test's worker pool may live on here (it idles 60 s)
    corpus = build._corpus(tmp_path, 4)
    assert len(list(corpus.images.glob("*.png"))) == 4
    assert _children() - before == set()


def test_a_full_run_holds_every_codec_and_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the smoke run leaves out gzip, zstd and chunks of 8 and 64; a real run must not
    monkeypatch.delenv("H5ETL_BENCH_SMOKE", raising=False)
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_build_full", BENCH / "build.py")
    assert spec is not None
    assert spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, build)
    spec.loader.exec_module(build)
    corpus = build.Corpus(tmp_path, build.CorpusParams(samples=4))
    names = [c.name for c in build.contenders(corpus, tmp_path, {}, {}, messy=corpus)]
    smoke_left_out = [
        "h5etl build -j2 (gzip)",
        "h5etl build -j2 (zstd)",
        "h5etl build -j2 (lzf, chunks of 8)",
        "h5etl build -j2 (lzf, chunks of 64)",
    ]
    assert sorted(names) == sorted(CONTENDERS + smoke_left_out)


def _children() -> set[int]:
    """This process's child processes, running or not yet reaped (Linux: /proc)."""
    return {
        int(pid)
        for listed in Path("/proc/self/task").glob("*/children")
        for pid in listed.read_text().split()
    }


def test_both_serial_loops_store_the_same_pixels(bench_dir: Path) -> None:
    import h5py
    import numpy as np

    _run("corpus.py", "--dir", str(bench_dir), "--samples", SAMPLES)
    root = _clean_root(bench_dir)
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


def test_kinds_bench_compares_each_build_with_its_work_limit(tmp_path: Path) -> None:
    import h5py
    import numpy as np

    text = _run(
        "kinds_bench.py", "--dir", str(tmp_path), "--samples", "24", "--classes", "3",
        "--repeats", "1",
    )  # fmt: skip
    root = tmp_path / "classes-n24-c3-s0-v1"
    folders = sorted(p.name for p in (root / "images").iterdir())
    assert folders == ["airplane", "automobile", "bird"]
    assert [len(list((root / "images" / f).glob("*.jpg"))) for f in folders] == [8, 8, 8]
    for row in (
        "| h5etl build -j2 (classification: image + label from folder) |",
        "| h5etl build -j2 (super-resolution: high + low derived, bicubic x4) |",
        "| work limit: read+SHA-256+decode+fit+pad+stats+compress+block SHA-256, all cores "
        "(classification) |",
        "| work limit: read+SHA-256+decode+derive+pad+stats+compress+block SHA-256, all cores "
        "(super-resolution) |",
        "| h5etl build -j2 / work limit (classification) |",
        "| h5etl build -j2 / work limit (superres) |",
        "| images per CPU-s, build / work limit (classification) |",
    ):
        assert row in text
    assert f"h5etl {h5etl.__version__} from" in text
    # the build stored every photo with its folder's class; the limit did the same samples
    release = sorted((root / "releases" / "classification").glob("*.h5"))[-1]
    with h5py.File(release, "r") as f:
        labels = np.concatenate([f["train/label"][:], f["valid/label"][:]])
        assert labels.dtype == np.int64
        assert np.bincount(labels).tolist() == [8, 8, 8]
        assert f["train/image"].shape[1:] == (3, 224, 224)
    limit = _run("kinds_bench.py", "--run", "limit", "--config", str(root / "superres.yaml"))
    assert json.loads(limit.splitlines()[-1]) == {"samples": 24, "blocks": 2}  # train, valid


def test_kinds_bench_photos_are_deterministic(tmp_path: Path) -> None:
    digests = []
    for copy in ("a", "b"):
        args = ("--dir", str(tmp_path / copy), "--samples", "6", "--classes", "2")
        _run("kinds_bench.py", "--run", "corpus", *args)
        root = tmp_path / copy / "classes-n6-c2-s0-v1" / "images"
        files = sorted(root.glob("*/*.jpg"))
        digests.append(
            [(p.relative_to(root), hashlib.sha256(p.read_bytes()).digest()) for p in files]
        )
    assert digests[0] == digests[1]
    assert [str(name) for name, _ in digests[0][:2]] == [
        "airplane/000000.jpg",
        "airplane/000002.jpg",
    ]


def test_reproducible_bench_builds_identical_files(bench_dir: Path) -> None:
    # two builds (--jobs 2, then 1) from other folders, against a variant tree that is the same
    same = str(Path(h5etl.__file__).resolve().parent.parent)
    text = _run(
        "reproducible.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--builds", "2",
        "--variant", f"same={same}",
    )  # fmt: skip
    assert "### Reproducible bytes: 40 pairs, lzf, SOURCE_DATE_EPOCH=1700000000" in text
    assert "as is: 2 builds, sizes equal, byte-identical: yes" in text
    assert "same: 2 builds, sizes equal, byte-identical: yes" in text
    rows = [line for line in text.splitlines() if line.startswith("| as is |")]
    assert [row.split("|")[3].strip() for row in rows] == ["2", "1"]  # --jobs of each build


def test_dask_bench_prints_its_tables(bench_dir: Path) -> None:
    out = _run("dask_bench.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--repeats", "1")
    for row in ("local joblib -j2", "Dask, 1 worker", "Dask, 2 workers", "--shards 2 --vds"):
        assert f"| {row}" in out or row in out
    assert "decode cores one writer serves" in out


def test_series_bench_prints_its_tables(bench_dir: Path) -> None:
    text = _run(
        "series_bench.py", "--dir", str(bench_dir / "series"), "--recordings", "3",
        "--min-s", "1", "--max-s", "2", "--repeats", "1", "--reads", "3", "--jobs", "2",
    )  # fmt: skip
    assert "| h5etl build --jobs 2 (ragged, blosc-lz4) |" in text
    assert "| work limit: read+hash+decode+compress+hash, all cores, no writes |" in text
    assert "| HDF5 vlen (no filters possible) |" in text
    assert "build / work limit (median of per-repeat ratios)" in text


def test_ragged_carry_bench_prints_every_build(bench_dir: Path) -> None:
    text = _run(
        "ragged_carry.py", "--dir", str(bench_dir / "ragged"), "--cases", "2", "--slices", "2",
        "--size", "32", "--repeats", "1", "--jobs", "1",
    )  # fmt: skip
    assert "| unchanged |" in text
    assert "| 2 of 2 |" in text  # the unchanged rebuild carried both cases
    assert "| one touched |" in text
    assert "| 1 of 2 |" in text
    assert "| shards 2 |" in text


def test_small_columns_bench_prints_both_layouts() -> None:
    text = _run("small_columns.py", "--samples", "300", "--repeats", "1")
    assert "| one row a chunk (before) | (1,) |" in text
    assert "| by bytes | (512,) |" in text  # 301 offsets: no more rows than the split needs
    assert "| **before / by bytes** |" in text


def test_group_splits_bench_compares_the_exact_search_with_the_greedy() -> None:
    out = _run("group_splits.py", "--repeats", "1", "--cases", "2")
    rows = out.splitlines()
    assert rows[0].split()[:2] == ["groups", "sizes"]
    assert [row.split()[0] for row in rows[1:]] == ["15", "60"]


def test_timeline_prints_each_step_of_a_build_and_its_variant(bench_dir: Path) -> None:
    tree = str(Path(__file__).resolve().parents[2])
    out = _run(
        "timeline.py", "--dir", str(bench_dir), "--samples", SAMPLES, "--repeats", "1",
        "--codec", "lzf", "--variant", f"same={tree}",
    )  # fmt: skip
    assert "### h5etl build -j2 (lzf): 1 builds" in out
    assert "### h5etl build -j2 (lzf) [same]: 1 builds" in out
    for step in ("| config loaded |", "| first task submitted |", "| worker 1: process start |"):
        assert step in out
    assert "| exit (this script saw it) |" in out
