"""What a worker is handed and what it keeps of a sample: the frozen recipe of a build's
fields, and one accepted sample on its way into the task's columns.

Apart from ``task.py`` so the gathering of a task's columns (``gather.py``) and the decoding
(``task.py``) both import it, and neither imports the other's caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl.dataflow import Sample
from h5etl.decode.probes import ProbeRules
from h5etl.kinds.base import Kind
from h5etl.kinds.columns import ArrayColumn, Column

if TYPE_CHECKING:  # workers import apply only for a build that runs transforms
    from h5etl.transforms.apply import Transforms


@dataclass(frozen=True, slots=True)
class DecodeRecipe:
    """Everything a worker needs, frozen and picklable: the fields' kinds, in decode order."""

    kinds: tuple[Kind, ...]
    order: tuple[int, ...]  # positions in ``kinds``: each field after those it depends on
    plan_fields: tuple[str, ...] = ()  # fields whose values travel in ``Sample.extras``
    # every storage column: (its kind, its dataset name, the column), in field order
    columns: tuple[tuple[Kind, str, Column], ...] = ()
    arrays: tuple[tuple[Kind, str, ArrayColumn], ...] = ()  # the fixed array columns
    multi: frozenset[str] = frozenset()  # kinds whose decode returns a dict by column
    self_read: frozenset[int] = frozenset()  # sources their kinds read themselves
    probes: ProbeRules | None = None  # the header probes that name a rejected sample's defect
    # the user's transforms (issue 28), run after each field's decode and fit; None: none
    transforms: Transforms | None = None
    whole: frozenset[str] = frozenset()  # fields a transform needs whole (never streamed)

    @classmethod
    def of(
        cls,
        kinds: Sequence[Kind],
        order: Sequence[int],
        probes: ProbeRules | None = None,
        transforms: Transforms | None = None,
    ) -> DecodeRecipe:
        planned = tuple(kind.name for kind in kinds if kind.plan_side)
        columns = tuple(
            (kind, name, column) for kind in kinds for name, column in kind.columns.items()
        )
        arrays = tuple(
            (kind, name, column)
            for kind, name, column in columns
            if isinstance(column, ArrayColumn)
        )
        multi = frozenset(kind.name for kind in kinds if kind.multi_column)
        self_read = frozenset(
            kind.source_index
            for kind in kinds
            if kind.reads_own_files and kind.source_index is not None
        )
        whole = frozenset(transforms.touched) if transforms is not None else frozenset()
        return cls(
            tuple(kinds),
            tuple(order),
            planned,
            columns,
            arrays,
            multi,
            self_read,
            probes,
            transforms,
            whole,
        )

    def narrowed(
        self, stored: frozenset[str], computed: frozenset[str], decoded: frozenset[str]
    ) -> DecodeRecipe:
        """This recipe making only the ``stored`` fields' columns (an incremental build
        making them again, the other fields copied from the parent): ``decoded`` fields are
        decoded, the ``computed`` ones (those and what they read) also transformed; a source
        no decoded field reads is not read. Every kind keeps its position in ``kinds``."""
        kinds = self.kinds
        order = tuple(i for i in self.order if kinds[i].name in decoded)
        read = {kinds[i].source_index for i in order}
        unread = {k.source_index for k in kinds if k.source_index is not None} - read
        transforms = None if self.transforms is None else self.transforms.narrowed(computed)
        return dataclasses.replace(
            self,
            order=order,
            columns=tuple(c for c in self.columns if c[0].name in stored),
            arrays=tuple(c for c in self.arrays if c[0].name in stored),
            self_read=self.self_read | frozenset(i for i in unread if i is not None),
            transforms=transforms,
            whole=self.whole & computed,
        )


@dataclass(slots=True)
class DecodedSample:
    """One accepted sample: each field's value, its files' digests, its own statistics."""

    position: int
    sample: Sample
    values: dict[str, Any]
    hashes: tuple[str, ...]
    conversions: list[tuple[str, str]] = field(default_factory=list)
    windows: dict[str, np.ndarray] = field(default_factory=dict)  # unpadded, as stored
