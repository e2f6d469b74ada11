"""Synthetic pictures for the examples: small, deterministic for a seed, cheap to draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5etl.inputs import raster as images


def grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    return yy, xx


def ellipse(
    rng: np.random.Generator, height: int, width: int, *, radius: tuple[float, float]
) -> np.ndarray:
    """A filled ellipse at a random place, random radii in ``radius`` and angle."""
    yy, xx = grid(height, width)
    cy, cx = rng.uniform(0.25, 0.75) * height, rng.uniform(0.25, 0.75) * width
    ry, rx = rng.uniform(*radius, size=2)
    angle = rng.uniform(0, np.pi)
    dy, dx = yy - cy, xx - cx
    u = (dx * np.cos(angle) + dy * np.sin(angle)) / rx
    v = (-dx * np.sin(angle) + dy * np.cos(angle)) / ry
    inside: np.ndarray = u**2 + v**2 <= 1.0
    return inside


def smooth(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """An (h, w, 3) float field of a few sine waves in 0..255: detail for super-resolution."""
    yy, xx = grid(height, width)
    out = np.zeros((height, width, 3), dtype=np.float32)
    for channel in range(3):
        for _ in range(3):
            fy, fx = rng.uniform(0.5, 6, size=2) * 2 * np.pi
            phase = rng.uniform(0, 2 * np.pi)
            out[..., channel] += np.sin(fy * yy / height + fx * xx / width + phase)
    return (out / 6 + 0.5) * 255


def rgb(values: np.ndarray, rng: np.random.Generator, noise: float = 4.0) -> np.ndarray:
    """Float pixels with sensor noise, as uint8."""
    noisy = values + rng.normal(0, noise, size=values.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def save(path: Path, array: np.ndarray) -> None:
    images.save_png(path, array)


def truncate(path: Path) -> None:
    """Cut a written file in half: the decoder finds it ends before the image does."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def not_an_image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("this is a text file named like an image\n", encoding="utf-8")
