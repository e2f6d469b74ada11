"""Benchmark corpus: deterministic image/mask PNG pairs that decode and compress like real data.

Each sample is a lit, tilted background with smooth low-frequency texture, a few shaded and
textured objects (ellipses and polygons, their union is the 0/255 mask) and sensor-like noise
(signal-dependent Gaussian), at a random size up to ``max_size`` px. Sample ``i`` depends only
on ``(seed, i)``, so the corpus is the same whatever the number of processes that write it.

The corpus is cached: a folder named after its parameters holds ``corpus.json`` once complete,
and a second call with the same parameters returns at once. Beside it, one build config per
codec (``lzf.yaml``, ``gzip.yaml``, ``blosc-lz4.yaml``, ``zstd.yaml``) and one lzf config per
chunk size of the sweep (``lzf-chunks1.yaml``, ``lzf-chunks8.yaml``, ...).

The messy copy (``ensure_messy``) is the same corpus with a deterministic 3% of masks given one
pixel of value 7: those pairs pass the header probe and are rejected at decode (``mask_values``).
It sits beside the corpus, and its unchanged files are hard links (copies where links fail).

Run: ``python tests/benchmarks/corpus.py --dir /tmp/h5etl-bench [--scale 10] [--messy]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from PIL import Image, ImageDraw

CORPUS_VERSION = 1  # bump when the generator changes, so caches are rebuilt
DEFAULT_SAMPLES = 3000
DEFAULT_DIR = Path(tempfile.gettempdir()) / "h5etl-bench"
FIELD_SIZE = 224

CODECS: dict[str, str] = {
    "lzf": "lzf",
    "gzip": "gzip",
    "blosc-lz4": "{codec: blosc, cname: lz4, blosc_shuffle: byte}",
    "zstd": "zstd",
}

CHUNK_SWEEP = (1, 8, 32, 64)  # storage.chunk_samples of the sweep configs (lzf)
MESSY_FRACTION = 0.03  # share of masks that get one invalid pixel in the messy copy
MESSY_VALUE = 7  # outside {0, 255}: the pair is a decode-time mask_values reject
MESSY_VERSION = 1  # bump when the messy copy changes, so caches are rebuilt

CONFIG_TEMPLATE = """\
# Benchmark build of the {samples}-sample corpus with {codec}; written by corpus.py.
name: bench
pipeline: segmentation
output: releases/{name}
description: h5etl benchmark corpus ({samples} samples, {codec})
sources:
  image: {{dir: images, glob: "*.png"}}
  mask: {{dir: masks, glob: "*.png"}}
splits: {{train: 0.8, valid: 0.2}}
seed: 0
fields:
  image: {{shape: [3, {size}, {size}], dtype: uint8, mode: RGB}}
  mask: {{shape: [1, {size}, {size}], dtype: uint8, mode: L, values: [0, 1]}}
  filename: {{dtype: str}}
storage: {{chunk_samples: {chunks}, compression: {compression}, shuffle: true}}
pad: {{fill: 0, oversize: reject}}
on_error: skip
"""


@dataclass(frozen=True, slots=True)
class CorpusParams:
    samples: int = DEFAULT_SAMPLES
    seed: int = 0
    min_size: int = 64
    max_size: int = FIELD_SIZE
    version: int = CORPUS_VERSION

    @property
    def folder_name(self) -> str:
        sizes = f"{self.min_size}to{self.max_size}"
        return f"corpus-n{self.samples}-s{self.seed}-{sizes}-v{self.version}"


@dataclass(frozen=True, slots=True)
class Corpus:
    """A finished corpus on disk."""

    root: Path
    params: CorpusParams

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def masks(self) -> Path:
        return self.root / "masks"

    def config(self, codec: str = "lzf") -> Path:
        return self.root / f"{codec}.yaml"

    def releases(self, codec: str = "lzf") -> Path:
        return self.root / "releases" / codec


def _smooth(rng: np.random.Generator, height: int, width: int, cell: int) -> np.ndarray:
    """Low-frequency texture in about [-1, 1]: coarse noise upsampled bicubically."""
    coarse = rng.standard_normal((height // cell + 2, width // cell + 2)).astype(np.float32)
    big = Image.fromarray(coarse, mode="F").resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(big, dtype=np.float32)


def _shape_mask(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """One random ellipse or polygon as a boolean (h, w) array."""
    canvas = Image.new("1", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    radius = rng.uniform(0.06, 0.22) * min(height, width) + 3
    if rng.random() < 0.5:
        ry, rx = radius * rng.uniform(0.6, 1.4, size=2)
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
    else:
        corners = int(rng.integers(3, 8))
        angles = np.sort(rng.uniform(0, 2 * np.pi, size=corners))
        radii = radius * rng.uniform(0.6, 1.3, size=corners)
        points = [
            (float(cx + r * np.cos(a)), float(cy + r * np.sin(a)))
            for a, r in zip(angles, radii, strict=True)
        ]
        draw.polygon(points, fill=1)
    return np.asarray(canvas, dtype=bool)


def make_pair(seed: int, index: int, params: CorpusParams) -> tuple[np.ndarray, np.ndarray]:
    """The RGB image (h, w, 3) and 0/255 mask (h, w) of sample ``index``; pure in its inputs."""
    rng = np.random.default_rng([seed, index])
    height, width = (int(v) for v in rng.integers(params.min_size, params.max_size + 1, size=2))
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    tilt = rng.uniform(-0.5, 0.5, size=2)
    base = rng.uniform(30, 140, size=3).astype(np.float32)
    light = 1.0 + tilt[0] * (yy / height - 0.5) + tilt[1] * (xx / width - 0.5)
    texture = _smooth(rng, height, width, int(rng.integers(12, 40)))
    image = base * (light + 0.12 * texture)[..., None]
    mask = np.zeros((height, width), dtype=bool)
    for _ in range(int(rng.integers(2, 9))):
        inside = _shape_mask(rng, height, width)
        colour = rng.uniform(60, 240, size=3).astype(np.float32)
        detail = _smooth(rng, height, width, int(rng.integers(3, 8)))
        shade = colour * (0.85 + 0.15 * detail)[..., None]
        image = np.where(inside[..., None], shade, image)
        if rng.random() < 0.75:  # most objects are labelled, some are clutter
            mask |= inside
    sigma = 1.5 + 0.02 * image  # sensor noise grows with the signal
    image += rng.standard_normal(image.shape, dtype=np.float32) * sigma
    return image.clip(0, 255).astype(np.uint8), (mask * 255).astype(np.uint8)


def _write_range(root: Path, params: CorpusParams, start: int, stop: int) -> None:
    for index in range(start, stop):
        image, mask = make_pair(params.seed, index, params)
        Image.fromarray(image).save(root / "images" / f"s{index:06d}.png", format="PNG")
        Image.fromarray(mask).save(root / "masks" / f"s{index:06d}.png", format="PNG")


def sweep_config(chunks: int) -> str:
    """The name (``Corpus.config(name)``) of the lzf config with chunks of ``chunks`` samples."""
    return f"lzf-chunks{chunks}"


def write_configs(corpus: Corpus) -> None:
    """One config per codec (chunks of 32) and one lzf config per chunk size of the sweep."""
    configs = [(codec, codec, compression, 32) for codec, compression in CODECS.items()]
    configs += [(sweep_config(n), "lzf", CODECS["lzf"], n) for n in CHUNK_SWEEP]
    for name, codec, compression, chunks in configs:
        text = CONFIG_TEMPLATE.format(
            samples=corpus.params.samples,
            name=name,
            codec=codec if chunks == 32 else f"{codec}, chunks of {chunks}",
            size=FIELD_SIZE,
            compression=compression,
            chunks=chunks,
        )
        corpus.config(name).write_text(text, encoding="utf-8")


def ensure_corpus(base: Path, params: CorpusParams, *, jobs: int = -1) -> Corpus:
    """The corpus for ``params`` under ``base``; written (in parallel) unless already there."""
    root = base / params.folder_name
    corpus = Corpus(root, params)
    manifest = root / "corpus.json"
    if not (manifest.exists() and json.loads(manifest.read_text()) == asdict(params)):
        partial = base / f"{params.folder_name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        (partial / "images").mkdir(parents=True)
        (partial / "masks").mkdir()
        step = 100
        Parallel(n_jobs=jobs)(
            delayed(_write_range)(partial, params, start, min(start + step, params.samples))
            for start in range(0, params.samples, step)
        )
        (partial / "corpus.json").write_text(json.dumps(asdict(params)), encoding="utf-8")
        partial.rename(root)
    write_configs(corpus)
    return corpus


def messy_indices(params: CorpusParams, fraction: float = MESSY_FRACTION) -> list[int]:
    """The ``round(fraction * samples)`` samples with the smallest seeded hash, sorted.

    An exact count (90 of 3000), spread over the corpus, the same on every run and machine.
    """
    count = round(fraction * params.samples)

    def rank(index: int) -> bytes:
        return hashlib.sha256(f"messy:{params.seed}:{index}".encode()).digest()

    return sorted(sorted(range(params.samples), key=rank)[:count])


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)


def _spoil_mask(source: Path, target: Path) -> None:
    """Copy a 0/255 mask with its centre pixel set to ``MESSY_VALUE``: a decode-time reject."""
    with Image.open(source) as image:
        pixels = np.array(image)
    pixels[pixels.shape[0] // 2, pixels.shape[1] // 2] = MESSY_VALUE
    Image.fromarray(pixels).save(target, format="PNG")


def ensure_messy(corpus: Corpus, fraction: float = MESSY_FRACTION) -> Corpus:
    """The messy copy of ``corpus`` beside it (cached); written once, mostly hard links.

    ``fraction`` of the masks (``messy_indices``) get one pixel of value ``MESSY_VALUE``; every
    other file is a hard link to the clean corpus's. The copy holds ``messy.json`` (parameters
    and the spoiled sample indices) once complete, and its own configs.
    """
    name = f"{corpus.params.folder_name}-messy{fraction:g}"
    root = corpus.root.parent / name
    messy = Corpus(root, corpus.params)
    indices = messy_indices(corpus.params, fraction)
    manifest = {
        "corpus": asdict(corpus.params),
        "fraction": fraction,
        "value": MESSY_VALUE,
        "version": MESSY_VERSION,
        "spoiled": indices,
    }
    stamp = root / "messy.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == manifest):
        partial = root.parent / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        (partial / "images").mkdir(parents=True)
        (partial / "masks").mkdir()
        spoiled = {f"s{index:06d}.png" for index in indices}
        for path in sorted(corpus.images.iterdir()):
            _link_or_copy(path, partial / "images" / path.name)
        for path in sorted(corpus.masks.iterdir()):
            target = partial / "masks" / path.name
            (_spoil_mask if path.name in spoiled else _link_or_copy)(path, target)
        (partial / "messy.json").write_text(json.dumps(manifest), encoding="utf-8")
        partial.rename(root)
    write_configs(messy)
    return messy


def corpus_bytes(corpus: Corpus) -> int:
    return sum(p.stat().st_size for d in (corpus.images, corpus.masks) for p in d.iterdir())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="cache folder")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--scale", type=int, default=1, help="multiply --samples (10: 10x corpus)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-j", "--jobs", type=int, default=-1, help="writer processes")
    parser.add_argument("--messy", action="store_true", help="also make the messy copy")
    args = parser.parse_args(argv)
    params = CorpusParams(samples=args.samples * args.scale, seed=args.seed)
    started = time.perf_counter()
    corpus = ensure_corpus(args.dir, params, jobs=args.jobs)
    seconds = time.perf_counter() - started
    size = corpus_bytes(corpus) / 2**20
    print(f"corpus: {corpus.root} ({params.samples} pairs, {size:.1f} MiB, {seconds:.1f} s)")
    for codec in CODECS:
        print(f"config: {corpus.config(codec)}")
    if args.messy:
        messy = ensure_messy(corpus)
        spoiled = len(messy_indices(params))
        print(f"messy copy: {messy.root} ({spoiled} masks with a pixel of {MESSY_VALUE})")


if __name__ == "__main__":
    main()
