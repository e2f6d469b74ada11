"""Classification examples: shapes by class folder, and the same from a ``labels.csv``."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from h5etl.examples import draw
from h5etl.examples.registry import Broken, register

CLASSES = ("circle", "square", "stripes")
SIZE = 32


def picture(rng: np.random.Generator, kind: str, size: int = SIZE) -> np.ndarray:
    """An RGB picture of one class: a disk, a square or stripes on a lit background."""
    yy, xx = draw.grid(size, size)
    background = rng.uniform(20, 90, size=3)
    colour = rng.uniform(140, 250, size=3)
    if kind == "circle":
        inside = draw.ellipse(rng, size, size, radius=(size / 5, size / 3))
    elif kind == "square":
        top, left = rng.integers(2, size // 3, size=2)
        side = int(rng.integers(size // 3, size // 2))
        inside = (yy >= top) & (yy < top + side) & (xx >= left) & (xx < left + side)
    else:
        angle, period = rng.uniform(0, np.pi), rng.uniform(4, 8)
        inside = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period) > 0
    values = np.where(inside[..., None], colour, background)
    return draw.rgb(values, rng)


@register(
    "classification",
    config="classification.yaml",
    summary="shapes in class folders (raw/images/<class>/*.png), labels from the folder",
)
def classification(raw: Path, *, samples: int = 24, seed: int = 3) -> dict[str, Broken]:
    """``raw/images/<class>/NNN.png`` for three classes, an empty class folder, and broken
    inputs: a truncated file, a file outside any class folder, one nested a level deeper and
    a text file named ``.png``."""
    rng = np.random.default_rng(seed)
    root = raw / "images"
    for index in range(samples):
        kind = CLASSES[index % len(CLASSES)]
        draw.save(root / kind / f"{index:03d}.png", picture(rng, kind))
    (root / "triangle").mkdir(parents=True)  # an empty class folder: a warning, no class
    broken = {
        "images/square/900.png": Broken("truncated", "the PNG is cut in half"),
        "images/901.png": Broken("no_label", "it lies in the root, in no class folder"),
        "images/circle/big/902.png": Broken(
            "no_label", "it lies a level deeper than a class folder (nested folders are no class)"
        ),
        "images/stripes/903.png": Broken("unreadable", "a text file named .png"),
    }
    draw.save(root / "square" / "900.png", picture(rng, "square"))
    draw.truncate(root / "square" / "900.png")
    draw.save(root / "901.png", picture(rng, "circle"))
    draw.save(root / "circle" / "big" / "902.png", picture(rng, "circle"))
    draw.not_an_image(root / "stripes" / "903.png")
    return broken


@register(
    "classification-csv",
    config="classification-csv.yaml",
    summary="shapes in one folder, labels from raw/labels.csv (file,label), classes declared",
)
def classification_csv(raw: Path, *, samples: int = 24, seed: int = 4) -> dict[str, Broken]:
    """``raw/images/img_NNN.png`` and ``raw/labels.csv`` (``file,label``), and broken inputs:
    a file without a row, a row with an empty label, a row naming an undeclared class, a
    truncated file. The table also has a row for a file that does not exist (a warning)."""
    rng = np.random.default_rng(seed)
    root = raw / "images"
    rows: list[tuple[str, str]] = []
    for index in range(samples):
        kind = CLASSES[index % len(CLASSES)]
        name = f"img_{index:03d}.png"
        draw.save(root / name, picture(rng, kind))
        rows.append((name, kind))
    broken = {
        "images/img_900.png": Broken("no_label", "labels.csv has no row for it"),
        "images/img_901.png": Broken("no_label", "its row in labels.csv has an empty label"),
        "images/img_902.png": Broken(
            "unknown_class", "its row says 'hexagon', which is not in fields.label.classes"
        ),
        "images/img_903.png": Broken("truncated", "the PNG is cut in half"),
    }
    for index, kind in ((900, "circle"), (901, "circle"), (902, "square"), (903, "stripes")):
        draw.save(root / f"img_{index}.png", picture(rng, kind))
    draw.truncate(root / "img_903.png")
    rows += [("img_901.png", ""), ("img_902.png", "hexagon"), ("img_903.png", "stripes")]
    rows.append(("img_999.png", "circle"))  # a row for no file: warned about, not a reject
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(("file", "label"))
    writer.writerows(rows)
    (raw / "labels.csv").write_text(text.getvalue(), encoding="utf-8")
    return broken
