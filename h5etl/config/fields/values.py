"""The config of the per-sample kinds: ``label``, ``text`` and ``value`` (class folders, tables,
JSON sidecars)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from h5etl.config.fields.base import FieldModel, JsonRef, Key, TableRef, key_problem, own_or_first
from h5etl.config.sections import Strict

ValueDtype = Literal["int64", "int32", "float64", "float32", "bool"]


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
            raise key_problem("classes", f"class names must be distinct, got {list(self.classes)}")
        if self.classes is not None and not self.classes:
            raise key_problem("classes", "name at least one class, or leave classes out")
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
            raise key_problem("default", exc.message.removeprefix("default: ")) from exc
        return self

    model_config = Strict.model_config | {"populate_by_name": True, "serialize_by_alias": True}
