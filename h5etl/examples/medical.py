"""Medical-style examples: 16-bit CT slices with masks, and cells with patient metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from h5etl.examples import demo, draw
from h5etl.examples.registry import Broken, register

SLICE = 64
AIR, TISSUE, BONE = 66, 1040, 2090  # CT-like grey values, far beyond 8 bits


def ct_slice(rng: np.random.Generator, size: int = SLICE) -> tuple[np.ndarray, np.ndarray]:
    """A uint16 slice (values 66..2090: air, soft tissue, bone) and its 0/1/2 label mask."""
    body = draw.ellipse(rng, size, size, radius=(size / 3.2, size / 2.4))
    bone = body & draw.ellipse(rng, size, size, radius=(size / 12, size / 7))
    labels = body.astype(np.uint8) + bone.astype(np.uint8)
    values = np.choose(labels, [AIR, TISSUE, BONE]).astype(np.float64)
    values += np.where(body, rng.normal(0, 25, size=labels.shape), 0)
    return np.clip(values, AIR, BONE).astype(np.uint16), labels


@register(
    "ct16",
    config="ct16.yaml",
    summary="16-bit CT-like slices (values 66..2090) into a uint16 field, 3-class masks",
)
def ct16(raw: Path, *, samples: int = 20, seed: int = 8) -> dict[str, Broken]:
    """``raw/slices/ct_NNN.png`` (16-bit grey) and ``raw/masks/ct_NNN.png`` (labels 0, 1, 2),
    and broken inputs: a truncated slice, a mask holding a label 3, a mask of another size."""
    rng = np.random.default_rng(seed)
    for index in range(samples):
        image, mask = ct_slice(rng)
        draw.save(raw / "slices" / f"ct_{index:03d}.png", image)
        draw.save(raw / "masks" / f"ct_{index:03d}.png", mask)
    broken = {
        "slices/ct_900.png": Broken("truncated", "the 16-bit PNG is cut in half"),
        "masks/ct_901.png": Broken("mask_values", "the mask holds a 3, not one of 0, 1, 2"),
        "masks/ct_902.png": Broken("size_mismatch", "the mask is 60x64, its slice 64x64"),
    }
    for index in (900, 901, 902):
        image, mask = ct_slice(rng)
        if index == 901:
            mask[:4, :4] = 3
        draw.save(raw / "slices" / f"ct_{index}.png", image)
        draw.save(raw / "masks" / f"ct_{index}.png", mask[:60] if index == 902 else mask)
    draw.truncate(raw / "slices" / "ct_900.png")
    return broken


SCANNERS = ("Leica GT450", "Hamamatsu S360", "Philips UFS")


@register(
    "metadata",
    config="metadata.yaml",
    summary="cells with masks, patient and age from raw/patients.csv, scanner and dose "
    "from a JSON sidecar per image",
)
def metadata(raw: Path, *, samples: int = 20, seed: int = 9) -> dict[str, Broken]:
    """``raw/images``, ``raw/masks``, ``raw/patients.csv`` (``file,patient,age``) and a sidecar
    ``raw/meta/<stem>.json`` per image (``{"scanner": ..., "acquisition": {"dose": ...}}``),
    and broken inputs: an image the table has no row for, an age that is no number, a sidecar
    that is not JSON, a sidecar without a scanner."""
    rng = np.random.default_rng(seed)
    rows = ["file,patient,age"]
    total = samples + 4
    for index in range(total):
        name = f"slide_{index:03d}" if index < samples else f"slide_{900 + index - samples}"
        image, mask = demo.cell_pair(rng, 64, 64)
        draw.save(raw / "images" / f"{name}.png", image)
        draw.save(raw / "masks" / f"{name}.png", mask)
        age = f"{rng.integers(20, 90)}.{rng.integers(0, 10)}"
        rows.append(f"{name}.png,P{index % 5:03d},{age}")
        sidecar = {
            "scanner": SCANNERS[index % len(SCANNERS)],
            "acquisition": {"dose": round(float(rng.uniform(0.5, 2.0)), 3)},
        }
        (raw / "meta").mkdir(parents=True, exist_ok=True)
        (raw / "meta" / f"{name}.json").write_text(json.dumps(sidecar), encoding="utf-8")
    broken = {
        "images/slide_900.png": Broken("no_value", "patients.csv has no row for it"),
        "images/slide_901.png": Broken("bad_value", "its age in patients.csv is 'forty'"),
        "meta/slide_902.json": Broken("bad_sidecar", "its sidecar is not valid JSON"),
        "meta/slide_903.json": Broken("no_value", "its sidecar has no 'scanner'"),
    }
    rows = [row for row in rows if not row.startswith("slide_900.png,")]
    rows = [
        row.rsplit(",", 1)[0] + ",forty" if row.startswith("slide_901.png,") else row
        for row in rows
    ]
    (raw / "patients.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (raw / "meta" / "slide_902.json").write_text('{"scanner": "Leica GT450",', encoding="utf-8")
    (raw / "meta" / "slide_903.json").write_text(
        json.dumps({"acquisition": {"dose": 1.25}}), encoding="utf-8"
    )
    return broken
