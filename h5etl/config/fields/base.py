"""What every kind's config model shares: the base model, sidecar references, helpers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import (
    Field,
)

from h5etl.config.calls import CallModel
from h5etl.config.sections import PadSpec, Problem, SpecProblems, Strict


def key_problem(key: str, message: str) -> SpecProblems:
    return SpecProblems([Problem(((key,),), message)])


class TableRef(Strict):
    """A column of a sidecar table (CSV or JSON) with one row per sample."""

    table: Path
    key: str = "file"  # the column naming the sample's file
    column: str


class JsonRef(Strict):
    """A key of a per-sample JSON sidecar: a source whose files pair with the others by stem."""

    json_source: str = Field(alias="json")
    key: Annotated[str, Field(min_length=1)]

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

    # user code run on the field's value after its decode and fit (issue 28), in order;
    # a kind whose behaviour has no ``expectation()`` refuses it (``h5etl.plan.user_code``)
    transform: list[CallModel] = Field(default_factory=list)

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

    def dataset_names(self, field_name: str) -> tuple[str, ...]:
        """The names of the datasets it stores per split: its storage columns (the kind's
        ``columns``), a ragged column's offsets (``<column>_offsets``) too. The spec rules
        refuse two datasets at one path; a kind of several columns overrides this."""
        return (field_name,)
