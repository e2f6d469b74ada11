"""Kinds benchmark: a classification build (and a derived super-resolution build) against its
own work limit, on a corpus of JPEG photos in class folders.

The corpus (``root/images/<class>/NNNNNN.jpg``, 3000 photos of 192-320 px per side in 10
classes by default) is deterministic and cached like ``corpus.py``'s: sample ``i`` is
``corpus.make_pair``'s photo-like image of ``(seed, i)``, cut to a multiple of 8 px per side,
JPEG quality 90, in class ``i % classes``. Beside it, two build configs:

- ``classification.yaml``: ``pipeline: classification`` (its codec, chunks and fit), image
  ``[3, 224, 224]`` RGB, label from the class folder; photos larger than 224 are resized into
  the field keeping their aspect (the recipe's ``oversize: resize``), smaller ones padded.
- ``superres.yaml``: ``pipeline: superres``, ``high`` ``[3, 320, 320]`` from the same files and
  ``low`` ``[3, 80, 80]`` derived from it (bicubic, factor 4).

Each repeat runs, interleaved (the order flips every repeat, so drifting load hits both alike):
``h5etl build CONFIG --jobs 2 --quiet`` and that config's work limit, a child that does on all
cores with joblib what the release needs and nothing else: read each file, SHA-256 of its
bytes, decode with h5etl's own decoder (``h5etl.inputs.raster.decode_field``), fit (resize larger
photos with ``h5etl.inputs.raster.resize_to``, Lanczos as the recipe does; derive low-res by
bicubic) and pad into reused blocks of one chunk, compute the statistics the release carries (each
image field's per-channel sums as its kind computes them, the labels' histogram), compress
each block with the release's codec (``h5etl.format.codec.encode_block``) and SHA-256 each block
of every column (labels and file names too); no file is written. Splits are cut in the same
proportions, so both make the same number of blocks.

    python tests/benchmarks/kinds_bench.py --wait-load 1.5 --repeats 5 --output /tmp/kinds.md
    python tests/benchmarks/kinds_bench.py --no-superres --samples 600 --repeats 3

Child mode ``--run limit --config CFG`` is what the runner launches; ``H5ETL_BENCH_SMOKE=1``
(no figure meant) runs it, and build.py's disk write, in the runner's process
(``build.measure_child``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from build import HERE as BUILD_SCRIPT
from build import (
    IN_PROCESS,
    LIMIT_ENV,
    SMOKE,
    Run,
    _child_run,
    _h5etl_cli,
    _h5etl_origin,
    _load,
    _median,
    _mib,
    become_subreaper,
)
from corpus import DEFAULT_DIR, Corpus, CorpusParams, make_pair
from installed import byte_compile, warm
from joblib import Parallel, delayed
from PIL import Image

from h5etl.inputs.pixels import resize_to

HERE = Path(__file__).resolve()
KINDS_VERSION = 1  # bump when the generator changes, so caches are rebuilt
DEFAULT_SAMPLES = 3000
DEFAULT_CLASSES = 10
CLASS_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
MIN_SIZE, MAX_SIZE = 192, 320  # px per side of a photo, multiples of 8
JPEG_QUALITY = 90
CLASSIFY, SUPERRES = "classification", "superres"

CONFIGS = {
    CLASSIFY: """\
# Benchmark classification build of {samples} photos in {classes} class folders; kinds_bench.py.
name: bench-{name}
pipeline: classification
output: releases/{name}
description: h5etl kinds benchmark ({samples} JPEG photos, {classes} classes)
sources:
  image: {{dir: images, glob: "**/*.jpg"}}
fields:
  image: {{shape: [3, 224, 224]}}
  label: {{kind: label, source: image, from: folder}}
""",
    SUPERRES: """\
# Benchmark super-resolution build: low derived from high; written by kinds_bench.py.
name: bench-{name}
pipeline: superres
output: releases/{name}
description: h5etl kinds benchmark ({samples} JPEG photos, low-res derived)
sources:
  high: {{dir: images, glob: "**/*.jpg"}}
fields:
  high: {{shape: [3, {max_size}, {max_size}]}}
  low: {{shape: [3, {low}, {low}], derive: {{from: high, resize: bicubic, factor: 4}}}}
""",
}


# --------------------------------------------------------------------------------------------
# the corpus


@dataclass(frozen=True, slots=True)
class PhotoParams:
    samples: int = DEFAULT_SAMPLES
    classes: int = DEFAULT_CLASSES
    seed: int = 0
    version: int = KINDS_VERSION

    @property
    def folder_name(self) -> str:
        return f"classes-n{self.samples}-c{self.classes}-s{self.seed}-v{self.version}"

    def class_names(self) -> list[str]:
        if self.classes <= len(CLASS_NAMES):
            return list(CLASS_NAMES[: self.classes])
        return [f"class{k:03d}" for k in range(self.classes)]


def photo(params: PhotoParams, index: int) -> np.ndarray:
    """The (h, w, 3) uint8 photo of sample ``index``; pure in its inputs, sides multiples of 8."""
    sizes = CorpusParams(params.samples, params.seed, min_size=MIN_SIZE, max_size=MAX_SIZE)
    image, _ = make_pair(params.seed, index, sizes)
    height, width = (side - side % 8 for side in image.shape[:2])
    return image[:height, :width]


def photo_path(root: Path, params: PhotoParams, index: int) -> Path:
    name = params.class_names()[index % params.classes]
    return root / "images" / name / f"{index:06d}.jpg"


def _write_range(root: Path, params: PhotoParams, start: int, stop: int) -> None:
    for index in range(start, stop):
        Image.fromarray(photo(params, index)).save(
            photo_path(root, params, index), format="JPEG", quality=JPEG_QUALITY
        )


def write_configs(root: Path, params: PhotoParams) -> None:
    for name, template in CONFIGS.items():
        text = template.format(
            name=name, samples=params.samples, classes=params.classes, max_size=MAX_SIZE,
            low=MAX_SIZE // 4,
        )  # fmt: skip
        (root / f"{name}.yaml").write_text(text, encoding="utf-8")


def ensure_photos(base: Path, params: PhotoParams, *, jobs: int = -1) -> Corpus:
    """The photo corpus for ``params`` under ``base``; written (in parallel) unless there.

    Returned as a ``corpus.Corpus`` (``config(name)``, ``releases(name)``), so build.py's
    runners take it; its ``params`` only carry the sample count.
    """
    root = base / params.folder_name
    manifest = root / "corpus.json"
    if not (manifest.exists() and json.loads(manifest.read_text()) == asdict(params)):
        partial = base / f"{params.folder_name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        for name in params.class_names():
            (partial / "images" / name).mkdir(parents=True)
        step = 100
        Parallel(n_jobs=jobs)(
            delayed(_write_range)(partial, params, start, min(start + step, params.samples))
            for start in range(0, params.samples, step)
        )
        (partial / "corpus.json").write_text(json.dumps(asdict(params)), encoding="utf-8")
        partial.rename(root)
    write_configs(root, params)
    return Corpus(root, CorpusParams(samples=params.samples, seed=params.seed))


# --------------------------------------------------------------------------------------------
# the work limit (child mode)


_BUFFERS: dict[tuple[str, int], np.ndarray] = {}


def _buffer(name: str, layout: Any) -> np.ndarray:
    """A block of one chunk per field, reused across blocks (as h5etl reuses its own)."""
    key = (name, layout.rows)
    if key not in _BUFFERS:
        _BUFFERS[key] = np.empty((layout.rows, *layout.shape), np.dtype(layout.dtype))
    return _BUFFERS[key]


def _fit(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """What ``pad.oversize: resize`` does: a larger photo resized into the field, aspect kept."""
    from h5etl.kinds import placement as geometry

    target = (shape[1], shape[2])
    size = (array.shape[0], array.shape[1])
    if not geometry.is_oversize(size, target):
        return array
    return resize_to(array, geometry.fit_within(size, target), "lanczos")


def _limit_block(
    task: str, files: list[tuple[str, int]], layouts: dict[str, Any], kinds: dict[str, Any]
) -> int:
    """Read, hash, decode, fit, pad, compress and hash one block of samples, and compute the
    statistics the release carries of it; keep nothing."""
    from h5etl.format.codec import encode_block
    from h5etl.format.digest import block_digest, text_block_digest
    from h5etl.inputs import raster as images
    from h5etl.kinds import placement as geometry
    from h5etl.stats import normalisation as stats

    blocks = {name: _buffer(name, layout) for name, layout in layouts.items()}
    for block in blocks.values():
        block.fill(0)
    windows: dict[str, list[np.ndarray]] = {name: [] for name in layouts}
    for row, (path, _) in enumerate(files):
        with open(path, "rb") as handle:
            data = handle.read()
        hashlib.sha256(data).hexdigest()
        pixels = images.decode_field(data, path=path, mode="RGB", dtype="uint8", role="image")
        if task == CLASSIFY:
            fitted = _fit(pixels.array, layouts["image"].shape)
            windows["image"].append(geometry.place(fitted, blocks["image"][row]))
        else:
            high = pixels.array
            size = (high.shape[0] // 4, high.shape[1] // 4)
            windows["high"].append(geometry.place(high, blocks["high"][row]))
            low = resize_to(high, size, "bicubic")
            windows["low"].append(geometry.place(low, blocks["low"][row]))
    # the statistics a release carries, as its kinds compute them (build.py's limit does too)
    for name, kind in kinds.items():
        if name in windows:
            kind.task_stats(windows[name])
    if task == CLASSIFY:  # the label column's value histogram, as the release keeps it
        stats.Histogram.of(np.array([label for _, label in files], dtype=np.int64))
    for name, layout in layouts.items():
        encode_block(layout, blocks[name])
        block_digest(blocks[name])
    if task == CLASSIFY:
        block_digest(np.array([label for _, label in files], dtype=np.int64))
    text_block_digest(Path(path).name for path, _ in files)
    return len(files)


def _split_blocks(
    files: list[tuple[str, int]], fractions: Sequence[float], rows: int
) -> list[list[tuple[str, int]]]:
    """Cut ``files`` into splits of these fractions, then each split into blocks of ``rows``."""
    blocks, start = [], 0
    for position, fraction in enumerate(fractions):
        last = position == len(fractions) - 1
        stop = len(files) if last else start + round(fraction * len(files))
        part = files[start:stop]
        blocks += [part[i : i + rows] for i in range(0, len(part), rows)]
        start = stop
    return blocks


def run_limit(config: Path) -> dict[str, Any]:
    """The work limit of ``config`` (classification or derived super-resolution)."""
    from h5etl import load_spec
    from h5etl.execute.assembly import layouts_of
    from h5etl.plan.kind_registry import kinds_of

    spec = load_spec(config)
    layouts = layouts_of(spec)
    kinds = {kind.name: kind for kind in kinds_of(spec)}
    task = CLASSIFY if "image" in layouts else SUPERRES
    images = config.parent / "images"
    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    files = [
        (str(path), classes.index(path.parent.name)) for path in sorted(images.glob("*/*.jpg"))
    ]
    rows = max(layout.rows for layout in layouts.values())
    blocks = _split_blocks(files, list(spec.splits.values()), rows)
    done = Parallel(n_jobs=os.cpu_count() or 1)(
        delayed(_limit_block)(task, block, layouts, kinds) for block in blocks
    )
    return {"samples": sum(done), "blocks": len(blocks)}


# --------------------------------------------------------------------------------------------
# the interleaved runner and the table


def _limit_here(argv: Sequence[str]) -> None:
    main(argv)


IN_PROCESS[str(HERE)] = _limit_here  # smoke runs: the limit in the runner (build.measure_child)


def _limit(corpus: Corpus, task: str) -> Run:
    cmd = [sys.executable, str(HERE), "--run", "limit", "--config", str(corpus.config(task))]
    return _child_run(cmd, corpus.params.samples, env=LIMIT_ENV)


def wait_for_load(limit: float, seconds: float = 1200.0, poll: float = 30.0) -> str:
    """Wait until the 1-minute load is below ``limit`` (at most ``seconds``); say how it went."""
    started = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - started < seconds:
        print(f"  load {_load()}, waiting for < {limit}", file=sys.stderr, flush=True)
        time.sleep(poll)
    waited = time.monotonic() - started
    below = os.getloadavg()[0] < limit
    verdict = "below" if below else "still not below"
    return f"waited {waited:.0f} s for a 1-minute load below {limit}: {verdict} ({_load()})"


def _write(corpus: Corpus, nbytes: int) -> Run:
    """Writing ``nbytes`` (a release's size) to a file beside the releases, fsynced: what the
    limit leaves out and a build cannot (build.py's raw disk write)."""
    out = corpus.root / "disk-write.bin"
    cmd = [sys.executable, str(BUILD_SCRIPT), "--run", "disk", "--bytes", str(nbytes)]
    return _child_run([*cmd, "--out", str(out)], 0)


def run_all(corpus: Corpus, tasks: Sequence[str], repeats: int) -> dict[str, list[Run]]:
    """Each repeat: build, limit and the write of every task, the order rotated each repeat."""
    runs: dict[str, list[Run]] = {}
    for repeat in range(repeats):
        for task in tasks:
            # the write needs a build's size: the first repeat starts with the build
            kinds = ("build", "limit", "write")
            order = kinds[repeat % 3 :] + kinds[: repeat % 3]
            for what in order:
                if what == "build":
                    run = _h5etl_cli(corpus, task, 2)
                elif what == "limit":
                    run = _limit(corpus, task)
                else:
                    run = _write(corpus, runs[f"{task} build"][-1].disk)
                runs.setdefault(f"{task} {what}", []).append(run)
                print(
                    f"  [{repeat + 1}/{repeats}] {task} {what}: {run.rate:.0f} images/s, "
                    f"{run.wall:.2f} s, load {_load()}",
                    file=sys.stderr,
                    flush=True,
                )
    return runs


NAMES = {
    f"{CLASSIFY} build": "h5etl build -j2 (classification: image + label from folder)",
    f"{CLASSIFY} limit": "work limit: read+SHA-256+decode+fit+pad+stats+compress+block SHA-256, "
    "all cores (classification)",
    f"{SUPERRES} build": "h5etl build -j2 (super-resolution: high + low derived, bicubic x4)",
    f"{SUPERRES} limit": "work limit: read+SHA-256+decode+derive+pad+stats+compress+block SHA-256, "
    "all cores (super-resolution)",
    f"{CLASSIFY} write": "writing the release's bytes to disk, fsynced (classification)",
    f"{SUPERRES} write": "writing the release's bytes to disk, fsynced (super-resolution)",
}


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{_median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(runs: dict[str, list[Run]], tasks: Sequence[str]) -> str:
    lines = [
        "| contender | images/s median (min-max) | wall s median (min-max) | CPU s "
        "| cores busy | parent peak RSS MiB | worker peak RSS MiB | on disk MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, items in runs.items():
        wall, cpu = _median(r.wall for r in items), _median(r.cpu for r in items)
        if name.endswith(" write"):  # no images: bytes written
            written = _mib(_median(r.extra.get("bytes", 0) for r in items))
            lines.append(
                f"| {NAMES[name]} | - | {_spread([r.wall for r in items])} | {cpu:.2f} "
                f"| {cpu / wall:.2f} | - | - | {written} |"
            )
            continue
        lines.append(
            f"| {NAMES[name]} | {_spread([r.rate for r in items], 0)} "
            f"| {_spread([r.wall for r in items])} | {cpu:.2f} | {cpu / wall:.2f} "
            f"| {_mib(_median(r.rss_parent for r in items))} "
            f"| {_mib(_median(r.rss_workers for r in items))} "
            f"| {_mib(_median(r.disk for r in items))} |"
        )
    lines += [
        "",
        "| ratio, build / its work limit (median of per-repeat ratios) | value "
        "| min-max | per repeat | target | met |",
        "|---|---:|---|---|---:|---|",
    ]
    for task in tasks:
        pairs = list(zip(runs[f"{task} build"], runs[f"{task} limit"], strict=True))
        rates = [b.rate / lim.rate for b, lim in pairs if lim.rate]
        per_cpu = [lim.cpu / b.cpu for b, lim in pairs if b.cpu]  # images per CPU-s, b / l
        lines.append(_ratio_row(f"h5etl build -j2 / work limit ({task})", rates))
        lines.append(_ratio_row(f"images per CPU-s, build / work limit ({task})", per_cpu))
        # the limit writes nothing; on 2 cores the write's CPU comes out of the decoding, so
        # the fair ceiling spends it too: limit CPU + write CPU, shared by the cores
        writes = runs.get(f"{task} write", [])
        if writes:
            with_write = [
                (lim.cpu + w.cpu) / b.cpu
                for (b, lim), w in zip(pairs, writes, strict=True)
                if b.cpu
            ]
            lines.append(
                _ratio_row(f"images per CPU-s, build / (work limit + write) ({task})", with_write)
            )
    return "\n".join(lines)


def _ratio_row(label: str, ratios: list[float]) -> str:
    value = _median(ratios)
    met = "yes" if value >= 0.9 else "**no**"
    shown = ", ".join(f"{v:.2f}" for v in ratios)
    return (
        f"| {label} | **{value:.2f}** | {min(ratios):.2f}-{max(ratios):.2f} | {shown} "
        f"| >= 0.9 | {met} |"
    )


def _photos_in_child(base: Path, params: PhotoParams) -> Corpus:
    """The corpus, written by a child if missing: made here, the pool's workers would stay
    children of this runner, and ``measure`` waits for every one of them to exit. A smoke run
    makes it here: it measures nothing in a child (``build.measure_child``)."""
    if not SMOKE and not (base / params.folder_name / "corpus.json").exists():
        cmd = [sys.executable, str(HERE), "--run", "corpus", "--dir", str(base)]
        cmd += ["--samples", str(params.samples), "--classes", str(params.classes)]
        subprocess.run([*cmd, "--seed", str(params.seed)], check=True, stdout=sys.stderr)
    return ensure_photos(base, params)


def benchmark(args: argparse.Namespace) -> str:
    params = PhotoParams(samples=args.samples, classes=args.classes, seed=args.seed)
    started = time.perf_counter()
    corpus = _photos_in_child(args.dir, params)
    made = time.perf_counter() - started
    warm(corpus.root)
    waited = wait_for_load(args.wait_load, args.wait_seconds) if args.wait_load else ""
    tasks = [CLASSIFY] if args.no_superres else [CLASSIFY, SUPERRES]
    load_before = _load()
    runs = run_all(corpus, tasks, args.repeats)
    header = (
        f"## h5etl kinds benchmark\n\n{params.samples} JPEG photos ({MIN_SIZE}-{MAX_SIZE} px "
        f"per side, quality {JPEG_QUALITY}) in {params.classes} class folders ({corpus.root}, "
        f"ready in {made:.1f} s), {os.cpu_count()} cores, medians of {args.repeats} interleaved "
        f"repeats; {_h5etl_origin()}; load average (1/5/15 min) {load_before} before, "
        f"{_load()} after" + (f"; {waited}" if waited else "") + ".\n"
    )
    return "\n".join([header, table(runs, tasks), ""])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="corpus and scratch folder")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--classes", type=int, default=DEFAULT_CLASSES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-superres", action="store_true", help="only the classification row")
    parser.add_argument(
        "--wait-load",
        type=float,
        default=0.0,
        metavar="LOAD",
        help="first wait (polling every 30 s) until the 1-minute load is below LOAD",
    )
    parser.add_argument("--wait-seconds", type=float, default=1200.0, help="at most this long")
    parser.add_argument("--output", type=Path, help="also write the table here")
    parser.add_argument("--run", choices=["limit", "corpus"], help="child mode")
    parser.add_argument("--config", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.run == "limit":
        print(json.dumps(run_limit(args.config)))
        return
    byte_compile()
    if args.run == "corpus":
        params = PhotoParams(samples=args.samples, classes=args.classes, seed=args.seed)
        print(f"corpus: {ensure_photos(args.dir, params).root}")
        return
    if not become_subreaper():
        print("warning: not a subreaper; CPU of orphaned workers may be missed", file=sys.stderr)
    text = benchmark(args)
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
