"""The config of a field: one pydantic model per kind, validated as a discriminated union.

Each kind has only its own keys (``extra="forbid"`` names the right key), and ``kind:`` picks
the model. A field that omits ``kind`` gets the kind its keys implied before kinds existed
(``dtype: str`` a text, ``values`` a mask, anything else an image): ``inferred_kind`` is that
rule, and ``h5etl validate`` says where it applied. The models live in ``base`` (what every
kind shares), ``arrays`` (image, mask), ``values`` (label, text, value) and ``volume``. What
each kind *does* lives in ``h5etl.kinds``; this package only says what a config may write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Discriminator, Tag

from h5etl.config.fields.arrays import ArrayField, DeriveSpec, ImageField, MaskField, ScaleSpec
from h5etl.config.fields.base import FieldModel, JsonRef, TableRef, own_or_first
from h5etl.config.fields.series import SeriesField
from h5etl.config.fields.values import LabelField, TextField, ValueField
from h5etl.config.fields.volume import ResampleSpec, VolumeField

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
    "ResampleSpec",
    "ScaleSpec",
    "SeriesField",
    "TableRef",
    "TextField",
    "ValueField",
    "VolumeField",
    "inferred_kind",
    "own_or_first",
]

FIELD_MODELS: dict[str, type[FieldModel]] = {
    "image": ImageField,
    "mask": MaskField,
    "label": LabelField,
    "text": TextField,
    "value": ValueField,
    "volume": VolumeField,
    "series": SeriesField,
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
    | Annotated[ValueField, Tag("value")]
    | Annotated[VolumeField, Tag("volume")]
    | Annotated[SeriesField, Tag("series")],
    Discriminator(
        _kind_tag,
        custom_error_type="unknown_kind",
        custom_error_message=f"kind must be one of {', '.join(FIELD_MODELS)}",
    ),
]
"""One field of a config, any kind."""
