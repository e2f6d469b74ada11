"""One record per field kind (``KindEntry``) and what its builder may know (``BuildContext``).

A kind is its config model (what a config may write), its behaviour (``h5etl.kinds``: built
here in the parent, run in the workers), a builder from the one to the other, a preview drawer
and what readers may assume of its values. The registry (``h5etl.config.fields.registry``)
holds the seven built-in entries and those of plugins (the ``h5etl.kinds`` entry-point group).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from h5etl.config.fields.base import FieldModel
from h5etl.config.sections import Compression, PadSpec, StorageSpec
from h5etl.errors import KindDefinitionError
from h5etl.format.codec import ChunkLayout
from h5etl.format.reader_hints import ReaderHints
from h5etl.kinds.base import Kind, check_hooks

__all__ = ["BuildContext", "Builder", "KindEntry"]

M = TypeVar("M", bound=FieldModel)


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What a builder knows of the config beyond its own field: a small view that stays
    stable as the config grows (not the whole ``Spec``).

    ``sources``: every source's name in config order (a sample's ``contents[i]`` holds the
    bytes of its file of source ``i``); ``source``: the one this field reads (its model's
    ``source_name``), None if it reads none; ``fields``: every field's model, in config order.
    """

    name: str
    sources: tuple[str, ...]
    source: str | None
    source_dirs: Mapping[str, Path | str]
    source_globs: Mapping[str, str]
    fields: Mapping[str, FieldModel]
    storage: StorageSpec
    pad: PadSpec

    def index(self, source: str | None) -> int | None:
        """Where ``source``'s file sits in a sample's ``contents``; None for no source."""
        return self.sources.index(source) if source is not None else None

    @property
    def source_index(self) -> int | None:
        """Where the file this field reads sits in a sample's ``contents``."""
        return self.index(self.source)

    def layout(
        self,
        shape: tuple[int, ...],
        dtype: str,
        *,
        chunks: tuple[int, ...] | None = None,
        compression: Compression | None = None,
        shuffle: bool | None = None,
    ) -> ChunkLayout:
        """How a fixed (N, *shape) array is stored: the field's own chunks and filters where
        it sets them, else ``storage``'s (``chunk_samples`` rows a chunk, whole samples)."""
        return ChunkLayout(
            shape,
            dtype,
            chunks if chunks is not None else (self.storage.chunk_samples, *shape),
            compression or self.storage.compression,
            self.storage.shuffle if shuffle is None else shuffle,
        )


Builder = Callable[[str, M, BuildContext], Kind]
"""The field's name, its config model and the context -> its behaviour (parent side)."""


@dataclass(frozen=True, slots=True)
class KindEntry(Generic[M]):
    """Everything h5etl knows of one field kind, in one place.

    Parameters:
        name: what configs write as ``kind:``; the behaviour's ``kind``.
        model: its config model, a ``FieldModel`` with ``kind: Literal["<name>"]``.
        behaviour: its ``Kind`` subclass (checked for its required hooks here).
        builder: ``(name, model, context) -> Kind``, run in the parent.
        preview: ``"module:function"`` drawing a preview tile of one stored sample
            (``h5etl.preview.drawn``), imported only when a preview draws it; None: none.
        reader_hints: what readers may assume of its values (``ReaderHints``).
    """

    name: str
    model: type[M]
    behaviour: type[Kind]
    builder: Builder[M]
    preview: str | None = None
    reader_hints: ReaderHints = field(default_factory=ReaderHints)

    def __post_init__(self) -> None:
        where = f"kind entry {self.name!r}"
        if not (isinstance(self.model, type) and issubclass(self.model, FieldModel)):
            raise KindDefinitionError(
                f"{where}: model {self.model!r} is no subclass of h5etl.config.fields.FieldModel"
            )
        if "kind" not in self.model.model_fields:
            raise KindDefinitionError(
                f"{where}: model {self.model.__qualname__} has no kind field: "
                f'write kind: Literal["{self.name}"]'
            )
        check_hooks(self.behaviour)
        if self.behaviour.kind != self.name:
            raise KindDefinitionError(
                f"{where}: its behaviour {self.behaviour.__qualname__} has kind "
                f"{self.behaviour.kind!r}, not {self.name!r}"
            )
        if self.preview is not None and not _is_target(self.preview):
            raise KindDefinitionError(
                f"{where}: preview must be 'module:function', got {self.preview!r}"
            )

    def build(self, name: str, model: Any, context: BuildContext) -> Kind:
        """The field ``name``'s behaviour from its config model."""
        return self.builder(name, model, context)


def _is_target(text: str) -> bool:
    module, colon, function = text.partition(":")
    return bool(colon and module and function.isidentifier())
