"""small_columns: the sink's writer of the small columns: texts, scalars and the lineage.

Part of the sink (the only code that writes HDF5). Their rows are buffered per split and
appended in runs of a thousand (cut by row count alone, so the file's bytes do not depend on
batch sizes or checkpoint times), hashed as one stream per dataset, and handed to the resume
journal as plain values as soon as they are buffered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl.dataflow import BatchResult, RaggedRows, Reject, valid_text
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.kinds.columns import ArrayColumn, Column, RaggedColumn, ScalarColumn
from h5etl.sink.array_writer import DatasetStats

# Small rows are buffered and appended this many at a time: one resize and write per field
# per thousand rows instead of per batch (the writer's CPU is the budget).
SMALL_ROWS_PER_WRITE = 1024


@dataclass(frozen=True, slots=True)
class SinkLayout:
    """What the file holds: splits, each field's storage column, the lineage columns and
    where each dataset goes (the layout template)."""

    splits: tuple[str, ...]
    columns: dict[str, Column]
    sources: tuple[str, ...]
    template: str = fileformat.DEFAULT_TEMPLATE
    # samples the plan gives each split: its small columns' chunks hold no more rows than
    # that needs (a tiny release stays tiny); none known: chunked by bytes alone
    planned: Mapping[str, int] = field(default_factory=dict)
    # HDF5's paged file-space strategy with pages of this many bytes (storage.page_size)
    page_size: int | None = None

    def path(self, split: str, name: str) -> str:
        return fileformat.dataset_path(self.template, split, name)

    @property
    def small(self) -> tuple[str, ...]:
        """The columns the sink buffers and appends in runs: texts and scalars."""
        return tuple(
            n for n, c in self.columns.items() if not isinstance(c, ArrayColumn | RaggedColumn)
        )

    @property
    def ragged(self) -> tuple[str, ...]:
        """The ragged columns: their offsets are appended with the small rows' runs."""
        return tuple(n for n, c in self.columns.items() if isinstance(c, RaggedColumn))

    def offsets_path(self, split: str, name: str) -> str:
        return fileformat.offsets_path(self.path(split, name))

    def buffered(self, split: str) -> dict[str, str]:
        """Every run-appended column of ``split`` -> its dataset path: the small columns,
        then each ragged column's offsets under ``<column>_offsets``."""
        out = {name: self.path(split, name) for name in self.small}
        out.update(
            (name + fileformat.OFFSETS_SUFFIX, self.offsets_path(split, name))
            for name in self.ragged
        )
        return out


RowsWatcher = Callable[[str, Sequence[str], dict[str, list[Any]], np.ndarray], None]
"""Shown each append of a split's rows: the split, the lineage's source names, the text
columns' values and the lineage rows (S64 digests)."""


class SmallRows:
    """Buffers and appends the rows of the small columns of every split, in order."""

    def __init__(
        self,
        file: h5py.File,
        layout: SinkLayout,
        stats: dict[str, DatasetStats],
        on_run: Callable[[str], None] = lambda split: None,
        on_rows: RowsWatcher | None = None,
    ):
        self.file = file
        self.layout = layout
        self.stats = stats
        self.on_run = on_run  # told of each run appended, by split: the journal places it
        self.on_rows = on_rows  # shown each append's texts and lineage (snapshot.WrittenRows)
        self._unjournaled_rows: dict[str, list[Any]] = {}  # by dataset path
        self._unjournaled_lineage: dict[str, list[list[str]]] = {}
        self._pending_rows: dict[str, dict[str, list[Any]]] = {}  # split -> field -> rows
        self._pending_lineage: dict[str, list[list[str]]] = {}
        # a ragged column's offsets are these running ends (one row per sample, after the 0
        # written at creation): (split, offsets key) -> the values rows given so far
        self._ends: dict[tuple[str, str], int] = {}
        self._scalars = {n for n in layout.small if isinstance(layout.columns[n], ScalarColumn)}

    def add(self, split: str, result: BatchResult) -> None:
        """Buffer a result's rows (journaled from now on); append whole runs of a thousand."""
        buffered = self.layout.buffered(split)
        small = self._pending_rows.setdefault(split, {name: [] for name in buffered})
        for name in self.layout.small:
            rows = result.columns[name]
            if isinstance(rows, np.ndarray):
                values = rows.tolist()
            else:
                assert isinstance(rows, list)
                values = [valid_text(text) for text in rows]
            small[name].extend(values)
            self._unjournaled_rows.setdefault(buffered[name], []).extend(values)
        for name in self.layout.ragged:
            ragged = result.columns[name]
            assert isinstance(ragged, RaggedRows)
            key = name + fileformat.OFFSETS_SUFFIX
            ends = self._ends.get((split, key), 0) + np.cumsum(ragged.lengths, dtype=np.int64)
            if len(ends):
                self._ends[(split, key)] = int(ends[-1])
            small[key].extend(ends.tolist())
            self._unjournaled_rows.setdefault(buffered[key], []).extend(ends.tolist())
        lineage = [list(row) for row in result.lineage]
        self._pending_lineage.setdefault(split, []).extend(lineage)
        self._unjournaled_lineage.setdefault(split, []).extend(lineage)
        if len(self._pending_lineage[split]) >= SMALL_ROWS_PER_WRITE:
            self._flush_split(split, whole_runs=True)

    def flush(self) -> None:
        """Append every buffered row (at the end of the build)."""
        for split in list(self._pending_lineage):
            self._flush_split(split, whole_runs=False)

    def _flush_split(self, split: str, *, whole_runs: bool) -> None:
        """Append the buffered rows of ``split``; with ``whole_runs`` only whole runs of
        ``SMALL_ROWS_PER_WRITE`` rows, the rest staying buffered.

        The runs depend on the row count alone, never on batch sizes or checkpoint times:
        the same writes in the same order make the same bytes (reproducible files).
        """
        lineage = self._pending_lineage.get(split, [])
        count = len(lineage)
        if whole_runs:
            count -= count % SMALL_ROWS_PER_WRITE
        small = self._pending_rows[split]
        for start in range(0, count, SMALL_ROWS_PER_WRITE):
            stop = min(start + SMALL_ROWS_PER_WRITE, count)
            rows = {name: values[start:stop] for name, values in small.items()}
            self.append(split, rows, lineage[start:stop])
            self.on_run(split)
        self._pending_lineage[split] = lineage[count:]
        self._pending_rows[split] = {name: values[count:] for name, values in small.items()}

    def replay_runs(self, runs: list[tuple[str, int]], chunks: int) -> list[tuple[str, int]]:
        """Append the runs a killed build appended before its chunk number ``chunks``
        (``runs`` as its journal placed them); return the runs still to come."""
        while runs and runs[0][1] <= chunks:
            self.flush_run(runs.pop(0)[0])
        return runs

    def flush_run(self, split: str) -> None:
        """Append the next run of ``split``'s buffered rows: a resume replays the killed
        build's runs where it appended them (between the same chunks), for the same bytes.

        Raises:
            ValueError: fewer than a run's rows are buffered (a journal this one did not write).
        """
        if len(self._pending_lineage.get(split, [])) < SMALL_ROWS_PER_WRITE:
            raise ValueError(f"the journal places a run of {split!r} that its rows do not fill")
        kept_lineage = self._pending_lineage[split][SMALL_ROWS_PER_WRITE:]
        kept = {n: v[SMALL_ROWS_PER_WRITE:] for n, v in self._pending_rows[split].items()}
        self._pending_lineage[split] = self._pending_lineage[split][:SMALL_ROWS_PER_WRITE]
        self._pending_rows[split] = {
            n: v[:SMALL_ROWS_PER_WRITE] for n, v in self._pending_rows[split].items()
        }
        self._flush_split(split, whole_runs=True)
        self._pending_lineage[split], self._pending_rows[split] = kept_lineage, kept

    def restore(self, split: str, small: dict[str, list[Any]], lineage: list[list[str]]) -> None:
        """Buffer rows a resume copies from a killed build's journal, as ``add`` does (its
        runs are appended by ``flush_run``); they stay unjournaled, so that this build's
        journal holds them too."""
        buffered = self.layout.buffered(split)
        pending = self._pending_rows.setdefault(split, {name: [] for name in buffered})
        for name in buffered:
            pending[name].extend(small[name])
        for name in self.layout.ragged:  # the next sample starts where these end
            ends = small[name + fileformat.OFFSETS_SUFFIX]
            self._ends[(split, name + fileformat.OFFSETS_SUFFIX)] = int(ends[-1]) if ends else 0
        self._pending_lineage.setdefault(split, []).extend(lineage)
        for name, rows in small.items():
            self._unjournaled_rows.setdefault(buffered[name], []).extend(rows)
        self._unjournaled_lineage.setdefault(split, []).extend(lineage)

    def append(
        self,
        split: str,
        small: dict[str, list[Any]],
        lineage_rows: list[list[str]] | np.ndarray,
        *,
        carried: bool = False,
    ) -> None:
        """Append rows to the split's small datasets (``lineage_rows``: hex digests, or a
        file's S64 rows of them). ``carried``: rows copied from another file ahead of any
        buffered one, so the next sample's values start where theirs end."""
        lineage_path = self.layout.path(split, fileformat.LINEAGE)
        start, count = len(self.file[lineage_path]), len(lineage_rows)  # rows stored so far
        for name in self.layout.small:
            rows = small[name]
            dataset = self.file[self.layout.path(split, name)]
            dataset.resize(start + count, axis=0)
            stats = self.stats[dataset.name]
            column = self.layout.columns[name]
            if isinstance(column, ScalarColumn):
                values = np.array(rows, dtype=column.dtype).reshape(count, *column.shape)
                dataset[start : start + count] = values
                stats.stream.update(values.tobytes())
                stats.raw_bytes += values.nbytes
            else:
                dataset[start : start + count] = rows
                stats.stream.update(digest.text_rows_bytes(rows))
                stats.raw_bytes += sum(len(r.encode()) for r in rows)
        for name in self.layout.ragged:  # offsets: row i + 1 is sample i's end (row 0 is 0)
            ends = np.array(small[name + fileformat.OFFSETS_SUFFIX], dtype=np.int64)
            dataset = self.file[self.layout.offsets_path(split, name)]
            dataset.resize(start + count + 1, axis=0)
            dataset[start + 1 : start + 1 + count] = ends
            stats = self.stats[dataset.name]
            stats.stream.update(ends.tobytes())
            stats.raw_bytes += ends.nbytes
            if carried and len(ends):
                self._ends[(split, name + fileformat.OFFSETS_SUFFIX)] = int(ends[-1])
        lineage = np.array(lineage_rows, dtype="S64").reshape(count, len(self.layout.sources))
        dataset = self.file[lineage_path]
        dataset.resize(start + count, axis=0)
        dataset[start : start + count] = lineage
        if self.on_rows is not None:
            texts = {n: small[n] for n in self.layout.small if n not in self._scalars}
            self.on_rows(split, self.layout.sources, texts, lineage)
        stats = self.stats[dataset.name]
        stats.stream.update(lineage.tobytes())
        stats.raw_bytes += lineage.nbytes

    def journal_delta(self) -> tuple[dict[str, list[Any]], dict[str, list[list[str]]]]:
        """The rows given since the last call, appended or still buffered (the journal holds
        their values: a resume appends them from there): by dataset path, lineage by split."""
        delta = self._unjournaled_rows, self._unjournaled_lineage
        self._unjournaled_rows, self._unjournaled_lineage = {}, {}
        return delta

    def pending_bytes(self) -> int:
        """An upper bound of the bytes buffered for the next flush."""
        rows = sum(len(lineage) for lineage in self._pending_lineage.values())
        chars = sum(
            len(text) if isinstance(text, str) else 8
            for split in self._pending_rows.values()
            for column in split.values()
            for text in column
        )
        # 64 bytes per lineage digest; up to 4 bytes per UTF-8 character and 16 per heap entry
        columns = 16 * len(self.layout.small) + 8 * len(self.layout.ragged)
        return rows * (64 * len(self.layout.sources) + columns) + 4 * chars


def store_rejects(group: h5py.Group, rejects: Sequence[Reject]) -> None:
    """``/diagnostics/rejects``: the rejects report inside the file, so a release copied
    alone still says what was left out and why (one row per file, as the JSONL beside it)."""
    text = h5py.string_dtype("utf-8")
    dtype = np.dtype([(name, text) for name in fileformat.REJECT_COLUMNS])
    rows = np.empty(len(rejects), dtype=dtype)
    for i, reject in enumerate(rejects):
        values = reject.as_json()
        rows[i] = tuple(valid_text(values[name]) for name in fileformat.REJECT_COLUMNS)
    group.create_dataset(fileformat.REJECTS_DATASET, data=rows, track_times=False)
