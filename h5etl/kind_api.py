"""Everything a field kind's author imports, in one place: for a kind of another package.

A kind is one ``KindEntry``: its config model (a ``FieldModel`` with ``kind:
Literal["<name>"]``), its behaviour (a frozen ``Kind`` dataclass; its docstring says which
hooks are required and where each runs), the builder from the one to the other (given a
``BuildContext``, not the whole config), an optional preview drawer and ``ReaderHints``. A
package registers it as an entry point of the group ``h5etl.kinds`` named like the kind::

    [project.entry-points."h5etl.kinds"]
    filesize = "h5etl_filesize.entry:ENTRY"

See docs/internals/add-a-kind.md. Parent side (it imports pydantic through the config):
a kind's behaviour module, which decode workers import, takes the same names from
``h5etl.kinds.base``, ``h5etl.kinds.columns`` and ``h5etl.errors`` instead, so that workers
stay free of pydantic.
"""

from __future__ import annotations

from h5etl.config.fields.base import FieldModel, own_or_first
from h5etl.config.fields.entry import BuildContext, Builder, KindEntry
from h5etl.config.fields.registry import GROUP
from h5etl.dataflow import Sample
from h5etl.errors import KindDefinitionError, RejectError
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.format.contract import FieldRecord
from h5etl.format.reader_hints import ReaderHints
from h5etl.kinds.base import Kind, ProbeTarget, SampleContext, check_hooks
from h5etl.kinds.columns import (
    ArrayColumn,
    Column,
    RaggedColumn,
    ScalarColumn,
    StatsKind,
    TextColumn,
)
from h5etl.kinds.tabular import Prepared
from h5etl.transforms.apply import Expectation

__all__ = [
    "GROUP",
    "ArrayColumn",
    "BuildContext",
    "Builder",
    "ChunkLayout",
    "Codec",
    "Column",
    "Expectation",
    "FieldModel",
    "FieldRecord",
    "Kind",
    "KindDefinitionError",
    "KindEntry",
    "Prepared",
    "ProbeTarget",
    "RaggedColumn",
    "ReaderHints",
    "RejectError",
    "Sample",
    "SampleContext",
    "ScalarColumn",
    "StatsKind",
    "TextColumn",
    "check_hooks",
    "own_or_first",
]
