"""What every field kind is made of: its storage column, its statistics, its two hooks.

A kind is a frozen, picklable dataclass built from its config model in the parent (see
``h5etl.kinds.registry``); decode workers import this package but never pydantic. Values a
kind knows without reading files (a class folder, a table row) come from ``prepare`` at plan
time, in the parent, and travel with the sample (``Sample.extras``); everything that reads a
file's bytes happens in ``decode``, in a worker. Both reject a sample with ``RejectError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from h5etl.chunkcodec import ChunkLayout
from h5etl.fileformat import FieldRecord
from h5etl.records import Sample

if TYPE_CHECKING:
    from h5etl.kinds.tabular import Prepared

__all__ = [
    "ArrayColumn",
    "Column",
    "Kind",
    "ProbeTarget",
    "SampleContext",
    "ScalarColumn",
    "TextColumn",
]

StatsKind = Literal["channels", "histogram"] | None


@dataclass(frozen=True, slots=True)
class ArrayColumn:
    """A fixed-shape (N, *shape) array: workers compress whole chunks, the sink stores them."""

    layout: ChunkLayout
    fill: float  # the value around a smaller input (pad.fill, or pad.mask_fill for a mask)


@dataclass(frozen=True, slots=True)
class ScalarColumn:
    """One number per sample, (N,): small, so the sink buffers and appends its rows."""

    dtype: str


@dataclass(frozen=True, slots=True)
class TextColumn:
    """One UTF-8 string per sample, (N,)."""


Column = ArrayColumn | ScalarColumn | TextColumn


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """What a header probe checks of a field read from image files (a dry run's probe)."""

    name: str
    source_index: int
    height: int  # of the field's shape: a larger image is oversize
    width: int
    same_as: str | None = None  # the field whose size it must have (a mask's image)
    times: tuple[str, int] | None = None  # (field, factor): exactly factor times its size


@dataclass(slots=True)
class SampleContext:
    """One sample as its kinds see it in the worker: its files' bytes, the values kinds met
    before (``decoded``: an array field's pixels before fitting, for derived and scaled
    fields and masks), its plan-time values and the lossy conversions met on the way."""

    sample: Sample
    contents: list[bytes]  # one per source, in source order
    extras: dict[str, Any]  # field -> value from ``prepare``
    files: tuple[str, ...]  # each source's file path (built once: kinds ask often)
    decoded: dict[str, np.ndarray] = field(default_factory=dict)
    fitted: dict[str, np.ndarray] = field(default_factory=dict)  # as stored, before padding
    paths: dict[str, str] = field(default_factory=dict)  # field -> the file it was read from
    parsed: dict[int, Any] = field(default_factory=dict)  # source index -> its JSON document
    conversions: list[tuple[str, str]] = field(default_factory=list)  # (field, code)

    def path(self, source_index: int) -> str:
        return self.files[source_index]


@dataclass(frozen=True, slots=True)
class Kind:
    """The behaviour of one field. Subclasses set ``kind`` and override what they use."""

    kind: ClassVar[str] = ""
    name: str
    source_index: int | None  # the sample's file it reads or names; None: none

    @property
    def column(self) -> Column:
        raise NotImplementedError

    @property
    def plan_side(self) -> bool:
        """Whether its value is known at plan time (``annotate``), not decoded in a worker."""
        return False

    @property
    def depends_on(self) -> tuple[str, ...]:
        """Fields whose decoded pixels this one needs first."""
        return ()

    @property
    def stats(self) -> StatsKind:
        return None

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        """This kind bound to the inputs, and each sample's value (``plan_side`` kinds)."""
        raise NotImplementedError(f"{type(self).__name__} decodes in the worker")

    def decode(self, context: SampleContext) -> Any:
        """The sample's value: an (h, w[, c]) array for an array column (fitted, unpadded),
        a number or a string. Plan-side kinds return their annotation."""
        return context.extras[self.name]

    def place(self, value: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Put an array field's fitted value into its (c, H, W) row, centred; return the
        window it fills (its unpadded pixels)."""
        from h5etl import geometry

        return geometry.place(value, row)

    def task_stats(self, windows: Sequence[np.ndarray]) -> Any:
        """The statistics of a task's kept samples from their unpadded (c, h, w) pixels as
        stored (one per sample), or None."""
        from h5etl import stats

        if self.stats == "channels":
            return stats.ChannelStats.of_windows(windows)
        if self.stats == "histogram":
            total = stats.Histogram()
            for window in windows:
                total = total.merge(stats.Histogram.of(window))
            return total
        return None

    def probe_target(self) -> ProbeTarget | None:
        """What a header probe can check of this field without decoding it; None: nothing
        (the field reads no image file)."""
        return None

    def record(self) -> FieldRecord:
        """How the release's layout record describes this field."""
        column = self.column
        if isinstance(column, ArrayColumn):
            return FieldRecord(self.kind, "fixed", column.layout.dtype, column.layout.shape)
        if isinstance(column, ScalarColumn):
            return FieldRecord(self.kind, "fixed", column.dtype, ())
        return FieldRecord(self.kind, "text", "str", ())
