"""The ``mask`` kind: a label per pixel, checked against ``values``; colours via ``colors``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from h5etl.errors import RejectError
from h5etl.format import contract as fileformat
from h5etl.format.codec import ChunkLayout
from h5etl.format.contract import FieldRecord
from h5etl.inputs import raster as images
from h5etl.inputs.pixels import rejecting_surprises
from h5etl.kinds import mask_values
from h5etl.kinds.base import Kind, ProbeTarget, SampleContext
from h5etl.kinds.columns import ArrayColumn, Column, StatsKind
from h5etl.kinds.fitting import fit, size_text

if TYPE_CHECKING:
    from h5etl.transforms.apply import Expectation

Colour = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class MaskKind(Kind):
    kind: ClassVar[str] = "mask"
    layout: ChunkLayout
    fill: float
    oversize: str
    values: tuple[int, ...]
    colors: tuple[tuple[Colour, int], ...] | None = None
    of: str | None = None  # the image field whose size it has
    with_stats: bool = True

    @property
    def column(self) -> Column:
        return ArrayColumn(self.layout, self.fill)

    @property
    def depends_on(self) -> tuple[str, ...]:
        return () if self.of is None else (self.of,)

    @property
    def reads_values_of(self) -> tuple[str, ...]:
        return ()  # its image's pixels are a size check, not a value it is made from

    def expectation(self) -> Expectation:
        from h5etl.transforms.apply import Expectation  # parent side, for transforms only

        _, height, width = self.layout.shape
        return Expectation(
            self.layout.dtype, max_shape=(height, width), values=frozenset(self.values)
        )

    @property
    def stats(self) -> StatsKind:
        return "histogram" if self.with_stats else None

    def task_stats(self, windows: Sequence[np.ndarray]) -> Any:
        """The histogram over the declared values: every pixel holds one (checked), and a
        pass per value beats a bincount for the usual few labels."""
        if not self.with_stats:
            return None
        from h5etl.stats import normalisation as stats

        if len(self.values) > 16:
            return super().task_stats(windows)
        # Every pixel is one of the values (checked): the zeros are the pixels count_nonzero
        # leaves, the last non-zero label what the others leave; one pass each for the rest.
        labels = sorted(v for v in self.values if v)
        *counted, last = labels or [0]
        counts = dict.fromkeys(self.values, 0)
        for window in windows:
            nonzero = int(np.count_nonzero(window))
            seen = 0
            for value in counted:
                n = int(np.count_nonzero(window == value))
                counts[value] += n
                seen += n
            if labels:
                counts[last] += nonzero - seen
            if 0 in counts:
                counts[0] += window.size - nonzero
        return stats.Histogram(tuple((v, n) for v, n in sorted(counts.items()) if n))

    def probe_target(self) -> ProbeTarget | None:
        assert self.source_index is not None
        shape = self.layout.shape
        return ProbeTarget(self.name, self.source_index, shape[1], shape[2], same_as=self.of)

    def record(self) -> FieldRecord:
        extra: dict[str, object] = {fileformat.VALUES_KEY: list(self.values)}
        if self.colors is not None:
            extra["colors"] = [[list(colour), label] for colour, label in self.colors]
        if self.of is not None:
            extra["of"] = self.of
        return FieldRecord(self.kind, "fixed", self.layout.dtype, self.layout.shape, extra)

    def decode(self, context: SampleContext) -> np.ndarray:
        assert self.source_index is not None
        path = context.path(self.source_index)
        data = context.contents[self.source_index]
        decoded = images.decode_field(
            data,
            path=path,
            mode="L",
            dtype=self.layout.dtype,  # type: ignore[arg-type]
            role="mask",
            palette="color" if self.colors is not None else "index",
        )
        labels = decoded.array
        if decoded.conversion:  # a 16-bit mask into a uint8 field: counted, never silent
            context.conversions.append((self.name, decoded.conversion))
        with rejecting_surprises(path, "check the mask"):
            if labels.ndim == 3:  # colours, to be mapped by the table
                assert self.colors is not None
                labels = mask_values.map_colors(
                    labels,
                    dict(self.colors),
                    path=path,
                    dtype=np.dtype(self.layout.dtype),
                    what=f"fields.{self.name}.colors",  # where the user adds the colour
                )
            labels = mask_values.check_mask(labels, self.values, path=path)
        if self.of is not None:
            image = context.decoded[self.of]
            if image.shape[:2] != labels.shape[:2]:
                raise RejectError(
                    "size_mismatch",
                    f"sizes differ after decoding (HxW): {self.of} {size_text(image)}, "
                    f"{self.name} {size_text(labels)}",
                    path=context.paths.get(self.of, path),
                )
        context.decoded[self.name] = labels
        context.paths[self.name] = path
        return fit(labels, self.layout, self.oversize, path=path, is_mask=True)
