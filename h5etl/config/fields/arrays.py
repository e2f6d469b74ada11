"""The config of the array kinds: ``image`` and ``mask`` (shapes, dtypes, derive, scale,
colours)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from h5etl.config.fields.base import FieldModel, Key, key_problem
from h5etl.config.sections import Compression, PadSpec, Problem, SpecProblems, Strict

IMAGE_MODES: dict[str, int] = {"RGB": 3, "L": 1}
MODE_OF_CHANNELS = {channels: mode for mode, channels in IMAGE_MODES.items()}
ImageDtype = Literal["uint8", "uint16", "int16", "float32"]
MaskDtype = Literal["uint8", "uint16"]
ResizeFilter = Literal["nearest", "bilinear", "bicubic", "lanczos", "area"]
MASK_MAX = {"uint8": 255, "uint16": 65535}
IMAGE_RANGE = {
    "uint8": (0, 255),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "float32": (-(2**24), 2**24),
}
_HEX_COLOUR = re.compile(r"^#([0-9a-fA-F]{6})$")
Colour = tuple[int, int, int]


class ArrayField(FieldModel):
    """Keys every fixed-shape array field shares: where it reads, its shape and storage."""

    source: str | None = None
    shape: tuple[Annotated[int, Field(gt=0)], ...] | None = None
    chunks: tuple[Annotated[int, Field(gt=0)], ...] | None = None
    compression: Compression | None = None
    shuffle: bool | None = None
    stats: bool = True  # normalisation statistics (or a mask's histogram) per split

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        # an array field reads the source of its own name unless it says otherwise
        return self.source if self.source is not None else field_name

    @property
    def reads_files(self) -> bool:
        return True

    def _shape_problem(self, mode: str, what: str) -> SpecProblems | None:
        if self.shape is None:
            return key_problem("shape", f"{what} needs a shape, e.g. [3, 224, 224]")
        channels = IMAGE_MODES[mode]
        if len(self.shape) != 3 or self.shape[0] != channels:
            return key_problem(
                "shape",
                f"mode {mode} needs shape [{channels}, H, W] (channels first), "
                f"got {list(self.shape)}",
            )
        return None


class DeriveSpec(Strict):
    """A field computed from another field's pixels instead of read from files: resized by
    the built-in ``resize`` (``resize``, ``factor``), or by a function of the user's
    (``call``, ``args``), which gets the value of ``from`` (a dict of them for a list)."""

    from_field: str | Annotated[list[str], Field(min_length=1)] = Field(alias="from")
    resize: ResizeFilter = "bicubic"
    factor: Annotated[int, Field(ge=1)] | None = None  # None: resize to the field's shape
    call: Annotated[str, Field(min_length=1)] | None = None
    args: dict[str, Any] | None = None

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}

    @property
    def sources(self) -> tuple[str, ...]:
        """The fields it is computed from."""
        named = self.from_field
        return (named,) if isinstance(named, str) else tuple(named)

    @model_validator(mode="after")
    def _call_or_resize(self) -> DeriveSpec:
        if self.call is None and not isinstance(self.from_field, str):
            raise key_problem("from", "several fields need a call that computes the value")
        if self.call is None and self.args is not None:
            raise key_problem("args", "args are a call's: name the function in derive.call")
        if self.call is not None and self.factor is not None:
            raise key_problem("factor", "a derive with a call sizes its own value: no factor")
        return self


class ScaleSpec(Strict):
    """This field's pixels are exactly ``factor`` times those of field ``of`` on each axis."""

    of: str
    factor: Annotated[int, Field(ge=1)]


class ImageField(ArrayField):
    """Decoded pixels of a source, fitted (pad, crop or resize) into ``shape``."""

    kind: Literal["image"] = "image"
    dtype: ImageDtype = "uint8"
    mode: Literal["RGB", "L"] | None = None
    derive: DeriveSpec | None = None
    scale: ScaleSpec | None = None

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_known(cls, value: Any) -> Any:
        allowed = ("uint8", "uint16", "int16", "float32")
        if value not in allowed:
            raise ValueError(
                f"allowed dtypes are {', '.join(allowed)} for an image field (16-bit inputs "
                f"into uint8 are scaled to 8 bits and reported), got {value!r}"
            )
        return value

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return None if self.derive is not None else super().source_name(field_name, sources)

    @property
    def reads_files(self) -> bool:
        return self.derive is None

    def problems(self, field_name: str, pad: PadSpec) -> list[Problem]:
        low, high = IMAGE_RANGE[self.dtype]
        if low <= pad.fill <= high:
            return []
        return [
            Problem(
                (("pad", "fill"),),
                f"padding of {self.dtype} image fields.{field_name} must be in {low}..{high}, "
                f"got {pad.fill}",
            )
        ]

    @model_validator(mode="before")
    @classmethod
    def _mode_of_shape(cls, data: Any) -> Any:
        """No mode: the shape's channels give it (1: L, 3: RGB), as the config reference says."""
        if not isinstance(data, Mapping) or data.get("mode") is not None:
            return data
        shape = data.get("shape")
        channels = shape[0] if isinstance(shape, list | tuple) and len(shape) == 3 else None
        if isinstance(channels, int) and channels in MODE_OF_CHANNELS:
            return {**data, "mode": MODE_OF_CHANNELS[channels]}
        return data

    def references(self) -> list[tuple[Key, str]]:
        found: list[tuple[Key, str]] = []
        if self.derive is not None and self.derive.call is None:
            # a derive by a call may read any array field: h5etl.plan.user_code checks them
            found.extend((("derive", "from"), name) for name in self.derive.sources)
        if self.scale is not None:
            found.append((("scale", "of"), self.scale.of))
        return found

    @model_validator(mode="after")
    def _consistent(self) -> ImageField:
        if self.mode is None and self.shape is not None:
            raise key_problem(
                "shape",
                f"an image field has 3 channels (mode RGB) or 1 (mode L), channels first: "
                f"[3, H, W] or [1, H, W], got {list(self.shape)}",
            )
        if self.mode is None:
            raise key_problem("shape", "an image field needs a shape, e.g. [3, 224, 224]")
        found = self._shape_problem(self.mode, "an image field")
        if found is not None:
            raise found
        if self.derive is not None and self.source is not None:
            raise key_problem(
                "source", "a derived field reads no source (derive.from names a field)"
            )
        return self


class MaskField(ArrayField):
    """Labels per pixel: one channel, every value in ``values``; colours mapped by ``colors``."""

    kind: Literal["mask"] = "mask"
    dtype: MaskDtype = "uint8"
    mode: str = "L"
    values: tuple[Annotated[int, Field(ge=0)], ...]
    colors: dict[Colour, int] | None = None
    of: str | None = None  # the image field whose size it must have (default: the first)

    @field_validator("colors", mode="before")
    @classmethod
    def _colour_keys(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        if not value:
            raise ValueError(
                "the colour table is empty: map each colour of the masks to one of values "
                "(e.g. {[128, 64, 128]: 7}), or drop colors for grey or palette masks"
            )
        colours: dict[Colour, Any] = {}
        written: dict[Colour, Any] = {}
        for key, label in value.items():
            colour = _colour(key)
            if colour in colours:  # "#000000" and [0, 0, 0] are one colour
                raise ValueError(
                    f"colour {list(colour)} is listed twice ({written[colour]!r} and {key!r}): "
                    "give each colour one label"
                )
            colours[colour], written[colour] = label, key
        return colours

    @field_serializer("colors")
    def _colours_as_hex(self, colors: dict[Colour, int] | None) -> dict[str, int] | None:
        if colors is None:
            return None
        return {"#{:02x}{:02x}{:02x}".format(*colour): label for colour, label in colors.items()}

    @field_validator("mode")
    @classmethod
    def _one_channel(cls, mode: str) -> str:
        if mode != "L":
            raise ValueError(
                f"a mask has one channel: mode L (values name its labels), got {mode!r}"
            )
        return mode

    @field_validator("dtype", mode="before")
    @classmethod
    def _mask_dtype(cls, value: Any) -> Any:
        if not isinstance(value, str) or value not in MASK_MAX:  # a list is no dict key
            raise ValueError(
                f"allowed dtypes are {', '.join(MASK_MAX)} for a mask field, got {value!r}"
            )
        return value

    def references(self) -> list[tuple[Key, str]]:
        return [] if self.of is None else [(("of",), self.of)]

    def problems(self, field_name: str, pad: PadSpec) -> list[Problem]:
        if pad.mask_fill in self.values:
            return []
        return [
            Problem(
                (("pad", "mask_fill"),),
                f"padding of mask fields.{field_name} must be one of its values "
                f"{list(self.values)}, got {pad.mask_fill}",
            )
        ]

    @model_validator(mode="after")
    def _consistent(self) -> MaskField:
        found = self._shape_problem(self.mode, "a mask field")
        if found is not None:
            raise found
        if len(set(self.values)) != len(self.values):
            raise key_problem("values", f"values must be distinct, got {list(self.values)}")
        top = MASK_MAX[self.dtype]
        if any(v > top for v in self.values):
            raise key_problem(
                "values", f"{self.dtype} masks hold labels 0..{top}, got {max(self.values)}"
            )
        if self.colors is not None:
            stray = sorted(set(self.colors.values()) - set(self.values))
            if stray:
                raise key_problem("colors", f"colours map to labels not in values: {stray}")
        return self


def _colour(key: Any) -> Colour:
    """``[128, 64, 128]`` (a YAML sequence key), ``"128, 64, 128"`` or ``"#804080"``."""
    if isinstance(key, str):
        match = _HEX_COLOUR.match(key.strip())
        if match:
            number = int(match.group(1), 16)
            return (number >> 16, (number >> 8) & 255, number & 255)
        parts = [p.strip() for p in key.split(",")]
    elif isinstance(key, tuple | list):
        parts = list(key)
    else:
        parts = []
    try:
        values = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or not all(0 <= v <= 255 for v in values):
        raise ValueError(
            f"a colour is [R, G, B] with each 0..255, 'R, G, B' or '#rrggbb', got {key!r}"
        )
    return (values[0], values[1], values[2])
