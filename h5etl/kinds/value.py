"""The ``value`` kind: a number per sample (age, dose, a regression target) from a table or
a per-sample JSON sidecar, stored exactly in its dtype."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from h5etl.dataflow import Sample
from h5etl.errors import RejectError
from h5etl.kinds.base import Kind, SampleContext
from h5etl.kinds.columns import Column, ScalarColumn, StatsKind
from h5etl.kinds.sidecar import json_value, typed_value
from h5etl.kinds.tabular import Prepared, TableSource, table_lookup


@dataclass(frozen=True, slots=True)
class ValueKind(Kind):
    kind: ClassVar[str] = "value"
    dtype: str = "float64"
    table: TableSource | None = None
    json_key: str | None = None
    default: float | int | bool | None = None

    @property
    def column(self) -> Column:
        return ScalarColumn(self.dtype)

    @property
    def plan_side(self) -> bool:
        return self.table is not None

    @property
    def stats(self) -> StatsKind:
        return "channels"

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        assert self.table is not None
        assert self.source_index is not None
        lookup = table_lookup(self.table, self.source_index, samples, field_name=self.name)
        cell = lookup.cell
        where = f"{self.table.path} column {self.table.column!r}"

        def value(sample: Sample) -> Any:
            return self._typed(cell(sample), where)

        return Prepared(self, value, lookup.warnings)

    def decode(self, context: SampleContext) -> Any:
        if self.table is not None:
            return context.extras[self.name]
        assert self.source_index is not None
        assert self.json_key is not None
        path = context.path(self.source_index)
        try:
            where = f"fields.{self.name} ({self.json_key})"  # several fields may read one key
            return self._typed(json_value(context, self.source_index, self.json_key), where)
        except RejectError as exc:
            exc.path = path
            raise

    def _typed(self, found: Any, where: str) -> Any:
        if found is None or found == "":
            if self.default is None:
                raise RejectError(
                    "no_value",
                    f"{where}: no value for fields.{self.name} (set default: to keep such samples)",
                )
            found = self.default
        return typed_value(found, self.dtype, where)
