"""The config of a field: one pydantic model per kind, validated as a discriminated union.

Each kind has only its own keys (``extra="forbid"`` names the right key), and ``kind:`` picks
the model. A field that omits ``kind`` gets the kind its keys implied before kinds existed
(``dtype: str`` a text, ``values`` a mask, anything else an image): ``inferred_kind`` is that
rule, and ``h5etl validate`` says where it applied. The models live in ``base`` (what every
kind shares), ``arrays`` (image, mask), ``values`` (label, text, value), ``volume`` and
``series``. What each kind *does* lives in ``h5etl.kinds``; its registry entry (``entry``:
model, behaviour, builder, preview drawer, reader hints) ties the two, and the union of models
is built from the registry (``registry``: the built-in entries of ``builtin``, then plugins').
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Discriminator, Tag

from h5etl.config.fields.arrays import ArrayField, DeriveSpec, ImageField, MaskField, ScaleSpec
from h5etl.config.fields.base import FieldModel, JsonRef, TableRef, own_or_first
from h5etl.config.fields.registry import REGISTRY
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

FIELD_MODELS: dict[str, type[FieldModel]] = REGISTRY.models
"""Each kind's config model by name: the built-in kinds', then plugins'."""


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


def _field_union() -> Any:
    """Every registered model, tagged with its kind, picked by ``_kind_tag``."""
    members = [Annotated[model, Tag(kind)] for kind, model in FIELD_MODELS.items()]
    return Annotated[
        functools.reduce(operator.or_, members),
        Discriminator(
            _kind_tag,
            custom_error_type="unknown_kind",
            custom_error_message=f"kind must be one of {', '.join(FIELD_MODELS)}",
        ),
    ]


if TYPE_CHECKING:  # what strict mypy sees: the built-in models (a plugin's is a FieldModel)
    FieldSpec = (
        ImageField | MaskField | LabelField | TextField | ValueField | VolumeField | SeriesField
    )
else:
    FieldSpec = _field_union()
"""One field of a config, any kind."""
