"""What every field kind is made of: its storage column, its statistics, its two hooks.

A kind is a frozen, picklable dataclass built from its config model in the parent by its
registry entry's builder (``h5etl.config.fields.registry``); decode workers import this package but
never pydantic, and nothing here imports the config. Values a
kind knows without reading files (a class folder, a table row) come from ``prepare`` at plan
time, in the parent, and travel with the sample (``Sample.extras``); everything that reads a
file's bytes happens in ``decode``, in a worker. Both reject a sample with ``RejectError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from h5etl.dataflow import EncodedRows, Sample
from h5etl.errors import KindDefinitionError
from h5etl.format.contract import FieldRecord
from h5etl.kinds.columns import ArrayColumn, Column, StatsKind, column_record

if TYPE_CHECKING:
    from h5etl.kinds.tabular import Prepared
    from h5etl.transforms.apply import Expectation

__all__ = ["EncodedValue", "Kind", "ProbeTarget", "SampleContext", "check_hooks"]


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """What a header probe checks of a field read from image files (a dry run's probe)."""

    name: str
    source_index: int
    height: int  # of the field's shape: a larger image is oversize
    width: int
    same_as: str | None = None  # the field whose size it must have (a mask's image)
    times: tuple[str, int] | None = None  # (field, factor): exactly factor times its size


@dataclass(slots=True)
class SampleContext:
    """One sample as its kinds see it in the worker: its files' bytes, the values kinds met
    before (``decoded``: an array field's pixels before fitting, for derived and scaled
    fields and masks), its plan-time values and the lossy conversions met on the way."""

    sample: Sample
    contents: list[bytes]  # one per source, in source order
    extras: dict[str, Any]  # field -> value from ``prepare``
    files: tuple[str, ...]  # each source's file path (built once: kinds ask often)
    decoded: dict[str, np.ndarray] = field(default_factory=dict)
    fitted: dict[str, np.ndarray] = field(default_factory=dict)  # as stored, before padding
    paths: dict[str, str] = field(default_factory=dict)  # field -> the file it was read from
    parsed: dict[int, Any] = field(default_factory=dict)  # source index -> its JSON document
    conversions: list[tuple[str, str]] = field(default_factory=list)  # (field, code)
    # source index -> SHA-256 (hex) of what a kind that reads its own files read (lineage)
    digests: dict[int, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)  # field -> what it learnt of its input
    raw: bool = False  # the task keeps its values raw (crash isolation): no EncodedValue
    # fields a transform reads or makes (issue 28): decoded whole, never as an EncodedValue
    whole: frozenset[str] = frozenset()

    def path(self, source_index: int) -> str:
        return self.files[source_index]


@dataclass(frozen=True, slots=True)
class EncodedValue:
    """A ragged column's value its kind compressed as it decoded (one value row per chunk
    only, and not in a raw task): ``rows`` value rows, a block of chunks and its digest per
    row (``chunkcodec.BlockEncoder``, ``digest.block_digest``), and the column's statistics
    of the value. A volume decoded slab by slab never holds its raw case whole."""

    rows: int
    encoded: EncodedRows
    stats: Any = None


@dataclass(frozen=True, slots=True)
class Kind:
    """The behaviour of one field. Subclasses set ``kind`` and override what they use.

    Built in the parent by its registry entry's builder, pickled to the decode workers (so it
    holds plain data: no open files, no pydantic). Its hooks, which are required and where
    each runs (``check_hooks`` refuses a class that lacks a required one):

    ===================================  ==========  ================================
    hook                                 required    runs in
    ===================================  ==========  ================================
    ``kind`` (class variable)            yes         (the name configs write)
    ``column`` or ``columns``            one         parent (plan, sink) and worker
    ``decode(context)``                  or prepare  worker: a sample's value from bytes
    ``prepare(samples)``, ``plan_side``  or decode   parent, once at plan time
    ``expands``, ``expand``              no          parent, plan time
    ``depends_on``                       no          parent (order) and worker
    ``reads_values_of``                  no          parent (incremental builds)
    ``stats``, ``task_stats``, ``place`` no          worker
    ``reads_own_files``                  no          parent and worker
    ``companion_paths``                  no          parent, plan time (stamps)
    ``worker_modules``                   no          parent (workers import them early)
    ``optional_modules``                 no          parent (``validate``: installed?)
    ``sample_nbytes``                    no          parent (sizes decode tasks)
    ``probe_header``, ``header_checks``  no          worker (a dry run's header probe)
    ``probe_target``                     no          parent (a dry run's image probe)
    ``expectation()``                    no          parent (what a transform must give)
    ``record()``                         no          parent (the layout record)
    ===================================  ==========  ================================
    """

    kind: ClassVar[str] = ""
    name: str
    source_index: int | None  # the sample's file it reads or names; None: none

    @property
    def column(self) -> Column:
        """The column of a single-column kind (named like the field)."""
        raise NotImplementedError

    @property
    def columns(self) -> Mapping[str, Column]:
        """Every storage column, by dataset name: the main one named like the field (if the
        kind has one), extra row-aligned ones ``<field>_<suffix>``. A kind of several
        columns overrides this and ``decode`` returns a dict by column name."""
        return {self.name: self.column}

    @property
    def worker_modules(self) -> tuple[str, ...]:
        """The modules a worker imports to decode this field (its own, and the libraries it
        reads with), which the pool can import before the first task arrives."""
        return (type(self).__module__,)

    @property
    def optional_modules(self) -> tuple[str, ...]:
        """The optional libraries (an extra of h5etl, ``h5etl.inputs.extras``) this field is read
        with: a config whose libraries are missing is refused before any work."""
        return ()

    @property
    def multi_column(self) -> bool:
        """Whether ``decode`` returns a dict by column name (not the one column's value)."""
        columns = self.columns
        return len(columns) != 1 or self.name not in columns

    @property
    def expands(self) -> bool:
        """Whether one input becomes several samples (``expand``), e.g. windows."""
        return False

    def expand(self, sample: Sample, value: Any) -> list[tuple[str, Any]]:
        """The samples one input of a ``plan_side`` kind that ``expands`` becomes: (key,
        value) each, from its plan-time ``value``; all go to the input's split."""
        raise NotImplementedError(f"{type(self).__name__} does not expand")

    @property
    def sample_nbytes(self) -> int:
        """About how many bytes one decoded sample of this field holds, to size decode tasks
        (``tasks.task_rows``): its fixed arrays'; a kind of ragged columns adds an estimate
        of its values (a volume: a whole case) so that a task holds few of them."""
        return sum(
            column.layout.block_nbytes // column.layout.rows
            for column in self.columns.values()
            if isinstance(column, ArrayColumn)
        )

    @property
    def reads_own_files(self) -> bool:
        """Whether it reads its source itself (a folder, a file streamed a slab at a time):
        decode then reads no bytes for it and takes the lineage digest from
        ``context.digests[source_index]``."""
        return False

    @property
    def plan_side(self) -> bool:
        """Whether its value is known at plan time (``annotate``), not decoded in a worker."""
        return False

    def companion_paths(self, path: str) -> tuple[str, ...]:
        """The other files it reads beside its source's file ``path`` (a recording's other
        channels, found by stem): the plan stamps them too, so that resume and incremental
        builds see them change. A folder entry's files are stamped as the folder's."""
        return ()

    @property
    def depends_on(self) -> tuple[str, ...]:
        """Fields whose decoded pixels this one needs first."""
        return ()

    @property
    def reads_values_of(self) -> tuple[str, ...]:
        """Of ``depends_on``, the fields whose stored value (after their transforms) makes
        this one's: when their transform changes, an incremental build makes this field
        again too. All of them unless a kind says otherwise (a mask only checks its size
        against its image's pixels: none)."""
        return self.depends_on

    @property
    def stats(self) -> StatsKind:
        return None

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        """This kind bound to the inputs, and each sample's value (``plan_side`` kinds)."""
        raise NotImplementedError(f"{type(self).__name__} decodes in the worker")

    def decode(self, context: SampleContext) -> Any:
        """The sample's value: an (h, w[, c]) array for an array column (fitted, unpadded),
        a number or a string, a (length, *trailing) array for a ragged column; a kind of
        several columns returns ``{column name: value}``. Plan-side kinds return their
        annotation."""
        return context.extras[self.name]

    def place(self, value: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Put an array field's fitted value into its (c, H, W) row, centred; return the
        window it fills (its unpadded pixels)."""
        from h5etl.kinds import placement as geometry

        return geometry.place(value, row)

    def task_stats(self, windows: Sequence[np.ndarray]) -> Any:
        """The statistics of a task's kept samples from their unpadded (c, h, w) pixels as
        stored (one per sample), or None."""
        from h5etl.stats import normalisation as stats

        if self.stats == "channels":
            return stats.ChannelStats.of_windows(windows)
        if self.stats == "histogram":
            total = stats.Histogram()
            for window in windows:
                total = total.merge(stats.Histogram.of(window))
            return total
        return None

    header_checks: ClassVar[str] = ""  # what ``probe_header`` checks, for the dry run's summary

    def probe_header(self, path: str, notes: dict[str, Any]) -> object:
        """A dry run's check of what this field's headers show, without decoding (a kind
        that reads its own files: a volume's slice order, shapes, grid): raise
        ``RejectError`` as ``decode`` would, with the same reason; ``notes`` as in decode
        (what the fields probed before it learnt). Kinds that override it set
        ``header_checks``; the others have none (``probes_headers``)."""
        return None

    @property
    def probes_headers(self) -> bool:
        return type(self).probe_header is not Kind.probe_header

    def probe_target(self) -> ProbeTarget | None:
        """What a header probe can check of this field without decoding it; None: nothing
        (the field reads no image file)."""
        return None

    def expectation(self) -> Expectation | None:
        """What a transform's result for this field must be (dtype, shape, labels): a
        result that is not is rejected as ``transform_output``. None: a transform cannot
        make this field's value (``validate`` refuses a transform on it)."""
        return None

    def record(self) -> FieldRecord:
        """How the release's layout record describes this field: its main column (or
        ``"none"`` when it has none) and, for a kind of several columns, every other one."""
        columns = dict(self.columns)
        main = columns.pop(self.name, None)
        record = (
            column_record(self.kind, main)
            if main is not None
            else FieldRecord(self.kind, "none", "", ())
        )
        if not columns:
            return record
        others = {name: column_record(self.kind, column) for name, column in columns.items()}
        return FieldRecord(
            record.kind, record.column, record.dtype, record.shape, record.extra, others
        )


def check_hooks(cls: type[Kind]) -> None:
    """Refuse a kind class that lacks a required hook (see ``Kind``), naming class and hook.

    Raises:
        KindDefinitionError: one line naming the class and the missing hook.
    """
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not (isinstance(cls, type) and issubclass(cls, Kind)):
        raise KindDefinitionError(f"{name} is no subclass of h5etl.kinds.base.Kind")
    if not cls.kind:
        raise KindDefinitionError(
            f"{name} has no kind name: set kind: ClassVar[str] = '<the name configs write>'"
        )
    if cls.column is Kind.column and cls.columns is Kind.columns:
        raise KindDefinitionError(
            f"{name} overrides neither column nor columns: a kind stores at least one column"
        )
    if cls.decode is Kind.decode and cls.prepare is Kind.prepare:
        raise KindDefinitionError(
            f"{name} overrides neither decode (worker) nor prepare (parent, plan time): "
            "nothing gives a sample its value"
        )
