"""The ``text`` kind: a string per sample, its file's relative path, a table cell or a key
of a per-sample JSON sidecar."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from h5etl.dataflow import Sample
from h5etl.errors import RejectError
from h5etl.kinds.base import Kind, SampleContext
from h5etl.kinds.columns import Column, TextColumn
from h5etl.kinds.sidecar import json_value, text_value
from h5etl.kinds.tabular import Prepared, TableSource, table_lookup


@dataclass(frozen=True, slots=True)
class TextKind(Kind):
    kind: ClassVar[str] = "text"
    table: TableSource | None = None
    json_key: str | None = None  # a key of the sidecar JSON at ``source_index``

    @property
    def column(self) -> Column:
        return TextColumn()

    @property
    def plan_side(self) -> bool:
        return self.table is not None

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        assert self.table is not None
        assert self.source_index is not None
        lookup = table_lookup(self.table, self.source_index, samples, field_name=self.name)
        cell = lookup.cell
        table = self.table

        def value(sample: Sample) -> str:
            found = cell(sample)
            if found is None:
                raise RejectError(
                    "no_value",
                    f"no {table.column!r} for this file in {table.path} (fields.{self.name})",
                )
            return text_value(found, f"{table.path} column {table.column!r}")

        return Prepared(self, value, lookup.warnings)

    def decode(self, context: SampleContext) -> str:
        if self.table is not None:
            return str(context.extras[self.name])
        assert self.source_index is not None
        if self.json_key is None:
            return context.sample.relpaths[self.source_index]
        found = json_value(context, self.source_index, self.json_key)
        if found is None:
            raise RejectError(
                "no_value",
                f"no {self.json_key!r} in this JSON sidecar",
                path=context.path(self.source_index),
            )
        try:
            return text_value(found, self.json_key)
        except RejectError as exc:
            exc.path = context.path(self.source_index)
            raise
