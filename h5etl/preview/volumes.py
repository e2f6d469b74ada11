"""preview of volume releases: the middle slice of each case, its label volume drawn over it.

The ``volume`` kind's drawer (its registry entry's ``preview``): it reads the one
slice it shows of the image volume and of its label volume, never the case. Slices are shown
with their 1st..99th percentile stretched to grey (CT and MR alike: a fixed HU window would
blank MR), labels in the preview's palette, outlined.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from h5etl.preview.drawn import PreviewSample


def grey(plane: np.ndarray) -> np.ndarray:
    """A slice as (1, h, w) uint8: its 1st..99th percentile stretched to 0..255."""
    values = plane.astype(np.float32)
    low, high = np.percentile(values, [1, 99]) if values.size else (0.0, 1.0)
    scaled = (values - low) * (255 / (high - low or 1))
    return np.clip(scaled, 0, 255).astype(np.uint8)[None]


def pair_of(sample: PreviewSample, field: str) -> tuple[str, str | None]:
    """The image volume to show for ``field`` and the label volume drawn over it."""
    fields = sample.layout.fields
    if "values" in fields[field].extra:  # a label volume: show the image it belongs to
        image = str(fields[field].extra.get("of") or field)
        return (image if image in fields else field), field
    labels = [
        name
        for name, record in fields.items()
        if record.kind == "volume" and "values" in record.extra and record.extra.get("of") == field
    ]
    return field, labels[0] if labels else None


def draw_middle_slice(sample: PreviewSample, field: str) -> Image.Image:
    """The middle slice of the sample's case, its labels over it (at display size)."""
    from h5etl.preview import sheet as preview

    image, labels = pair_of(sample, field)
    slices = sample.length(image)
    middle = slices // 2
    if slices:
        plane = sample.rows(image, middle, middle + 1)[0]
    else:  # an empty case: a blank tile, not a failed preview
        plane = np.zeros(sample.record(image).shape, dtype=np.uint8)
    mask = sample.rows(labels, middle, middle + 1) if labels is not None and slices else None
    return preview._tile(grey(plane), mask)
