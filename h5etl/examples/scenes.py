"""Scene examples: colour-coded street masks (Cityscapes-style), and seed-style flat names."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5etl.examples import demo, draw
from h5etl.examples.registry import Broken, register

# Cityscapes colours (their label ids are 7, 11, 23, 26; unlabelled [0, 0, 0] is 0)
ROAD, BUILDING, SKY, CAR = (128, 64, 128), (70, 70, 70), (70, 130, 180), (0, 0, 142)
PERSON = (220, 20, 60)  # a Cityscapes colour the example's table leaves out
HEIGHT, WIDTH = 32, 64


def street(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An RGB street scene and its colour-coded mask: sky, buildings, road, cars, and
    unlabelled pixels along the kerb."""
    yy, _ = draw.grid(HEIGHT, WIDTH)
    horizon = int(rng.integers(HEIGHT // 4, HEIGHT // 2))
    skyline = horizon - rng.integers(0, horizon // 2 + 1, size=WIDTH // 8).repeat(8)
    mask = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
    mask[yy < skyline[None, :]] = SKY
    mask[(yy >= skyline[None, :]) & (yy < horizon)] = BUILDING
    mask[yy >= horizon + 2] = ROAD
    for _ in range(int(rng.integers(1, 4))):
        top = int(rng.integers(horizon + 2, HEIGHT - 6))
        left = int(rng.integers(0, WIDTH - 14))
        mask[top : top + 6, left : left + 14] = CAR
    shade = rng.uniform(0.8, 1.1)
    image = draw.rgb(mask.astype(np.float64) * shade + 20, rng, noise=6.0)
    return image, mask


@register(
    "cityscapes",
    config="cityscapes.yaml",
    summary="street scenes with colour-coded RGB masks mapped to label ids by a colors: table",
)
def cityscapes(raw: Path, *, samples: int = 20, seed: int = 10) -> dict[str, Broken]:
    """``raw/images/street_NNN.png`` and ``raw/masks/street_NNN.png`` (RGB colours), and broken
    inputs: a mask with a colour the table lacks (a person), a truncated mask, an image
    without its mask."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        image, mask = street(rng)
        draw.save(raw / "images" / f"street_{index:03d}.png", image)
        draw.save(raw / "masks" / f"street_{index:03d}.png", mask)
    broken = {
        "masks/street_900.png": Broken("unknown_color", f"a person {list(PERSON)}: not in colors:"),
        "masks/street_901.png": Broken("truncated", "the mask PNG is cut in half"),
        "images/street_902.png": Broken("orphan", "an image without its mask"),
    }
    for index in (900, 901, 902):
        image, mask = street(rng)
        if index == 900:
            mask[-8:-2, 30:33] = PERSON
        draw.save(raw / "images" / f"street_{index}.png", image)
        if index != 902:
            draw.save(raw / "masks" / f"street_{index}.png", mask)
    draw.truncate(raw / "masks" / "street_901.png")
    return broken


@register(
    "seed",
    config="seed.yaml",
    summary="seed-style flat names: fields x and y stored as /x_train, /y_train, /x_valid, "
    "/y_valid",
)
def seed_layout(raw: Path, *, samples: int = 20, seed: int = 11) -> dict[str, Broken]:
    """``raw/x/NNN.png`` (RGB cells) and ``raw/y/NNN.png`` (0/255 masks), and broken inputs: a
    truncated x, a y holding a 128, an x without its y."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        image, mask = demo.cell_pair(rng, 48, 48)
        draw.save(raw / "x" / f"{index:03d}.png", image)
        draw.save(raw / "y" / f"{index:03d}.png", mask)
    broken = {
        "x/900.png": Broken("truncated", "the PNG is cut in half"),
        "y/901.png": Broken("mask_values", "the mask holds a 128, not 0 or 255"),
        "x/902.png": Broken("orphan", "an x without its y"),
    }
    for index in (900, 901, 902):
        image, mask = demo.cell_pair(rng, 48, 48)
        if index == 901:
            mask[:6, :6] = 128
        draw.save(raw / "x" / f"{index}.png", image)
        if index != 902:
            draw.save(raw / "y" / f"{index}.png", mask)
    draw.truncate(raw / "x" / "900.png")
    return broken
