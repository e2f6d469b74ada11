"""preview, for kinds that draw their own tiles: a volume's middle slice, a series' channels.

A kind names a drawer in its registry entry (``KindEntry.preview``: "module:function",
imported only when a preview draws that kind). A drawer is ``draw(sample, field) -> PIL
image``: ``sample`` (a ``PreviewSample``) reads the stored sample's columns on demand, so a
drawer of a 262 MB case reads the one slice it shows (``rows``), never the case. The sheet, the
captions and the scaling are this module's; what a tile shows is the drawer's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np
from PIL import Image

from h5etl.errors import ReaderError
from h5etl.format import contract as fileformat
from h5etl.format.contract import FieldRecord, LayoutRecord


class PreviewSample:
    """Sample ``index`` of a split, its columns read when a drawer asks (read-only)."""

    def __init__(self, handle: h5py.File, layout: LayoutRecord, split: str, index: int):
        self.handle = handle
        self.layout = layout
        self.split = split
        self.index = index

    def record(self, column: str) -> FieldRecord:
        """What the layout record says of a storage column (kind, column type, dtype, attrs)."""
        return self.layout.storage[column]

    def columns_of(self, field: str) -> list[str]:
        """The storage columns of ``field``, in record order."""
        return [name for name in self.layout.storage if self.layout.field_of(name) == field]

    def _dataset(self, column: str) -> h5py.Dataset:
        return self.handle[self.layout.path(self.split, column)]

    def _bounds(self, column: str) -> tuple[int, int]:
        offsets = self.handle[fileformat.offsets_path(self.layout.path(self.split, column))]
        low, high = offsets[self.index : self.index + 2]
        return int(low), int(high)

    def length(self, column: str) -> int:
        """Rows of values of a ragged column's sample (slices, time steps); 1 otherwise."""
        if self.record(column).column != "ragged":
            return 1
        low, high = self._bounds(column)
        return high - low

    def rows(self, column: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a ragged column's sample (clipped to it): one slice read."""
        low, high = self._bounds(column)
        begin, end, _ = slice(start, stop).indices(high - low)
        return np.asarray(self._dataset(column)[low + begin : low + max(begin, end)])

    def value(self, column: str) -> Any:
        """The sample's whole value: an array (a ragged one: all its rows) or a string."""
        record = self.record(column)
        if record.column == "ragged":
            return self.rows(column, 0, self.length(column))
        dataset = self._dataset(column)
        if record.column == "text":
            return dataset.asstr()[self.index]
        return np.asarray(dataset[self.index])


Drawer = Callable[[PreviewSample, str], Image.Image]


def drawer_of(kind: str) -> Drawer | None:
    """The registered drawer of ``kind``, imported now; None when it has none."""
    from h5etl.config.fields.registry import REGISTRY

    entry = REGISTRY.entries.get(kind)
    target = entry.preview if entry is not None else None
    if target is None:
        return None
    module, _, name = target.partition(":")
    found: Drawer = getattr(importlib.import_module(module), name)
    return found


def drawn_field(layout: LayoutRecord) -> str | None:
    """The first field whose kind draws its own preview tile, or None."""
    for name, record in layout.fields.items():
        if drawer_of(record.kind) is not None:
            return name
    return None


def draw_tiles(
    handle: h5py.File, layout: LayoutRecord, split: str, field: str, count: int
) -> list[Image.Image]:
    """The tiles of the first ``count`` samples of ``field``, each as its drawer made it.

    Raises:
        ReaderError: the drawer failed on a sample (a release it cannot draw).
    """
    draw = drawer_of(layout.fields[field].kind)
    assert draw is not None, f"{field} has no drawer"
    tiles = []
    for index in range(count):
        try:
            tile = draw(PreviewSample(handle, layout, split, index), field)
        except (KeyError, ValueError, IndexError, OSError) as exc:
            raise ReaderError(
                f"split {split!r}: cannot draw sample {index} of field {field!r}: {exc}"
            ) from exc
        tiles.append(tile.convert("RGB"))
    return tiles
