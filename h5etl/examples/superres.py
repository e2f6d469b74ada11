"""Super-resolution examples: low/high pairs at scale 4, and low derived from high."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from h5etl.examples import draw
from h5etl.examples.registry import Broken, register

HIGH = 64  # high-res side; low-res is HIGH // FACTOR
FACTOR = 4


def high_res(rng: np.random.Generator, height: int = HIGH, width: int = HIGH) -> np.ndarray:
    """A detailed RGB picture: sine waves and a few sharp-edged blobs."""
    values = draw.smooth(rng, height, width)
    for _ in range(3):
        inside = draw.ellipse(rng, height, width, radius=(height / 10, height / 4))
        values = np.where(inside[..., None], rng.uniform(0, 255, size=3), values)
    return draw.rgb(values, rng, noise=2.0)


def low_res(high: np.ndarray, factor: int = FACTOR) -> np.ndarray:
    """What a camera at 1/factor resolution sees: a box (area) average."""
    height, width = high.shape[0] // factor, high.shape[1] // factor
    low = Image.fromarray(high).resize((width, height), Image.Resampling.BOX)
    return np.asarray(low)


@register(
    "superres",
    config="superres.yaml",
    summary="16x16 low-res beside 64x64 high-res, paired by stem, declared scale 4",
)
def superres(raw: Path, *, samples: int = 20, seed: int = 5) -> dict[str, Broken]:
    """``raw/low/NNN.png`` (16x16) and ``raw/high/NNN.png`` (64x64), and broken inputs: a pair
    whose high-res is not 4x its low-res, a low-res without its high-res, a truncated low-res."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        high = high_res(rng)
        draw.save(raw / "high" / f"{index:03d}.png", high)
        draw.save(raw / "low" / f"{index:03d}.png", low_res(high))
    broken = {
        "high/900.png": Broken("scale_mismatch", "high-res 60x60 is not 4 x its 16x16 low-res"),
        "low/901.png": Broken("orphan", "a low-res without its high-res"),
        "low/902.png": Broken("truncated", "the low-res PNG is cut in half"),
    }
    high = high_res(rng)
    draw.save(raw / "high" / "900.png", high[:60, :60])
    draw.save(raw / "low" / "900.png", low_res(high))
    draw.save(raw / "low" / "901.png", low_res(high_res(rng)))
    high = high_res(rng)
    draw.save(raw / "high" / "902.png", high)
    draw.save(raw / "low" / "902.png", low_res(high))
    draw.truncate(raw / "low" / "902.png")
    return broken


@register(
    "superres-derived",
    config="superres-derived.yaml",
    summary="64x64 high-res only; the 16x16 low-res computed from it (bicubic, factor 4)",
)
def superres_derived(raw: Path, *, samples: int = 20, seed: int = 6) -> dict[str, Broken]:
    """``raw/high/NNN.png`` (64x64) only, and broken inputs: a high-res whose sides are no
    multiple of 4 (no exact low-res), a truncated one, a text file named ``.png``."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        draw.save(raw / "high" / f"{index:03d}.png", high_res(rng))
    broken = {
        "high/900.png": Broken("scale_mismatch", "62x64 is not a multiple of 4 on each axis"),
        "high/901.png": Broken("truncated", "the PNG is cut in half"),
        "high/902.png": Broken("unreadable", "a text file named .png"),
    }
    draw.save(raw / "high" / "900.png", high_res(rng, 62, 64))
    draw.save(raw / "high" / "901.png", high_res(rng))
    draw.truncate(raw / "high" / "901.png")
    draw.not_an_image(raw / "high" / "902.png")
    return broken
