"""The ``filesize`` kind's registry entry (parent side): its config model and builder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from h5etl.kind_api import BuildContext, FieldModel, KindEntry, ReaderHints, own_or_first
from h5etl_filesize.kind import FileSizeKind


class FileSizeField(FieldModel):
    kind: Literal["filesize"]
    source: str | None = None
    max_bytes: int | None = None

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return own_or_first(field_name, self.source, sources)

    @property
    def reads_files(self) -> bool:
        return True

    def dataset_names(self, field_name: str) -> tuple[str, ...]:
        return (field_name, f"{field_name}_head")


def build(name: str, field: FileSizeField, context: BuildContext) -> FileSizeKind:
    return FileSizeKind(name, context.source_index, field.max_bytes)


ENTRY = KindEntry(
    "filesize",
    FileSizeField,
    FileSizeKind,
    build,
    preview="h5etl_filesize.draw:draw",
    reader_hints=ReaderHints(keras="target", keras_rank=5),
)
