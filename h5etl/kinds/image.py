"""The ``image`` kind: pixels of a source (or derived from another field), in any dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from h5etl.errors import RejectError
from h5etl.format.codec import ChunkLayout
from h5etl.format.contract import FieldRecord
from h5etl.inputs import pixels
from h5etl.inputs import raster as images
from h5etl.kinds import placement as geometry
from h5etl.kinds.base import Kind, ProbeTarget, SampleContext
from h5etl.kinds.columns import ArrayColumn, Column, StatsKind
from h5etl.kinds.fitting import fit, size_text

if TYPE_CHECKING:
    from h5etl.transforms.apply import Expectation
    from h5etl.transforms.loading import CallSpec


@dataclass(frozen=True, slots=True)
class ImageKind(Kind):
    kind: ClassVar[str] = "image"
    layout: ChunkLayout
    mode: Literal["RGB", "L"]
    fill: float
    oversize: str
    derive_from: str | None = None
    derive_filter: str = "bicubic"
    derive_factor: int | None = None
    scale_of: str | None = None
    scale_factor: int = 1
    with_stats: bool = True
    grid: int = 1  # pads and crops on multiples of this: it pairs with a field this much smaller
    # derive: {from: [...], call}: a user function computes it from those fields (issue 28)
    derive_call: CallSpec | None = None
    derive_sources: tuple[str, ...] = ()
    seed: int = 0  # the config's: a random derive call's generator is seeded from it

    @property
    def column(self) -> Column:
        return ArrayColumn(self.layout, self.fill)

    @property
    def depends_on(self) -> tuple[str, ...]:
        named = (self.derive_from, self.scale_of, *self.derive_sources)
        return tuple(dict.fromkeys(name for name in named if name is not None))

    @property
    def reads_values_of(self) -> tuple[str, ...]:
        # derived from the fitted value, after the source's chain; scale_of checks pixels only
        named = (self.derive_from, *self.derive_sources)
        return tuple(dict.fromkeys(name for name in named if name is not None))

    def expectation(self) -> Expectation:
        from h5etl.transforms.apply import Expectation  # parent side, for transforms only

        _, height, width = self.layout.shape
        shape = (height, width) if self.mode == "L" else (height, width, 3)
        return Expectation(self.layout.dtype, max_shape=shape)

    @property
    def stats(self) -> StatsKind:
        return "channels" if self.with_stats else None

    def probe_target(self) -> ProbeTarget | None:
        if self.source_index is None:  # derived: its size follows its source's
            return None
        times = (self.scale_of, self.scale_factor) if self.scale_of is not None else None
        shape = self.layout.shape
        return ProbeTarget(self.name, self.source_index, shape[1], shape[2], times=times)

    def record(self) -> FieldRecord:
        extra: dict[str, Any] = {"mode": self.mode}
        if self.derive_call is not None:
            extra["derived_from"] = list(self.derive_sources)
            extra["call"] = self.derive_call.text
        elif self.derive_from is not None:
            extra["derived_from"] = self.derive_from
            extra["filter"] = self.derive_filter
        if self.scale_of is not None:
            extra["scale"] = {"of": self.scale_of, "factor": self.scale_factor}
        return FieldRecord(self.kind, "fixed", self.layout.dtype, self.layout.shape, extra)

    def decode(self, context: SampleContext) -> np.ndarray:
        if self.derive_call is not None:
            return self._computed(context, self.derive_call)
        if self.derive_from is not None:
            pixels, path = self._derived(context)
        else:
            assert self.source_index is not None
            path = context.path(self.source_index)
            decoded = images.decode_field(
                context.contents[self.source_index],
                path=path,
                mode=self.mode,
                dtype=self.layout.dtype,  # type: ignore[arg-type]
                role="image",
            )
            pixels = decoded.array
            if decoded.conversion:
                context.conversions.append((self.name, decoded.conversion))
        if self.scale_of is not None:
            self._check_scale(context, pixels, path)
        context.decoded[self.name] = pixels
        context.paths[self.name] = path
        fitted = fit(pixels, self.layout, self.oversize, path=path, is_mask=False, grid=self.grid)
        context.fitted[self.name] = fitted
        return fitted

    def place(self, value: np.ndarray, row: np.ndarray) -> np.ndarray:
        return geometry.place(value, row, self.grid)

    def _computed(self, context: SampleContext, call: CallSpec) -> np.ndarray:
        """The value a user function computes from its sources' stored values (after their
        chains), checked against this field: no fitting, no conversion of its own."""
        from h5etl.transforms.apply import run_derive  # a build with a derive call only

        sources = self.derive_sources
        given: Any = (
            context.fitted[sources[0]]
            if len(sources) == 1
            else {name: context.fitted[name] for name in sources}
        )
        value = run_derive(
            call, self.name, self.seed, context.sample.key, given, self.expectation()
        )
        context.paths[self.name] = context.paths.get(sources[0], "")
        context.decoded[self.name] = context.fitted[self.name] = value
        return value  # type: ignore[no-any-return]

    def _derived(self, context: SampleContext) -> tuple[np.ndarray, str]:
        """``derive.from``'s pixels resized by the named filter (in their own dtype), then
        brought to this field's mode and dtype by ``decode_field``'s rules: grey is the luma,
        16 to 8 bits is scaled and reported, anything lossy is a ``lossy_conversion``."""
        assert self.derive_from is not None
        # from the pixels stored (cropped like them, on the pair's grid): the two line up
        source = context.fitted[self.derive_from]
        path = context.paths[self.derive_from]
        if self.derive_factor is None:
            size = (self.layout.shape[1], self.layout.shape[2])
        else:
            height, width = source.shape[0], source.shape[1]
            if height % self.derive_factor or width % self.derive_factor:
                raise RejectError(
                    "scale_mismatch",
                    f"{self.derive_from} is {size_text(source)}, not a multiple of "
                    f"derive.factor {self.derive_factor} on each axis",
                    path=path,
                )
            size = (height // self.derive_factor, width // self.derive_factor)
        with pixels.rejecting_surprises(path, f"derive {self.name}"):
            # the built-in transform ``resize``: the same code a config's ``call: resize`` runs
            from h5etl.transforms import builtin

            resized = builtin.resize(source, size=size, filter=self.derive_filter)  # type: ignore[arg-type]
        channels = "RGB" if resized.ndim == 3 else "L"
        converted = pixels.convert(
            resized,
            source=f"{channels} {resized.dtype} ({self.derive_from} resized)",
            mode=self.mode,
            dtype=self.layout.dtype,  # type: ignore[arg-type]
            role="image",
            palette="index",
            path=path,
        )
        if converted.conversion:
            context.conversions.append((self.name, converted.conversion))
        return converted.array, path

    def _check_scale(self, context: SampleContext, pixels: np.ndarray, path: str) -> None:
        assert self.scale_of is not None
        other = context.decoded[self.scale_of]
        expected = (other.shape[0] * self.scale_factor, other.shape[1] * self.scale_factor)
        if pixels.shape[:2] != expected:
            raise RejectError(
                "scale_mismatch",
                # the header probe's words (probes._size_problem): a dry run predicts them
                f"{self.name} is {size_text(pixels)}, expected {self.scale_factor} x "
                f"{self.scale_of} {size_text(other)}",
                path=path,
            )
