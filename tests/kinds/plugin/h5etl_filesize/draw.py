"""The ``filesize`` kind's preview tile: a grey bar as long as the file is large (log scale)."""

from __future__ import annotations

import math
from typing import Any

from PIL import Image


def draw(sample: Any, field: str) -> Image.Image:
    size = int(sample.value(field))
    tile = Image.new("L", (64, 8), 0)
    width = min(64, int(8 * math.log2(size + 1)))
    tile.paste(255, (0, 0, width, 8))
    return tile
