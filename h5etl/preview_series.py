"""preview of a series field: a small line plot per channel, one row per recording.

Drawn with Pillow (already a dependency; a plot library would only add weight): each channel
of a recording is reduced to one min-max pair per pixel column, so a 10 kHz channel of an hour
draws as fast as a short one and its peaks stay visible. A channel of shape (n, 3) draws
three lines in three colours. The y axis is the channel's own range in that recording.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from h5etl.readers.series import SeriesReader

PLOT_W, PLOT_H = 300, 70
GAP, LINE = 8, 14
BACKGROUND, INK, FRAME = (255, 255, 255), (30, 30, 30), (200, 200, 200)
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14))
ROWS = 6  # recordings shown at most: each row is as wide as its channels


def envelope(values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel column, the min and max of the samples it covers (NaN-free input)."""
    n = len(values)
    edges = np.linspace(0, n, min(width, n) + 1).astype(np.int64)
    starts = edges[:-1]
    low = np.minimum.reduceat(values, starts)
    high = np.maximum.reduceat(values, starts)
    return low, high


def _plot(values: np.ndarray, title: str, font: Any) -> Image.Image:
    """One channel's plot: every component a line, the value range written on the left."""
    image = Image.new("RGB", (PLOT_W, PLOT_H + LINE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((2, 0), title, fill=INK, font=font)
    top = LINE
    draw.rectangle((0, top, PLOT_W - 1, top + PLOT_H - 1), outline=FRAME)
    flat = values.reshape(len(values), -1).astype(np.float64)
    finite = flat[np.isfinite(flat).all(axis=1)]
    if not len(finite):
        draw.text((4, top + PLOT_H // 2 - 6), "no samples", fill=INK, font=font)
        return image
    low, high = float(finite.min()), float(finite.max())
    span = high - low or 1.0
    for component in range(finite.shape[1]):
        bottom, peak = envelope(finite[:, component], PLOT_W - 2)
        columns = len(bottom)
        for x in range(columns):
            px = 1 + x * (PLOT_W - 2) / max(columns, 1)
            y0 = top + PLOT_H - 2 - (bottom[x] - low) / span * (PLOT_H - 4)
            y1 = top + PLOT_H - 2 - (peak[x] - low) / span * (PLOT_H - 4)
            draw.line((px, y0, px, y1), fill=COLOURS[component % len(COLOURS)])
        if columns > 1:  # join neighbouring columns so a slow channel reads as a line
            points = [
                (1 + x * (PLOT_W - 2) / columns, top + PLOT_H - 2 - (v - low) / span * (PLOT_H - 4))
                for x, v in enumerate((bottom + peak) / 2)
            ]
            draw.line(points, fill=COLOURS[component % len(COLOURS)])
    draw.text((3, top + 1), f"{high:.4g}", fill=INK, font=font)
    draw.text((3, top + PLOT_H - LINE), f"{low:.4g}", fill=INK, font=font)
    return image


def render_series(path: str, split: str, field: str | None, n: int, heading: str) -> Image.Image:
    """The first ``n`` (at most ``ROWS``) samples of ``split``: a row of channel plots each."""
    with SeriesReader(path, split, field) as reader:
        shown = min(n, ROWS, len(reader))
        samples = [reader[i] for i in range(shown)]
        channels = reader.channels
        total = len(reader)
    font = ImageFont.load_default(size=11)
    rows = [_row(sample, channels, font) for sample in samples]
    width = max([GAP + sum(p.width + GAP for p in row) for row in rows] or [PLOT_W])
    title = f"{heading} · {split} · first {shown} of {total}"
    width = max(width, int(font.getlength(title)) + 2 * GAP)
    height = LINE + 2 * GAP + len(rows) * (PLOT_H + 2 * LINE + GAP)
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((GAP, GAP), title, fill=INK, font=font)
    y = LINE + 2 * GAP
    for index, (sample, row) in enumerate(zip(samples, rows, strict=True)):
        draw.text((GAP, y), _label(index, sample), fill=INK, font=font)
        x = GAP
        for plot in row:
            sheet.paste(plot, (x, y + LINE))
            x += plot.width + GAP
        y += PLOT_H + 2 * LINE + GAP
    return sheet


def _row(sample: dict[str, Any], channels: dict[str, Any], font: Any) -> Sequence[Image.Image]:
    plots = []
    for name, info in channels.items():
        values = np.asarray(sample[name])
        real = sample.get(f"{name}_length")
        if real is not None:
            values = values[: int(real)]  # padding is no data
        rate = f"{info.rate_hz:g} Hz" if info.rate_hz else "timestamps"
        units = f" [{info.units}]" if info.units else ""
        plots.append(_plot(values, f"{name}{units} · {rate} · {len(values)} samples", font))
    return plots


def _label(index: int, sample: dict[str, Any]) -> str:
    parts = [f"#{index}"]
    if "recording" in sample:
        parts.append(f"{sample['recording']} @ {float(sample['offset']):g} s")
    start = sample.get("start_time")
    if start is not None and not math.isnan(float(start)):
        parts.append(f"start {float(start):.3f}")
    return "  ".join(parts)
