"""A tiny test-only kind of several storage columns, one of them ragged.

``NpyRecording`` reads a ``.npy`` file of (n, 3) float32 (n varies) and stores: the rows as a
ragged column (``<field>`` itself, or ``<field>_values`` when ``main`` is false: a field with
no column of its own name), its first row as a small fixed (3,) column, its length as a
scalar and a word as text. ``use_npy_recording`` puts it in place of a config's text field
(no config model knows this kind): in this process with pytest's ``monkeypatch``, or in a
subprocess through ``install``. A NaN in the file is a reject.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from h5etl.kind_api import (
    ArrayColumn,
    BuildContext,
    ChunkLayout,
    Codec,
    Column,
    FieldModel,
    Kind,
    KindEntry,
    RaggedColumn,
    RejectError,
    SampleContext,
    ScalarColumn,
    TextColumn,
    own_or_first,
)

TRAILING = (3,)
HEAD = 6  # rows of the fixed ``<field>_head`` column: a recording cropped or padded to it


@dataclass(frozen=True, slots=True)
class NpyRecording(Kind):
    kind: ClassVar[str] = "npyrec"
    chunk_rows: int = 5
    codec: str = "gzip"
    main: bool = True

    @property
    def values_name(self) -> str:
        return self.name if self.main else f"{self.name}_values"

    @property
    def columns(self) -> Mapping[str, Column]:
        level = 4 if self.codec == "gzip" else None
        values = RaggedColumn.of(
            "float32",
            TRAILING,
            self.chunk_rows,
            compression=Codec(self.codec, level, "lz4", "byte"),
            attrs={"rate_hz": 100.0, "units": "g"},
            stats="channels",
            channel_axis=-1,
        )
        head = ChunkLayout(
            (HEAD, *TRAILING), "float32", (4, HEAD, *TRAILING), values.layout.compression, True
        )
        return {
            self.values_name: values,
            f"{self.name}_head": ArrayColumn(head, -1.0, stats="channels", channel_axis=-1),
            f"{self.name}_first": ScalarColumn("float32", TRAILING),
            f"{self.name}_length": ScalarColumn("int64", stats="channels"),
            f"{self.name}_word": TextColumn(),
        }

    def decode(self, context: SampleContext) -> dict[str, Any]:
        assert self.source_index is not None
        path = context.path(self.source_index)
        array = np.load(io.BytesIO(context.contents[self.source_index]))
        if not np.isfinite(array).all():
            row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
            raise RejectError("nonfinite", f"{path}: NaN or Inf in row {row}", path=path)
        first = array[0] if len(array) else np.zeros(TRAILING, np.float32)
        return {
            self.values_name: array.astype(np.float32),
            f"{self.name}_head": array[:HEAD],
            f"{self.name}_first": first,
            f"{self.name}_length": len(array),
            f"{self.name}_word": f"n={len(array)}",
        }


DRAWN: list[tuple[str, int, np.ndarray]] = []  # (field, sample index, rows read): per draw


def draw(sample: Any, field: str) -> Any:
    """A preview tile: the sample's middle row of values as three grey bars (a drawer, as
    ``ENTRY`` names it); it reads that row only."""
    from PIL import Image

    values = next(c for c in sample.columns_of(field) if sample.record(c).column == "ragged")
    middle = sample.length(values) // 2
    row = sample.rows(values, middle, middle + 1)
    DRAWN.append((field, sample.index, row))
    grey = np.zeros((8, 12), np.uint8)
    if len(row):
        grey[:, :] = np.repeat(np.clip(row[0] * 40 + 128, 0, 255).astype(np.uint8), 4)
    return Image.fromarray(grey, "L")


def _patched(original: Any, field: str, options: dict[str, Any]) -> Any:
    def kinds_of(spec: Any) -> tuple[Kind, ...]:
        kinds = list(original(spec))
        for i, kind in enumerate(kinds):
            if kind.name == field:
                kinds[i] = NpyRecording(field, kind.source_index, **options)
        return tuple(kinds)

    return kinds_of


def install(field: str = "rec", **options: Any) -> None:
    """Swap the text field ``field`` for an ``NpyRecording`` in this process for good."""
    from h5etl.plan import kind_registry as registry

    registry.kinds_of = _patched(registry.kinds_of, field, options)


def use_npy_recording(monkeypatch: Any, field: str = "rec", **options: Any) -> None:
    from h5etl.plan import kind_registry as registry

    monkeypatch.setattr(registry, "kinds_of", _patched(registry.kinds_of, field, options))


class NpyRecordingField(FieldModel):
    """The config of an ``npyrec`` field (for its registry entry; configs of these tests
    write a text field that ``install`` swaps)."""

    kind: Literal["npyrec"]
    source: str | None = None

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return own_or_first(field_name, self.source, sources)


def _build(name: str, field: NpyRecordingField, context: BuildContext) -> Kind:
    return NpyRecording(name, context.source_index)


ENTRY = KindEntry("npyrec", NpyRecordingField, NpyRecording, _build, preview="ragged_kind:draw")

__all__ = ["ENTRY", "NpyRecording", "install", "use_npy_recording"]


def decode_or_die(task: Any, recipe: Any, *, parent: int) -> Any:
    """``decode.decode_batch``, but a worker process given the sample ``r03`` dies (SIGKILL,
    as an OOM kill): its task is isolated, decoded sample by sample, raw, and joined."""
    import os
    import signal

    from h5etl.decode import task as decode

    if any(s.key == "r03" for s in task.samples) and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return decode.decode_batch(task, recipe)
