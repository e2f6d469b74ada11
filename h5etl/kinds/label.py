"""The ``label`` kind: one class per sample, as an int64 index into the sorted class names.

The class comes from the sample's folder (``root/<class>/file``) or from a table column, at
plan time: a sample without a class is rejected before anything is decoded, and a split can
be stratified by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from h5etl.dataflow import Sample
from h5etl.errors import RejectError
from h5etl.format import contract as fileformat
from h5etl.format.contract import FieldRecord
from h5etl.inputs.globs import glob_regex
from h5etl.kinds.base import Kind
from h5etl.kinds.columns import Column, ScalarColumn, StatsKind
from h5etl.kinds.sidecar import text_value
from h5etl.kinds.tabular import Prepared, TableSource, shown, table_lookup


@dataclass(frozen=True, slots=True)
class LabelKind(Kind):
    kind: ClassVar[str] = "label"
    source_root: str  # the folder whose class sub-folders name the labels
    table: TableSource | None = None  # None: from the class folder
    classes: tuple[str, ...] = ()  # bound at plan time (declared, or found)
    declared: bool = False
    pattern: str | None = None  # the source's glob: which files make a class folder non-empty

    @property
    def column(self) -> Column:
        return ScalarColumn("int64")

    @property
    def plan_side(self) -> bool:
        return True

    @property
    def stats(self) -> StatsKind:
        return "histogram"

    def record(self) -> FieldRecord:
        return FieldRecord(
            self.kind, "fixed", "int64", (), {fileformat.CLASSES_ATTR: list(self.classes)}
        )

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        """Bind the class names (declared, or every class the inputs name) and the lookup."""
        from h5etl.inputs import classfolders

        assert self.source_index is not None
        index = self.source_index
        lookup_warnings: list[str] = []
        if self.table is not None:
            lookup = table_lookup(self.table, index, samples, field_name=self.name)
            cell = lookup.cell
            lookup_warnings = lookup.warnings
            where = f"{self.table.path} column {self.table.column!r}"

            def name_of(sample: Sample) -> str | None:
                value = cell(sample)
                return None if value is None or value == "" else text_value(value, where)
        else:

            def name_of(sample: Sample) -> str | None:
                found: str | None = classfolders.class_of(sample.relpaths[index])
                return found

        names = [name_of(sample) for sample in samples]
        classes = self.classes or tuple(classfolders.class_names(n for n in names if n is not None))
        bound = replace(self, classes=classes)
        position = {name: i for i, name in enumerate(classes)}
        by_sample = {sample.key: name for sample, name in zip(samples, names, strict=True)}

        def value(sample: Sample) -> int:
            name = by_sample[sample.key] if sample.key in by_sample else name_of(sample)
            if name is None:
                raise RejectError("no_label", self._missing(sample))
            if name not in position:
                raise RejectError(
                    "unknown_class",
                    f"class {name!r} is not one of fields.{self.name}.classes "
                    f"({shown(list(classes))})",
                )
            return position[name]

        warnings: list[str] = []
        if self.table is None:
            matches: Callable[[str], bool] | None = None
            if self.pattern is not None:
                regex = glob_regex(self.pattern)

                def matches(relpath: str) -> bool:
                    return regex.match(relpath) is not None

            empty = classfolders.empty_class_folders(Path(self.source_root), matches=matches)
            warnings.extend(
                f"fields.{self.name}: class folder {folder!r} is empty: no samples of it"
                for folder in empty
            )
        return Prepared(bound, value, [*lookup_warnings, *warnings])

    def _missing(self, sample: Sample) -> str:
        assert self.source_index is not None
        relpath = sample.relpaths[self.source_index]
        if self.table is not None:
            return (
                f"no {self.table.column!r} for {relpath!r} in {self.table.path} "
                f"(column {self.table.key!r})"
            )
        return (
            f"{relpath!r} is not in a class folder: fields.{self.name} takes the class from "
            f"root/<class>/<file>"
        )
