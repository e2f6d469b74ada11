"""Values read at plan time from a sidecar table: shared by the label, value and text kinds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5etl.dataflow import Sample
from h5etl.errors import RejectError


@dataclass(frozen=True, slots=True)
class TableSource:
    """Where a plan-side value comes from: ``column`` of the row whose ``key`` names the file."""

    path: Path
    key: str
    column: str


@dataclass(slots=True)
class Prepared:
    """A plan-side kind bound to the inputs: the kind (e.g. with its classes) and a function
    giving each sample's value (raising ``RejectError``), plus warnings for the summary."""

    kind: Any
    value: Callable[[Sample], Any]
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Lookup:
    """A sample's cell (``cell``), and what to warn about the table (rows no file matches)."""

    cell: Callable[[Sample], Any]
    warnings: list[str]


def table_lookup(
    source: TableSource, source_index: int, samples: Sequence[Sample], *, field_name: str = ""
) -> Lookup:
    """A function from a sample to its cell (None when empty or when the table has no row
    for it); the table is read once, here, and bound to the samples' file names so that a
    bare name several files reach is an ``ambiguous_row`` reject, never a guess."""
    from h5etl.inputs import tables  # parent only: workers never read tables

    table = tables.load_table(source.path, key=source.key, columns=[source.column])
    table = table.bind(sample.relpaths[source_index] for sample in samples)

    def cell(sample: Sample) -> Any:
        try:
            return table.get(sample.relpaths[source_index], source.column)
        except RejectError as exc:
            if exc.reason == "no_row":  # the kind rejects it in its words, or uses a default
                return None
            raise

    warnings = []
    if table.unmatched:
        warnings.append(
            f"fields.{field_name}: {len(table.unmatched)} rows of {source.path} match no input "
            f"file ({shown(list(table.unmatched))})"
        )
    return Lookup(cell, warnings)


def shown(values: Sequence[str], limit: int = 8) -> str:
    return ", ".join(values[:limit]) + (", ..." if len(values) > limit else "")
