"""The embedded example: synthetic cell images with masks, a few broken on purpose."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from h5etl.config import resources
from h5etl.errors import UsageError
from h5etl.inputs import raster as images
from h5etl.release.durable import write_atomically


def cell_pair(rng: np.random.Generator, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """An RGB image of stained cells on a lit background, and its 0/255 mask."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    tilt = rng.uniform(-0.3, 0.3, size=2)
    background = 40 + 25 * (tilt[0] * yy / height + tilt[1] * xx / width + 0.5)
    image = np.repeat(background[..., None], 3, axis=2)
    mask = np.zeros((height, width), dtype=bool)
    for _ in range(int(rng.integers(3, 9))):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        ry, rx = rng.uniform(6, 18, size=2)
        angle = rng.uniform(0, np.pi)
        dy, dx = yy - cy, xx - cx
        u = (dx * np.cos(angle) + dy * np.sin(angle)) / rx
        v = (-dx * np.sin(angle) + dy * np.cos(angle)) / ry
        inside = u**2 + v**2 <= 1.0
        mask |= inside
        stain = rng.uniform(120, 220, size=3) * np.array([1.0, 0.55, 0.8])
        shade = 1.0 - 0.35 * np.clip(u**2 + v**2, 0, 1)[..., None]
        image = np.where(inside[..., None], stain * shade, image)
        nucleus = (u * 2.5) ** 2 + (v * 2.5) ** 2 <= 1.0
        image = np.where(nucleus[..., None], np.array([70.0, 30.0, 110.0]), image)
    image += rng.normal(0, 4, size=image.shape)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8), (mask * 255).astype(np.uint8)


def write_raw(raw: Path, *, samples: int = 40, seed: int = 7) -> dict[str, str]:
    """Write ``raw/images`` and ``raw/masks``; return the deliberately broken inputs."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        height, width = (int(v) for v in rng.integers(96, 129, size=2))
        image, mask = cell_pair(rng, height, width)
        images.save_png(raw / "images" / f"cell_{index:03d}.png", image)
        images.save_png(raw / "masks" / f"cell_{index:03d}.png", mask)
    broken = {
        "images/cell_900.png": "truncated PNG (truncated)",
        "masks/cell_901.png": "mask with a 128 (mask_values)",
        "images/cell_902.png": "image without a mask (orphan)",
    }
    image, mask = cell_pair(rng, 100, 100)
    images.save_png(raw / "images" / "cell_900.png", image)
    images.save_png(raw / "masks" / "cell_900.png", mask)
    data = (raw / "images" / "cell_900.png").read_bytes()
    (raw / "images" / "cell_900.png").write_bytes(data[: len(data) // 2])
    image, mask = cell_pair(rng, 110, 120)
    mask[5:15, 5:15] = 128
    images.save_png(raw / "images" / "cell_901.png", image)
    images.save_png(raw / "masks" / "cell_901.png", mask)
    images.save_png(raw / "images" / "cell_902.png", cell_pair(rng, 100, 100)[0])
    return broken


def prepare(folder: Path) -> Path:
    """Lay out the demo in ``folder`` and return its config.

    An empty or new folder gets the raw data and ``demo.yaml``; a previous demo (its
    ``demo.yaml`` is the demo's own) is kept as it is, so building it again makes the next
    version. Nothing of a folder that is not a demo is overwritten.

    Raises:
        UsageError: ``folder`` holds another ``demo.yaml``, or data of its own (exit code 2).
    """
    return lay_out(folder, resources.demo_config(), write_raw)


def lay_out(folder: Path, shipped_config: Path, write: Callable[[Path], object]) -> Path:
    """Copy ``shipped_config`` into ``folder`` and have ``write`` fill ``folder/raw``, as
    ``prepare`` does for the demo: a previous copy (same config bytes) is kept as it is.

    Raises:
        UsageError: ``folder`` holds another config of that name, or data of its own.
    """
    config = folder / shipped_config.name
    shipped = shipped_config.read_bytes()
    made: list[Path] = []  # what this call created, undone if writing the raw folder fails
    if config.is_symlink() or config.exists():
        if not config.is_file() or config.read_bytes() != shipped:
            raise UsageError(
                "is not the demo's own config; it was left as it is: give --dir a new or "
                "empty folder (or a previous demo's)",
                path=config,
            )
    else:
        found = [name for name in ("raw", "releases") if (folder / name).exists()]
        if found:
            raise UsageError(
                f"holds {' and '.join(found)}/ but no {config.name}, so it is no previous "
                f"demo; give --dir a new or empty folder",
                path=folder,
            )
        if not folder.exists():
            made.append(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(config, shipped)
        made.append(config)
    if not (folder / "raw").exists():
        staging = folder / f".raw.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            write(staging)
        except BaseException:  # no half-made demo folder, whatever stopped the writer
            shutil.rmtree(staging, ignore_errors=True)
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    if path.is_dir():
                        path.rmdir()  # only if empty: nothing of anyone else's goes
                    else:
                        path.unlink()
            raise
        os.replace(staging, folder / "raw")  # a demo killed while writing leaves no raw/
    return config
