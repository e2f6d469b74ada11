"""The kind checklist (``h5etl.testing.KindContractTests``) on an image field a random user
transform makes: --jobs 1 and 2, two builds, a resume after a kill store the same bytes; a
broken input is still its reader's reject; the readers return the transformed values."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from h5etl.testing import Broken, KindContractTests

SIDE = 16
SIZES = ((10, 12), (16, 16), (13, 9), (11, 15))
SEED = 3
PREP = """
import numpy as np


def noise(value, *, scale, rng):
    drawn = rng.integers(-scale, scale + 1, value.shape)
    return np.clip(value.astype(np.int16) + drawn, 0, 255).astype(np.uint8)
"""


def drawn_noise(key: str, value: np.ndarray, scale: int) -> np.ndarray:
    """The documented seed rule, written out: SHA-256 of canonical JSON [seed, key, site]."""
    text = json.dumps([SEED, key, "image[0]"], separators=(",", ":"))
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "little")
    drawn = np.random.default_rng(seed).integers(-scale, scale + 1, value.shape)
    noisy: np.ndarray = np.clip(value.astype(np.int16) + drawn, 0, 255).astype(np.uint8)
    return noisy


class TestTransformedImageContract(KindContractTests):
    """8-bit grey PNGs with seeded noise added by ``prep:noise`` beside the config."""

    field = "image"

    def make_raw(self, root: Path) -> Path:
        rng = np.random.default_rng(0)
        (root / "raw").mkdir()
        for i in range(8):
            array = rng.integers(0, 256, SIZES[i % len(SIZES)], dtype=np.uint8)
            Image.fromarray(array).save(root / "raw" / f"g{i:02d}.png")
        (root / "prep.py").write_text(PREP)
        config = {
            "name": "noisy",
            "output": "releases",
            "sources": {"image": {"dir": "raw", "glob": "*.png"}},
            "splits": {"train": 0.5, "valid": 0.5},
            "seed": SEED,
            "fields": {
                "image": {
                    "kind": "image",
                    "shape": [1, SIDE, SIDE],
                    "transform": [{"call": "prep:noise", "args": {"scale": 20}}],
                }
            },
            "storage": {"chunk_samples": 2, "compression": "lzf"},
            "max_rejects": None,
        }
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
        return path

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "g03.png"
        path.write_bytes(path.read_bytes()[:40])
        return Broken("g03", path, "truncated")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        out = {}
        for png in (root / "raw").glob("*.png"):
            with Image.open(png) as image:
                value = drawn_noise(png.stem, np.asarray(image.convert("L")), 20)
            row = np.zeros((1, SIDE, SIDE), dtype=np.uint8)
            top, left = (SIDE - value.shape[0]) // 2, (SIDE - value.shape[1]) // 2
            row[0, top : top + value.shape[0], left : left + value.shape[1]] = value
            out[png.stem] = row
        return out
