"""preview of a series field: one tile per recording, a small line plot per channel.

Drawn with Pillow (already a dependency; a plotting library would only add weight). Each
channel is reduced to one min-max pair per pixel column, so a 10 kHz channel draws as fast as
a 1 Hz one and its peaks stay visible; a channel of shape (n, 3) draws each component in its
own band with its own range (an accelerometer's z carries gravity: on a shared axis x and y
would be flat lines). A preview reads at most ``MAX_ROWS`` rows of a channel (its start).
Registered as the series kind's drawer (its registry entry's ``preview``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

PLOT_W, PLOT_H, TITLE = 240, 46, 13
BACKGROUND, INK, FRAME = (255, 255, 255), (30, 30, 30), (200, 200, 200)
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))
MAX_ROWS = 1 << 20  # rows of a channel a preview reads at most (its first ones)


def envelope(values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel column, the min and max of the samples it covers (NaN-free, not empty)."""
    edges = np.linspace(0, len(values), min(width, len(values)) + 1).astype(np.int64)
    starts = edges[:-1]
    return np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)


def plot(values: np.ndarray, title: str, font: Any) -> Image.Image:
    """One channel: its title, then each component in its own band."""
    image = Image.new("RGB", (PLOT_W, PLOT_H + TITLE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((2, 0), title, fill=INK, font=font)
    draw.rectangle((0, TITLE, PLOT_W - 1, TITLE + PLOT_H - 1), outline=FRAME)
    flat = values.reshape(len(values), -1).astype(np.float64)
    finite = flat[np.isfinite(flat).all(axis=1)]
    if not len(finite):
        draw.text((4, TITLE + PLOT_H // 2 - 6), "no samples", fill=INK, font=font)
        return image
    height = (PLOT_H - 2) / finite.shape[1]
    for component in range(finite.shape[1]):
        top = TITLE + 1 + component * height
        colour = COLOURS[component % len(COLOURS)]
        _band(draw, finite[:, component], top, height, colour, font)
    return image


def _band(draw: Any, values: np.ndarray, top: float, height: float, colour: Any, font: Any) -> None:
    """One component: a min-max stroke per pixel column joined by its mid line."""
    low, high = float(values.min()), float(values.max())
    span = high - low or 1.0
    bottom, peak = envelope(values, PLOT_W - 2)
    columns = len(bottom)

    def x(i: int) -> float:
        return 1 + i * (PLOT_W - 3) / max(columns - 1, 1)

    def y(v: float) -> float:
        return top + height - 2 - (v - low) / span * max(height - 4, 1)

    for i in range(columns):
        draw.line((x(i), y(bottom[i]), x(i), y(peak[i])), fill=colour)
    if columns > 1:  # a slow channel reads as a line, not as dots
        draw.line([(x(i), y(v)) for i, v in enumerate((bottom + peak) / 2)], fill=colour)
    text = f"{low:.4g}..{high:.4g}"
    box = draw.textbbox((PLOT_W - 4, top), text, font=font, anchor="ra")
    draw.rectangle((box[0] - 2, box[1] - 1, box[2] + 1, box[3] + 1), fill=BACKGROUND)
    draw.text((PLOT_W - 4, top), text, fill=INK, font=font, anchor="ra")


def draw(sample: Any, field: str) -> Image.Image:
    """The preview tile of one stored recording (or window): a plot per channel, stacked.

    ``sample`` is an ``h5etl.preview.drawn.PreviewSample``; only the channels' values are read
    (of a fixed-size channel, its real rows: ``<channel>_length``)."""
    font = ImageFont.load_default(size=10)
    columns = sample.columns_of(field)
    plots = []
    for column in columns:
        record = sample.record(column)
        if record.extra.get("role") != "values":
            continue
        channel = str(record.extra.get("channel", column))
        values, total = _rows(sample, column, columns, f"{field}_{channel}_length")
        rate = record.extra.get("rate_hz")
        units = f" [{record.extra['units']}]" if record.extra.get("units") else ""
        shown = f"{len(values)} of {total}" if len(values) < total else f"{total}"
        when = f"{float(rate):g} Hz" if rate else "timestamps"
        plots.append(plot(values, f"{channel}{units} · {when} · {shown} samples", font))
    tile = Image.new("RGB", (PLOT_W, max(1, sum(p.height for p in plots))), BACKGROUND)
    y = 0
    for picture in plots:
        tile.paste(picture, (0, y))
        y += picture.height
    return tile


def _rows(sample: Any, column: str, columns: list[str], length: str) -> tuple[np.ndarray, int]:
    """A channel's values to draw (at most ``MAX_ROWS``) and how many rows it has."""
    if sample.record(column).column == "ragged":
        total = sample.length(column)
        return sample.rows(column, 0, min(total, MAX_ROWS)), total
    values = np.asarray(sample.value(column))
    real = int(sample.value(length)) if length in columns else len(values)
    return values[:real], real
