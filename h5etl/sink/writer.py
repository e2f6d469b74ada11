"""writer: the single writer. Creates the datasets, stores batches in order, records digests.

Batches arrive in write order per split (the splits' batches may interleave). They come as
whole pre-compressed chunks, stored with ``write_direct_chunk``; rows that come raw (ragged
values, a task isolated after a worker crash) go through a carry buffer that re-cuts whole
chunks (the last one padded, as HDF5 stores edge chunks), compressed on threads beside the
writer (``compress_threads``). Only this module and its parts (this folder: datasets, chunks, rows,
ragged values, copies, the journal side, the disk side) write HDF5 files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from h5etl.dataflow import BatchResult, EncodedRows, RaggedRows, Reject
from h5etl.errors import SinkError, io_problem
from h5etl.format import contract as fileformat
from h5etl.format.codec import ChunkLayout
from h5etl.sink import disk as sink_disk
from h5etl.sink.array_writer import ArrayWriter, DatasetStats, StoredChunks, dataset_report
from h5etl.sink.checkpoint import JournalSide
from h5etl.sink.compress_threads import ChunkPool
from h5etl.sink.datasets import create_split
from h5etl.sink.parent_rows import Seed, copy_parent_columns, open_seed, parent_rows, seed_dataset
from h5etl.sink.small_columns import RowsWatcher, SinkLayout, SmallRows, store_rejects
from h5etl.sink.virtual import VirtualColumn, create_virtual, map_arrays

__all__ = ["LIBVER", "Sink"]

LIBVER = ("v110", "v110")  # readable by HDF5 1.10 tools (h5ls, h5dump) and newer
WRITE_CACHE_BYTES = 256 * 1024
logger = logging.getLogger(__name__)


def paged(page_size: int | None) -> dict[str, Any]:
    """h5py's options for the paged file-space strategy (none: HDF5's default layout)."""
    if page_size is None:
        return {}
    return {"fs_strategy": "page", "fs_page_size": page_size, "fs_persist": False}


class Sink(JournalSide):
    """Context manager around the one HDF5 file a build writes; created with mode ``x``."""

    _created = False  # the file exists because this sink created it: its own to abandon
    _abandoned = False  # its bytes were given up after a failed write (see _abandon)

    def __init__(
        self,
        path: Path,
        layout: SinkLayout,
        *,
        virtual: bool = False,
        seed: Seed | None = None,
        on_rows: RowsWatcher | None = None,
        on_created: Callable[[], None] = lambda: None,
    ):
        """``virtual``: the array datasets map onto part files (``virtual``) instead of
        holding chunks; ``write`` then takes no array rows. ``seed``: the fixed arrays' first
        rows of each split come as copies of a parent's datasets (``parent_rows.Seed``); the
        ``carry`` of those rows then counts them. ``on_rows``: shown every append of small
        rows (``small_columns.RowsWatcher``), as they go to the file. ``on_created``: called once
        the file exists, before its datasets are made (a seed copy takes a while)."""
        self.path = path
        self.layout = layout
        self.virtual: dict[tuple[str, str], VirtualColumn] | None = {} if virtual else None
        self.file: h5py.File | None = None
        self.arrays: dict[tuple[str, str], ArrayWriter] = {}  # arrays and ragged values
        self.pool = ChunkPool()  # compresses the blocks the writers re-cut
        self.ragged = frozenset((s, n) for s in layout.splits for n in layout.ragged)
        self.stats: dict[str, DatasetStats] = {}
        self.counts: dict[str, int] = dict.fromkeys(layout.splits, 0)
        self.seconds = 0.0
        self.rows: SmallRows | None = None  # the small columns, once the file exists
        # For the resume journal, in write order: the chunks stored since the last checkpoint
        # (all datasets), and where the small rows' runs came between them, as
        # (split, chunks journaled before it): a resume replays both in that order.
        self._stored: StoredChunks = []
        self._runs: list[tuple[str, int]] = []
        self._journaled_chunks = 0
        self.writeback = sink_disk.Writeback(path)  # so the closing fsync has little to wait for
        self.seed = seed
        self._seeded: dict[tuple[str, str], int] = {}  # rows a dataset was created holding
        self.on_rows = on_rows
        self.on_created = on_created

    def __enter__(self) -> Sink:
        try:
            # Image chunks bypass the chunk cache (write_direct_chunk); the small datasets are
            # written once, in order, so a small cache suffices. HDF5 2.0's default (8 MiB per
            # dataset) would keep every row of them in memory: RSS grew with the dataset.
            # No object timestamps (track_times): the same inputs make the same bytes. h5py
            # before 3.15 stored them on every track_order group, the root one included.
            self.file = h5py.File(
                self.path,
                "x",
                libver=LIBVER,
                track_order=True,
                track_times=False,
                rdcc_nbytes=WRITE_CACHE_BYTES,
                **paged(self.layout.page_size),
            )
            self._created = True
            self.on_created()
            source = open_seed(self.seed if self.virtual is None else None)
            with source if source is not None else contextlib.nullcontext():
                for split in self.layout.splits:
                    self._create_split(self.file, split, source)
            self.rows = SmallRows(
                self.file, self.layout, self.stats, on_run=self._note_run, on_rows=self.on_rows
            )
        except (OSError, RuntimeError) as exc:
            self._abandon()  # only if it got as far as creating the file
            self._close_quietly()
            problem = io_problem(exc)
            raise SinkError(f"cannot create the release file: {problem}", path=self.path) from exc
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the file. Leaving on an exception, an error in closing does not hide the one
        in flight; leaving on an I/O error (a full disk, most likely) abandons the file first,
        so that the close finds room (the build deletes the file anyway)."""
        if kind is None:
            self._close()
            return
        if issubclass(kind, OSError):
            self._abandon()
        self._close_quietly()

    def _close(self) -> None:
        try:
            for writer in self.arrays.values():
                writer.close()
            self.pool.close()
        finally:
            self.writeback.close()  # its thread waits for work until then
        file, self.file = self.file, None
        if file is None or not file.id.valid:
            return
        try:
            file.close()
        except (OSError, RuntimeError) as exc:
            # HDF5 has released the file though its id still looks valid: never touch it
            # again, not even to free it (``locked`` keeps h5py from doing so); nor the
            # datasets the writers hold, whose freeing at exit would crash the interpreter.
            file.id.locked = True
            for writer in self.arrays.values():
                writer.dataset.id.locked = True
            raise self._failed("closing the file", exc) from exc

    def _close_quietly(self) -> None:
        try:
            self._close()
        except SinkError as exc:
            logger.debug("after the error above: %s", exc)

    def _abandon(self) -> None:
        """Give up the file: free its bytes now (it is deleted anyway), so that the metadata
        HDF5 still writes as the objects and the file close finds room."""
        if self._created and not self._abandoned:
            self._abandoned = True
            with contextlib.suppress(OSError):
                os.truncate(self.path, 0)

    def _failed(self, action: str, exc: BaseException, detail: str = "") -> SinkError:
        """The error for a failed write; the file is abandoned at once (see ``_abandon``)."""
        self._abandon()
        return SinkError(f"{action} failed: {io_problem(exc, detail)}", path=self.path)

    def _ensure_room(self, nbytes: int, action: str) -> None:
        """Fail before HDF5 does: after a failed flush, HDF5 cannot close the file.

        ``nbytes`` is about to be written; ``sink_disk.HEADROOM_BYTES`` more stay for metadata.
        """
        short = sink_disk.no_room(self.path, nbytes)
        if short is not None:
            error, detail = short
            raise self._failed(action, error, detail)

    def _create_split(self, file: h5py.File, split: str, source: h5py.File | None) -> None:
        rows = 0 if source is None or self.seed is None else self.seed.rows.get(split, 0)

        def seed(name: str, path: str, chunked: ChunkLayout) -> h5py.Dataset | None:
            assert source is not None
            if self.seed is not None and name in self.seed.skip:
                return None  # made again by this build (an incremental build's redo)
            dataset = seed_dataset(file, source, path, rows, chunked)
            if dataset is not None:
                self._seeded[(split, name)] = rows
            return dataset

        created = create_split(
            file, self.layout, split, self._stored, self.pool, seed if rows else None
        )
        if self.virtual is not None:
            map_arrays(file, self.layout, created, self.virtual)
        self.arrays.update(created.writers)
        self.stats.update(created.stats)

    def write(self, result: BatchResult, only: frozenset[str] | None = None) -> None:
        """Append one batch to its split, in the order batches are given. The chunks of its
        ragged columns are emptied as they are stored (a result is written once). ``only``:
        just these array columns' rows, of samples whose other columns, small rows and
        lineage were copied (``copy_parent_rows`` with ``skip``): an incremental build's
        fields made again."""
        assert self.file is not None, "Sink used outside its with-block"
        started = time.perf_counter()
        split, count = result.task.split, result.accepted
        # A write HDF5 cannot finish leaves metadata it must still write at the close: stop
        # before that, while there is room for it (two system calls per batch).
        nbytes = sink_disk.batch_nbytes(result)
        self._ensure_room(nbytes, "writing")
        try:
            writers = [
                (n, w)
                for (target, n), w in self.arrays.items()
                if target == split and (only is None or n in only)
            ]
            for name, writer in writers:  # queued: every dataset's re-cut blocks compress at once
                rows = result.columns[name]
                ragged = isinstance(rows, RaggedRows)
                if isinstance(rows, RaggedRows):  # its offsets go with the small rows
                    count = int(rows.lengths.sum())
                    rows = rows.values
                if isinstance(rows, EncodedRows):
                    # a ragged value (a CT case, a recording) is let go of as it is stored
                    writer.add_encoded(rows.blocks, rows.digests, count, release=ragged, defer=True)
                else:
                    assert isinstance(rows, np.ndarray)
                    writer.add_raw(rows, final=result.task.final, defer=True)
                if result.task.final:
                    # nothing follows a split's final task: store its last chunk now, or rows
                    # left in the carry would hold off every later checkpoint of the build
                    writer.flush_partial()
                count = result.accepted
            for _, writer in writers:  # then stored, dataset by dataset, as they were queued
                writer.drain()
            if only is not None:
                count = 0  # the samples' rows are in the file already
            elif count:
                self._small.add(split, result)
        except (OSError, RuntimeError) as exc:
            raise self._failed("writing", exc) from exc
        self.counts[split] += count
        self.writeback.note(nbytes)
        self.seconds += time.perf_counter() - started

    def copy_parent_rows(
        self,
        parent: Path,
        split: str,
        blocks: list[tuple[int, int]],
        record: dict[str, list[str]],
        between: Callable[[], None] = lambda: None,
        skip: frozenset[str] = frozenset(),
    ) -> int:
        """Append rows of ``parent``'s ``split`` as they are stored there: each (start, rows)
        block's chunks byte for byte (``chunk_copy.copy_rows``: the filter mask travels with
        the bytes, so every codec stays intact; a ragged column's value rows around its whole
        chunks are re-cut), the block digests the parent recorded, its text, scalar, offsets
        and lineage rows as values, and ``record`` (this build's sample keys of those
        rows). Call before any ``write`` to ``split``. Returns the stored bytes copied.
        ``between``: called now and then while the chunks are copied (the build fsyncs them).
        ``skip``: array columns not copied: ``write(result, only)`` gives their rows after.
        """
        assert self.file is not None
        if not blocks:
            return 0
        try:
            seeded = {n: self._seeded.pop((s, n)) for s, n in list(self._seeded) if s == split}
            with h5py.File(parent, "r") as source:
                copied, ends = copy_parent_columns(
                    source, self.layout, self.arrays, split, blocks, between, seeded, skip
                )
                small, lineage = parent_rows(source, self.layout, split, blocks)
            small.update(record)
            small.update(ends)
            self._ensure_room(self._small.pending_bytes(), "copying the parent's rows")
            self._small.append(split, small, lineage, carried=True)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise self._failed("copying the parent's chunks", exc) from exc
        self.counts[split] += len(lineage)
        return copied

    def append_rows(
        self, split: str, small: dict[str, list[Any]], lineage: list[list[str]]
    ) -> None:
        """Take rows of the small columns carried from another file (``chunk_copy``), after
        those given so far; their array rows are carried as chunks beside. They are buffered
        and appended in runs as decoded rows are, and journaled with them."""
        assert self.file is not None
        self._small.restore(split, small, lineage)
        self.counts[split] += len(lineage)

    def store_partial_chunks(self) -> None:
        """Store every writer's last, partial chunk now (its carry, as ``finish`` would): a
        shard does so before its manifest takes the digests of the chunks it stored."""
        try:
            for writer in self.arrays.values():
                writer.finish()
        except (OSError, RuntimeError) as exc:
            raise self._failed("writing", exc) from exc

    @property
    def _small(self) -> SmallRows:
        assert self.rows is not None, "Sink used outside its with-block"
        return self.rows

    def finish(
        self,
        attrs: dict[str, Any],
        diagnostics: dict[str, Any],
        dataset_attrs: dict[str, dict[str, Any]] | None = None,
        *,
        rejects: Sequence[Reject] = (),
        annotate: Callable[[h5py.File], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Store the last partial chunks, the attrs (the file's, and ``dataset_attrs`` by
        dataset path: statistics, class names), ``/diagnostics`` and its rejects table;
        return dataset stats. ``annotate`` reads the file once its data and attrs are in
        and returns more file attrs (the change from the parent release, h5etl.history.diff)."""
        assert self.file is not None
        assert not self._seeded, f"rows copied with {sorted(self._seeded)} were never carried"
        self._ensure_room(self._finish_bytes(rejects), "finishing the file")
        try:
            self._small.flush()
            for writer in self.arrays.values():
                writer.finish()
            for (split, name), column in (self.virtual or {}).items():
                create_virtual(self.file, self.layout.path(split, name), column)
            self.file.attrs.update(attrs)
            for path, values in (dataset_attrs or {}).items():
                self.file[path].attrs.update(values)
            if annotate is not None:
                self.file.attrs.update(annotate(self.file))
            report = self._dataset_report()
            group = self.file.create_group(
                fileformat.DIAGNOSTICS, track_order=True, track_times=False
            )
            for key, value in diagnostics.items():
                group.attrs[key] = value
            store_rejects(group, rejects)
            datasets = group.create_group(
                fileformat.DATASETS_GROUP, track_order=True, track_times=False
            )
            for path, info in report.items():
                node = datasets.create_group(fileformat.diagnostics_node(path), track_times=False)
                node.attrs.update({k: v for k, v in info.items() if k != fileformat.BLOCK_DIGESTS})
                node.create_dataset(
                    fileformat.BLOCK_DIGESTS,
                    track_times=False,
                    data=np.array(info[fileformat.BLOCK_DIGESTS], dtype="S64"),
                )
            self.file.flush()
        except (OSError, RuntimeError) as exc:
            raise self._failed("finishing the file", exc) from exc
        return report

    def _finish_bytes(self, rejects: Sequence[Reject]) -> int:
        """An upper bound of what ``finish`` writes: the last chunks, rows, diagnostics."""
        carry = sum(
            writer.layout.block_nbytes * 2 for writer in self.arrays.values() if writer.partial_rows
        )
        digests = sum(len(stats.blocks) + 1 for stats in self.stats.values()) * 64
        table = sum(sum(map(len, r.as_json().values())) * 4 + 128 for r in rejects)
        return carry + self._small.pending_bytes() + digests + table

    def _dataset_report(self) -> dict[str, dict[str, Any]]:
        assert self.file is not None
        in_parts = {
            self.layout.path(s, n): c.stored_bytes for (s, n), c in (self.virtual or {}).items()
        }
        return dataset_report(self.file, self.stats, in_parts)

    @property
    def chunk_paths(self) -> dict[str, int]:
        """How many blocks went straight through and how many were re-cut, per dataset."""
        out = {}
        for writer in self.arrays.values():
            out[f"{writer.stats.path}:direct"] = writer.direct_blocks
            out[f"{writer.stats.path}:rechunked"] = writer.rechunked_blocks
            if writer.copied_blocks:
                out[f"{writer.stats.path}:copied"] = writer.copied_blocks
        return out
