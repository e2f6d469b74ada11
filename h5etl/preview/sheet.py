"""sheet: a contact sheet of a release, each image with its mask drawn over it.

This is a presentation module, not a pipeline stage: it draws and saves a PNG with Pillow.
STYLE keeps Pillow inside the decoder for *reading* inputs; drawing a picture for people to
look at is a separate concern, kept here so the build never depends on it.

The first ``n`` samples of a split are shown: releases are shuffled at write time, so they are
a random sample, and they come out of the file in one contiguous read. Which field is the
image, the mask and the caption comes from the kinds in the release's layout record (see
``roles``), wherever the template puts their datasets.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from h5etl.format import contract as fileformat
from h5etl.format import fileinfo
from h5etl.format.contract import FieldRecord, LayoutRecord
from h5etl.format.reader_hints import KerasRole, hints_of
from h5etl.preview.drawn import draw_tiles, drawn_field
from h5etl.readers import ReaderError, Release

# Mask colours by value (1, 2, ...): bright hues that stand out on stained tissue and on grey.
PALETTE = np.array(
    [(0, 255, 110), (255, 210, 0), (0, 170, 255), (255, 60, 200), (255, 110, 0), (170, 90, 255)],
    dtype=np.float32,
)
ALPHA = 0.3  # fill opacity, low enough to see the stain through; the outline is opaque
TILE = 192  # target tile edge in pixels
GAP = 8
BACKGROUND = (255, 255, 255)
INK = (30, 30, 30)


@dataclass(frozen=True, slots=True)
class Roles:
    """Which stored field plays which part in the picture: from the layout record's kinds."""

    image: str
    mask: str | None
    captions: tuple[str, ...]  # a label (shown by class name), then a text field


def _channels(record: FieldRecord, channels: tuple[int, ...]) -> bool:
    return record.column == "fixed" and len(record.shape) == 3 and record.shape[0] in channels


def _pixels(record: FieldRecord, role: KerasRole) -> bool:
    hints = hints_of(record)
    return hints.channels_first and hints.keras == role


def roles(layout: LayoutRecord) -> Roles:
    """The image, mask and caption fields of a release, chosen by their kinds' reader hints.

    The image is a channels-first input (kind ``image``) of shape (1 or 3, H, W), the mask a
    channels-first target of one channel (``mask``). RGB images first, then one of the mask's
    size (a super-resolution pair shows the image the mask fits), then record order.
    The caption is a label's class name and a text field (``filename`` first) under it.

    Raises:
        ReaderError: the release records no image field of that shape.
    """
    fields = layout.fields
    masks = [n for n, f in fields.items() if _pixels(f, "target") and _channels(f, (1,))]
    mask = masks[0] if masks else None
    images = [n for n, f in fields.items() if _pixels(f, "input") and _channels(f, (1, 3))]
    if not images:
        raise ReaderError("the release has no image field (N, 1|3, H, W) to show")
    fits = fields[mask].shape[1:] if mask else None
    images.sort(
        key=lambda n: (fields[n].shape[0] != 3, fits is not None and fields[n].shape[1:] != fits)
    )
    return Roles(image=images[0], mask=mask, captions=caption_fields(layout))


def caption_fields(layout: LayoutRecord) -> tuple[str, ...]:
    """A label (shown by class name), then the sample's name: a text field of its own
    (``filename`` first), else its sample key. A column of another field (a volume's
    ``ct_series_uid``) names no sample for a person: only when nothing else does."""
    columns = layout.storage
    labels = [n for n, f in columns.items() if hints_of(f).class_indices and not f.shape]
    texts = [n for n, f in columns.items() if f.column == "text"]
    own = sorted(
        (n for n in texts if fileformat.FIELD_KEY not in columns[n].extra),
        key=lambda n: n != "filename",
    )
    key = [fileformat.SAMPLE_KEY] if fileformat.SAMPLE_KEY in layout.samples else []
    return (*labels[:1], *(own or key or texts)[:1])


def captions(
    batch: dict[str, np.ndarray], roles: Roles, classes: dict[str, tuple[str, ...]], count: int
) -> list[str]:
    """One caption per sample: the class name of its label, its text, joined by ``·``."""
    out = []
    for index in range(count):
        parts = []
        for name in roles.captions:
            value = batch[name][index]
            names = classes.get(name, ())
            if names and 0 <= int(value) < len(names):
                parts.append(names[int(value)])
            else:
                parts.append(str(value))
        out.append(" · ".join(parts) or f"#{index}")
    return out


def _to_rgb(image: np.ndarray) -> np.ndarray:
    """A (C, H, W) sample as (H, W, 3) uint8 for display."""
    pixels = np.moveaxis(image, 0, -1)
    if pixels.dtype != np.uint8:
        low, high = float(pixels.min()), float(pixels.max())
        pixels = ((pixels - low) * (255 / (high - low or 1))).astype(np.uint8)
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


def overlay(image: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """A (C, H, W) sample as (H, W, 3) RGB, mask values > 0 blended over it with an outline."""
    return _blend(_to_rgb(image), None if mask is None else mask[0])


def _blend(pixels: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """Tint each labelled pixel with its palette colour; paint the label edges opaque."""
    if labels is None:
        return pixels
    rgb = pixels.astype(np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    inside = labels > 0
    colour = PALETTE[(labels - 1) % len(PALETTE)]
    rgb[inside] = (1 - ALPHA) * rgb[inside] + ALPHA * colour[inside]
    edge = np.zeros_like(inside)
    edge[1:, :] |= labels[1:, :] != labels[:-1, :]
    edge[:-1, :] |= labels[1:, :] != labels[:-1, :]
    edge[:, 1:] |= labels[:, 1:] != labels[:, :-1]
    edge[:, :-1] |= labels[:, 1:] != labels[:, :-1]
    edge &= inside
    rgb[edge] = colour[edge]
    return np.clip(rgb, 0, 255).astype(np.uint8)


def display_size(height: int, width: int) -> tuple[int, int]:
    """(height, width) on the sheet: small samples grow by whole pixels, big ones shrink."""
    edge = max(height, width)
    if edge < TILE:
        factor = max(1, TILE // edge)
        return height * factor, width * factor
    if edge > TILE * 1.5:
        scale = TILE / edge
        return max(1, round(height * scale)), max(1, round(width * scale))
    return height, width


def _tile(image: np.ndarray, mask: np.ndarray | None) -> Image.Image:
    """One sample at display size, the mask drawn at display resolution (thin outlines)."""
    picture = Image.fromarray(_to_rgb(image), "RGB")
    height, width = display_size(picture.height, picture.width)
    if (height, width) != (picture.height, picture.width):
        method = Image.Resampling.NEAREST if height > picture.height else Image.Resampling.LANCZOS
        picture = picture.resize((width, height), method)
    labels = None
    if mask is not None:  # nearest neighbour, in numpy: label values must never be mixed
        rows = np.arange(height) * mask.shape[1] // height
        cols = np.arange(width) * mask.shape[2] // width
        labels = mask[0][rows[:, None], cols[None, :]]
    return Image.fromarray(_blend(np.asarray(picture), labels), "RGB")


def _fit(text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: float) -> str:
    """``text`` cut with an ellipsis in the middle so it fits ``width`` pixels."""
    if font.getlength(text) <= width:
        return text
    keep = len(text)
    while keep > 1:
        keep -= 1
        head = (keep + 1) // 2
        short = f"{text[:head]}…{text[len(text) - (keep - head) :]}"
        if font.getlength(short) <= width:
            return short
    return "…"


def render_preview(
    path: str | os.PathLike[str], *, split: str | None = None, n: int = 16
) -> Image.Image:
    """A grid of the first ``n`` samples of ``split``: mask over image, name underneath.

    Raises:
        ReaderError: not a release, no such split, or no image field in it.
    """
    if n < 1:
        raise ReaderError(f"--n must be at least 1, got {n}", path=os.fspath(path))
    try:
        with fileinfo.open_file(Path(os.path.realpath(path))) as handle:
            try:
                layout = fileformat.read_layout(handle)
            except ValueError as exc:
                raise ReaderError(
                    f"cannot read the root attr {fileformat.LAYOUT_ATTR!r}: {exc}",
                    path=os.fspath(path),
                ) from exc
            chosen = split or (layout.splits[0] if layout.splits else "")
            if chosen not in layout.splits:
                raise ReaderError(
                    f"no split {chosen!r}; the release has: {', '.join(layout.splits)}",
                    path=os.fspath(path),
                )
            parts, drawn = _roles_or_drawn(layout, chosen, path)
            attrs = handle.attrs
            title = f"{attrs.get(fileformat.NAME_ATTR, Path(path).stem)}"
            if fileformat.VERSION_ATTR in attrs:
                title += f" v{int(attrs[fileformat.VERSION_ATTR]):04d}"
            if drawn:  # the kind draws its tiles, reading only what it shows
                total = len(handle[layout.lineage_path(chosen)])
                shown = min(n, total)
                tiles = [_fitted(t) for t in draw_tiles(handle, layout, chosen, drawn, shown)]
    except OSError as exc:
        raise ReaderError(f"cannot open as HDF5: {exc}", path=os.fspath(path)) from exc
    names = [f for f in (parts.image, parts.mask, *parts.captions) if f is not None and f != drawn]
    batch: dict[str, np.ndarray] = {}
    classes: dict[str, tuple[str, ...]] = {}
    if names:
        with Release(path, chosen, fields=names, batch_size=n) as release:
            total = len(release)
            shown = min(n, total)
            batch = release.read_slice(0, shown)
            classes = release.classes
    if not drawn:
        tiles = [
            _tile(batch[parts.image][i], batch[parts.mask][i] if parts.mask else None)
            for i in range(shown)
        ]
    labels = captions(batch, parts, classes, shown)
    what = f"mask '{parts.mask}' over '{parts.image}'" if parts.mask else f"'{parts.image}'"
    heading = f"{title} · {chosen} · first {shown} of {total} · {what}"
    values = sorted(int(v) for v in np.unique(batch[parts.mask]) if v > 0) if parts.mask else []
    return _grid(tiles, labels, heading, values)


def _roles_or_drawn(
    layout: LayoutRecord, split: str, path: str | os.PathLike[str]
) -> tuple[Roles, str | None]:
    """The image, mask and captions to show, or a field whose kind draws its own tiles."""
    try:
        return roles(layout), None
    except ReaderError as exc:
        drawn = drawn_field(layout)
        if drawn is None:
            raise ReaderError(
                f"split {split!r}: {exc.message}, nor a field of a kind that draws its own "
                "tiles (a kind registry entry's preview)",
                path=os.fspath(path),
            ) from exc
        return Roles(image=drawn, mask=None, captions=caption_fields(layout)), drawn


def _fitted(tile: Image.Image) -> Image.Image:
    """A drawn tile at display size (small ones grow by whole pixels, big ones shrink)."""
    height, width = display_size(tile.height, tile.width)
    if (height, width) == (tile.height, tile.width):
        return tile
    method = Image.Resampling.NEAREST if height > tile.height else Image.Resampling.LANCZOS
    return tile.resize((width, height), method)


def _grid(
    tiles: list[Image.Image], labels: list[str], heading: str, values: list[int]
) -> Image.Image:
    font = ImageFont.load_default(size=12)
    cell_w = max((t.width for t in tiles), default=TILE)
    cell_h = max((t.height for t in tiles), default=TILE)
    line = 16
    columns = max(1, min(len(tiles), math.ceil(math.sqrt(len(tiles)))))
    rows = max(1, math.ceil(len(tiles) / columns))
    legend = sum(24 + font.getlength(f"= {v}") + GAP for v in values[:12])
    width = max(columns * (cell_w + GAP) + GAP, int(font.getlength(heading) + legend) + 3 * GAP)
    height = line + 2 * GAP + rows * (cell_h + line + GAP) + GAP
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((GAP, GAP), heading, fill=INK, font=font)
    x = GAP + font.getlength(heading) + 2 * GAP
    for value in values[:12]:  # a legend: one swatch per mask value shown
        colour = tuple(int(c) for c in PALETTE[(value - 1) % len(PALETTE)])
        draw.rectangle((x, GAP + 2, x + 10, GAP + 12), fill=colour, outline=INK)
        draw.text((x + 14, GAP), f"= {value}", fill=INK, font=font)
        x += 14 + font.getlength(f"= {value}") + GAP
    top = line + 2 * GAP
    for index, (tile, label) in enumerate(zip(tiles, labels, strict=True)):
        x = GAP + (index % columns) * (cell_w + GAP)
        y = top + (index // columns) * (cell_h + line + GAP)
        sheet.paste(tile, (x + (cell_w - tile.width) // 2, y + (cell_h - tile.height) // 2))
        text = _fit(label, font, cell_w)
        draw.text(
            (x + (cell_w - font.getlength(text)) / 2, y + cell_h + 2), text, fill=INK, font=font
        )
    return sheet


def write_preview(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    split: str | None = None,
    n: int = 16,
) -> Path:
    """Render :func:`render_preview` and save it as a PNG at ``out``; return ``out``."""
    target = Path(out)
    picture = render_preview(path, split=split, n=n)
    target.parent.mkdir(parents=True, exist_ok=True)
    picture.save(target, format="PNG")
    return target
