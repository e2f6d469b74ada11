"""Series benchmark: sensor recordings built as ragged columns, against their work limit and
against HDF5 variable-length (vlen) datasets.

The corpus (``root/recordings/r_NNNN/``, deterministic, cached): per recording an
accelerometer ``accel.npy`` ((n, 3) float32 at 10 kHz), ``voltage.csv`` (100 Hz, rate
declared) and ``temperature.csv`` (1 Hz, a time column), each recording ``--min-s`` to
``--max-s`` seconds long (whole seconds, drawn per recording). Contenders, interleaved (the
order flips every repeat) and reported as medians:

- ``h5etl build``: ``h5etl build series.yaml --jobs N --quiet`` (the ``series`` recipe:
  blosc-lz4 with byte shuffle), a ragged column per channel.
- ``work limit``: a child doing on all cores (joblib) what the release needs and nothing
  else: read each channel file and SHA-256 its bytes, decode and check it with h5etl's own
  reader (``h5etl.inputs.recording.read_recording``), concatenate a batch's values per channel,
  compute its statistics (``h5etl.stats.normalisation.ChannelStats``), compress them in chunks of
  the release's layout (``h5etl.format.codec.encode_block``) and SHA-256 each block; no file is
  written.
- ``vlen``: the same decoding on all cores, then one writer storing each channel as an HDF5
  vlen dataset of float32/float64 (h5py ``vlen_dtype``; an (n, 3) channel flattened), which
  HDF5 cannot compress (filters do not apply to vlen heaps).

Then random sample reads: ``--reads`` random recordings (every channel) per run, from the
ragged release (``h5etl.readers.series.SeriesReader``) and from the vlen file (h5py).

    python tests/benchmarks/series_bench.py --recordings 40 --repeats 3 --output /tmp/series.md

Child modes (``--run limit|vlen|read``) are what the runner launches; ``H5ETL_BENCH_SMOKE=1``
(no figure meant) runs them in the runner's process (``build.measure_child``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from build import (
    IN_PROCESS,
    LIMIT_ENV,
    Run,
    _child_json,
    _median,
    become_subreaper,
    measure_child,
)
from installed import byte_compile, warm
from joblib import Parallel, delayed

from h5etl.config.spec import Spec
from h5etl.examples.sensors import START, write_recording
from h5etl.format import digest
from h5etl.format.codec import ChunkLayout, encode_block
from h5etl.inputs import recording
from h5etl.kinds.columns import RaggedColumn
from h5etl.kinds.series import SeriesKind
from h5etl.plan import kind_registry as registry
from h5etl.stats import normalisation as stats

HERE = Path(__file__).resolve()
DEFAULT_DIR = Path(os.environ.get("H5ETL_BENCH_DIR", "/tmp/h5etl-bench")) / "series"
CONFIG = """\
name: vib
pipeline: series
output: releases
sources:
  recording: {dir: recordings, entries: folders}
fields:
  recording:
    channels:
      accel: {file: accel.npy, rate_hz: 10000, dtype: float32, shape: [3], units: m/s^2}
      voltage: {file: voltage.csv, rate_hz: 100, columns: [volts], units: V}
      temperature: {file: temperature.csv, time: t, rate_hz: 1, columns: [celsius], units: degC}
    tolerance_s: 1.0
splits: {train: 1.0}
"""
BATCH = 4  # recordings per limit task: a few chunks of every channel


def ensure_corpus(root: Path, recordings: int, low: int, high: int, seed: int = 5) -> Path:
    """The corpus for these parameters, written once (a marker file says it is complete)."""
    folder = root / f"n{recordings}-s{low}-{high}-seed{seed}"
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for index in range(recordings):
        seconds = int(rng.integers(low, high + 1))
        write_recording(folder / "recordings" / f"r_{index:04d}", rng, seconds, START + index)
    (folder / "series.yaml").write_text(CONFIG, encoding="utf-8")
    (folder / "done").write_text("")
    return folder


def raw_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in (folder / "recordings").rglob("*") if p.is_file())


def _kind(folder: Path) -> SeriesKind:
    from h5etl.config.load import load_spec

    spec: Spec = load_spec(folder / "series.yaml")
    (kind,) = [k for k in registry.kinds_of(spec) if isinstance(k, SeriesKind)]
    return kind


def _folders(folder: Path) -> list[str]:
    return sorted(str(p) for p in (folder / "recordings").iterdir() if p.is_dir())


# -- child modes ------------------------------------------------------------------------------


def _limit_task(paths: list[str], kind: SeriesKind) -> int:
    """Read + hash, decode + check, compress whole chunks and hash blocks: no writes."""
    spec = kind.recording_spec
    parts: dict[str, list[np.ndarray]] = {}
    for path in paths:
        found, contents = recording.read_recording(path, spec)
        for data in contents.values():
            hashlib.sha256(data).digest()
        for channel, values in found.values.items():
            parts.setdefault(channel, []).append(values)
        for channel, times in found.times.items():
            parts.setdefault(f"{channel}_time", []).append(times)
    columns = kind.columns
    blocks = 0
    for name, arrays in parts.items():
        column = columns[f"{kind.name}_{name}"]
        assert isinstance(column, RaggedColumn)
        layout: ChunkLayout = column.layout
        values = np.concatenate(arrays)
        if column.stats is not None:  # every release carries them, as it carries digests
            stats.ChannelStats.of(values, channel_axis=-1 if values.ndim > 1 else None)
        for start in range(0, len(values), layout.rows):
            block = values[start : start + layout.rows]
            digest.block_digest(block)
            if len(block) < layout.rows:
                padded = np.zeros((layout.rows, *layout.shape), layout.dtype)
                padded[: len(block)] = block
                block = padded
            encode_block(layout, np.ascontiguousarray(block, dtype=layout.dtype))
            blocks += 1
    return blocks


def run_limit(folder: Path) -> dict[str, Any]:
    kind = _kind(folder)
    paths = _folders(folder)
    batches = [paths[i : i + BATCH] for i in range(0, len(paths), BATCH)]
    blocks = Parallel(n_jobs=-1)(delayed(_limit_task)(batch, kind) for batch in batches)
    return {"samples": len(paths), "blocks": sum(blocks)}


def _decoded(path: str, kind: SeriesKind) -> dict[str, np.ndarray]:
    found, contents = recording.read_recording(path, kind.recording_spec)
    for data in contents.values():
        hashlib.sha256(data).digest()
    return {**found.values, **{f"{k}_time": v for k, v in found.times.items()}}


def run_vlen(folder: Path, out: Path) -> dict[str, Any]:
    """Decode on all cores, then write every channel as a vlen dataset (one writer)."""
    kind = _kind(folder)
    paths = _folders(folder)
    decoded = Parallel(n_jobs=-1, return_as="generator")(delayed(_decoded)(p, kind) for p in paths)
    with h5py.File(out, "w", libver=("v110", "v110")) as handle:
        datasets: dict[str, h5py.Dataset] = {}
        for index, values in enumerate(decoded):
            for name, array in values.items():
                if name not in datasets:
                    dtype = h5py.vlen_dtype(array.dtype)
                    datasets[name] = handle.create_dataset(name, (len(paths),), dtype=dtype)
                    datasets[name].attrs["trailing"] = list(array.shape[1:])
                datasets[name][index] = array.reshape(-1)
    return {"samples": len(paths), "bytes": out.stat().st_size}


def run_read(path: Path, storage: str, reads: int, seed: int) -> dict[str, Any]:
    """Read ``reads`` random recordings, every channel; recordings per second."""
    rng = np.random.default_rng(seed)
    total = 0
    if storage == "ragged":
        from h5etl.readers.series import SeriesReader

        with SeriesReader(path, "train") as reader:
            picks = rng.integers(0, len(reader), reads)
            started = time.perf_counter()
            for i in picks:
                total += sum(np.asarray(v).size for v in reader[int(i)].values())
            seconds = time.perf_counter() - started
    else:
        with h5py.File(path, "r") as handle:
            names = list(handle)
            count = len(handle[names[0]])
            picks = rng.integers(0, count, reads)
            started = time.perf_counter()
            for i in picks:
                total += sum(handle[name][int(i)].size for name in names)
            seconds = time.perf_counter() - started
    return {"reads_per_s": reads / seconds, "values": total}


# -- the runner -------------------------------------------------------------------------------


def _child(mode: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE), "--run", mode, *args]


def _release(folder: Path) -> Path:
    return Path(os.path.realpath(folder / "releases" / "vib.h5"))


def _build(folder: Path, jobs: int) -> Run:
    shutil.rmtree(folder / "releases", ignore_errors=True)
    cmd = [sys.executable, "-m", "h5etl", "build", str(folder / "series.yaml"), "--jobs", str(jobs)]
    run, _ = measure_child([*cmd, "--quiet"])
    run.disk = _release(folder).stat().st_size
    return run


def _measured(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    run, out = measure_child(cmd, env)  # smoke runs: in this process (IN_PROCESS)
    run.extra = _child_json(out)
    run.samples = int(run.extra.get("samples", 0))
    run.disk = int(run.extra.get("bytes", 0))
    return run


def run_all(folder: Path, args: argparse.Namespace) -> dict[str, list[Run]]:
    vlen = folder / "vlen.h5"
    names = ["build", "limit", "vlen"]
    runs: dict[str, list[Run]] = {name: [] for name in names}
    reads: dict[str, list[float]] = {"ragged": [], "vlen": []}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            if name == "build":
                runs[name].append(_build(folder, args.jobs))
            elif name == "limit":
                runs[name].append(_measured(_child("limit", str(folder)), LIMIT_ENV))
            else:
                runs[name].append(_measured(_child("vlen", str(folder), str(vlen)), LIMIT_ENV))
        for storage, path in (("ragged", _release(folder)), ("vlen", vlen)):
            cmd = _child("read", str(path), storage, str(args.reads), str(repeat))
            reads[storage].append(float(_measured(cmd).extra["reads_per_s"]))
    runs["reads"] = [Run(0, 0, 0, 0, extra=dict(reads))]
    return runs


def table(folder: Path, runs: dict[str, list[Run]], args: argparse.Namespace) -> str:
    raw = raw_bytes(folder)
    seconds = {name: _median(r.wall for r in runs[name]) for name in ("build", "limit", "vlen")}
    reads = runs["reads"][0].extra
    ratios = [lim.wall / run.wall for lim, run in zip(runs["limit"], runs["build"], strict=True)]
    ratio = _median(ratios)
    ragged_disk = runs["build"][-1].disk
    vlen_disk = runs["vlen"][-1].disk
    mib = 2**20
    lines = [
        f"{args.recordings} recordings of {args.min_s}-{args.max_s} s (accel (n, 3) float32 "
        f"10 kHz, voltage 100 Hz CSV, temperature 1 Hz CSV with times): raw inputs "
        f"{raw / mib:.1f} MiB; {os.cpu_count()} cores; medians of {args.repeats}",
        "",
        "| contender | wall s | recordings/s | bytes on disk | vs raw inputs |",
        "|---|---|---|---|---|",
        f"| h5etl build --jobs {args.jobs} (ragged, blosc-lz4) | {seconds['build']:.2f} | "
        f"{args.recordings / seconds['build']:.1f} | {ragged_disk / mib:.1f} MiB | "
        f"{ragged_disk / raw:.2f}x |",
        f"| work limit: read+hash+decode+compress+hash, all cores, no writes | "
        f"{seconds['limit']:.2f} | {args.recordings / seconds['limit']:.1f} | - | - |",
        f"| HDF5 vlen, decode on all cores + one writer | {seconds['vlen']:.2f} | "
        f"{args.recordings / seconds['vlen']:.1f} | {vlen_disk / mib:.1f} MiB | "
        f"{vlen_disk / raw:.2f}x |",
        "",
        f"build / work limit (median of per-repeat ratios): **{ratio:.2f}x** (target >= 0.85x);"
        f" per repeat {', '.join(f'{r:.2f}' for r in ratios)}; ratio of the medians "
        f"{seconds['limit'] / seconds['build']:.2f}; load average {_load()}",
        "",
        "| storage | bytes on disk | build s | random recording reads/s (all channels) |",
        "|---|---|---|---|",
        f"| ragged (values + offsets, compressed) | {ragged_disk / mib:.1f} MiB | "
        f"{seconds['build']:.2f} | {_median(reads['ragged']):.0f} |",
        f"| HDF5 vlen (no filters possible) | {vlen_disk / mib:.1f} MiB | "
        f"{seconds['vlen']:.2f} | {_median(reads['vlen']):.0f} |",
    ]
    return "\n".join(lines)


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", choices=["limit", "vlen", "read"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--recordings", type=int, default=40)
    parser.add_argument("--min-s", type=int, default=5)
    parser.add_argument("--max-s", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--output", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.run == "limit":
        print(json.dumps(run_limit(Path(args.rest[0]))))
        return
    if args.run == "vlen":
        print(json.dumps(run_vlen(Path(args.rest[0]), Path(args.rest[1]))))
        return
    byte_compile()
    if args.run == "read":
        path, storage, reads, seed = args.rest
        print(json.dumps(run_read(Path(path), storage, int(reads), int(seed))))
        return
    become_subreaper()
    folder = ensure_corpus(args.dir, args.recordings, args.min_s, args.max_s)
    warm(folder)
    text = table(folder, run_all(folder, args), args)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")


IN_PROCESS[str(HERE)] = main  # smoke runs: the child modes in the runner (build.measure_child)


if __name__ == "__main__":
    main()
