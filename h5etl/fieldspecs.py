"""The config of a field: one pydantic model per kind, validated as a discriminated union.

Each kind has only its own keys (``extra="forbid"`` names the right key), and ``kind:`` picks
the model. A field that omits ``kind`` gets the kind its keys implied before kinds existed
(``dtype: str`` a text, ``values`` a mask, anything else an image): ``inferred_kind`` is that
rule, and ``h5etl validate`` says where it applied. What each kind *does* lives in
``h5etl.kinds``; this module only says what a config may write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_serializer,
    field_validator,
    model_validator,
)

from h5etl.specparts import Compression, PadSpec, Problem, SpecProblems, Strict

__all__ = [
    "FIELD_MODELS",
    "ArrayField",
    "DeriveSpec",
    "FieldModel",
    "FieldSpec",
    "ImageField",
    "JsonRef",
    "LabelField",
    "MaskField",
    "ScaleSpec",
    "TableRef",
    "TextField",
    "ValueField",
    "inferred_kind",
]

IMAGE_MODES: dict[str, int] = {"RGB": 3, "L": 1}
ImageDtype = Literal["uint8", "uint16", "int16", "float32"]
MaskDtype = Literal["uint8", "uint16"]
ValueDtype = Literal["int64", "int32", "float64", "float32", "bool"]
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


def _problem(key: str, message: str) -> SpecProblems:
    return SpecProblems([Problem(((key,),), message)])


class TableRef(Strict):
    """A column of a sidecar table (CSV or JSON) with one row per sample."""

    table: Path
    key: str = "file"  # the column naming the sample's file
    column: str


class JsonRef(Strict):
    """A key of a per-sample JSON sidecar: a source whose files pair with the others by stem."""

    json_source: str = Field(alias="json")
    key: str

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}


Key = tuple[str, ...]


def own_or_first(field_name: str, source: str | None, sources: Sequence[str]) -> str:
    """``source``, else the source named like the field, else the first source."""
    if source is not None:
        return source
    if field_name in sources or not sources:
        return field_name
    return sources[0]


class FieldModel(Strict):
    """What the spec asks of every kind's model; a kind overrides what applies to it."""

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        """The source whose files (or file names) the field uses; None: it uses none."""
        return None

    @property
    def source_key(self) -> Key:
        """Where the config names that source, for a message about it."""
        return ("source",)

    @property
    def reads_files(self) -> bool:
        """Whether it reads its source's files (not only their names)."""
        return False

    def references(self) -> list[tuple[Key, str]]:
        """The image fields it follows (key naming each), which must be read from files."""
        return []

    def problems(self, field_name: str, pad: PadSpec) -> list[Problem]:
        """Rules between this field and the rest of the config."""
        return []


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
            return _problem("shape", f"{what} needs a shape, e.g. [3, 224, 224]")
        channels = IMAGE_MODES[mode]
        if len(self.shape) != 3 or self.shape[0] != channels:
            return _problem(
                "shape",
                f"mode {mode} needs shape [{channels}, H, W] (channels first), "
                f"got {list(self.shape)}",
            )
        return None


class DeriveSpec(Strict):
    """A field computed from another field's pixels instead of read from files."""

    from_field: str = Field(alias="from")
    resize: ResizeFilter = "bicubic"
    factor: Annotated[int, Field(ge=1)] | None = None  # None: resize to the field's shape

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}


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

    def references(self) -> list[tuple[Key, str]]:
        found: list[tuple[Key, str]] = []
        if self.derive is not None:
            found.append((("derive", "from"), self.derive.from_field))
        if self.scale is not None:
            found.append((("scale", "of"), self.scale.of))
        return found

    @model_validator(mode="after")
    def _consistent(self) -> ImageField:
        if self.mode is None:
            raise _problem("mode", "an image field needs a mode: RGB or L")
        found = self._shape_problem(self.mode, "an image field")
        if found is not None:
            raise found
        if self.derive is not None and self.source is not None:
            raise _problem("source", "a derived field reads no source (derive.from names a field)")
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
        if value not in MASK_MAX:
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
            raise _problem("values", f"values must be distinct, got {list(self.values)}")
        top = MASK_MAX[self.dtype]
        if any(v > top for v in self.values):
            raise _problem(
                "values", f"{self.dtype} masks hold labels 0..{top}, got {max(self.values)}"
            )
        if self.colors is not None:
            stray = sorted(set(self.colors.values()) - set(self.values))
            if stray:
                raise _problem("colors", f"colours map to labels not in values: {stray}")
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


class LabelField(FieldModel):
    """A class per sample: its folder (``root/<class>/file``) or a table column."""

    kind: Literal["label"]
    source: str | None = None  # whose file path names the class folder (default: the first)
    from_: Literal["folder"] | TableRef = Field("folder", alias="from")
    classes: tuple[str, ...] | None = None  # fixed names: other labels are rejected

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return own_or_first(field_name, self.source, sources) if self.from_ == "folder" else None

    @model_validator(mode="after")
    def _distinct(self) -> LabelField:
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise _problem("classes", f"class names must be distinct, got {list(self.classes)}")
        if self.classes is not None and not self.classes:
            raise _problem("classes", "name at least one class, or leave classes out")
        return self


class _FromSidecar(FieldModel):
    """A field whose value may come from a per-sample JSON sidecar."""

    def _json(self) -> JsonRef | None:
        origin = getattr(self, "from_", None)
        return origin if isinstance(origin, JsonRef) else None

    @property
    def source_key(self) -> Key:
        return ("from", "json") if self._json() is not None else ("source",)

    @property
    def reads_files(self) -> bool:
        return self._json() is not None


class TextField(_FromSidecar):
    """A string per sample: the file's relative path, a table column or a JSON sidecar key."""

    kind: Literal["text"] = "text"
    dtype: Literal["str"] = "str"
    source: str | None = None
    from_: Literal["filename"] | TableRef | JsonRef = Field("filename", alias="from")

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        json = self._json()
        if json is not None:
            return json.json_source
        return own_or_first(field_name, self.source, sources) if self.from_ == "filename" else None


class ValueField(_FromSidecar):
    """A number per sample (age, dose, a regression target) from a table or a JSON sidecar."""

    kind: Literal["value"]
    dtype: ValueDtype = "float64"
    from_: TableRef | JsonRef = Field(alias="from")
    default: float | int | bool | None = None  # for samples the table or sidecar lacks

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        json = self._json()
        return json.json_source if json is not None else None

    @model_validator(mode="after")
    def _default_fits(self) -> ValueField:
        if self.default is None:
            return self
        from h5etl.errors import RejectError
        from h5etl.kinds.sidecar import typed_value

        try:
            typed_value(self.default, self.dtype, "default")
        except RejectError as exc:  # every sample lacking a value would be rejected for it
            raise _problem("default", exc.message.removeprefix("default: ")) from exc
        return self

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}


FIELD_MODELS: dict[str, type[FieldModel]] = {
    "image": ImageField,
    "mask": MaskField,
    "label": LabelField,
    "text": TextField,
    "value": ValueField,
}


def inferred_kind(data: Mapping[str, Any]) -> str:
    """The kind a field without ``kind:`` has: the rule of the versions before kinds."""
    if data.get("dtype") == "str":
        return "text"
    if data.get("values") is not None:
        return "mask"
    return "image"


def _kind_tag(data: Any) -> str | None:
    if isinstance(data, Mapping):
        kind = data.get("kind")
        if kind is None:
            return inferred_kind(data)
        return kind if isinstance(kind, str) else None
    return getattr(data, "kind", None)


FieldSpec = Annotated[
    Annotated[ImageField, Tag("image")]
    | Annotated[MaskField, Tag("mask")]
    | Annotated[LabelField, Tag("label")]
    | Annotated[TextField, Tag("text")]
    | Annotated[ValueField, Tag("value")],
    Discriminator(
        _kind_tag,
        custom_error_type="unknown_kind",
        custom_error_message=f"kind must be one of {', '.join(FIELD_MODELS)}",
    ),
]
"""One field of a config, any kind."""
