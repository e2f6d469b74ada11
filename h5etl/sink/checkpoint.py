"""checkpoint: the sink's side of resuming: what a checkpoint records of the file, the
fsync that makes it durable, and copying a killed build's chunks back (``restore``).

Part of the sink (the only code that writes HDF5): ``Sink`` takes these methods from
``JournalSide``; the journal file itself is ``h5etl.format.journal``'s, the resume plan
``h5etl.resume.journal_use``'s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import h5py

from h5etl.errors import ResumeMismatch, SinkError, io_problem
from h5etl.format import journal
from h5etl.format.journal import ResumeState
from h5etl.sink import disk as sink_disk
from h5etl.sink.array_writer import ArrayWriter, StoredChunks, chunk_places
from h5etl.sink.ragged import EMPTY, restore_ragged, snapshot
from h5etl.sink.small_columns import SinkLayout, SmallRows


class JournalSide:
    """The resume half of ``Sink``; the attributes and methods below are the sink's."""

    path: Path
    layout: SinkLayout
    file: h5py.File | None
    arrays: dict[tuple[str, str], ArrayWriter]
    ragged: frozenset[tuple[str, str]]
    counts: dict[str, int]
    _stored: StoredChunks
    _runs: list[tuple[str, int]]
    _journaled_chunks: int

    @property
    def _small(self) -> SmallRows:
        raise NotImplementedError

    def _failed(self, action: str, exc: BaseException, detail: str = "") -> SinkError:
        raise NotImplementedError

    def _ensure_room(self, nbytes: int, action: str) -> None:
        raise NotImplementedError

    @property
    def consistent(self) -> bool:
        """True when every stored row is in whole chunks: a point a resume can start from.

        A ragged column's partial chunk (the values after its last whole chunk) does not count: the
        checkpoint records it (``ragged.snapshot``), as it almost never empties.
        """
        return all(
            not writer.partial_rows for key, writer in self.arrays.items() if key not in self.ragged
        )

    def checkpoint(self) -> dict[str, Any]:
        """Return what was stored since the last checkpoint, for the resume journal.

        The delta is durable only after ``sync()``, which may run in another thread. Nothing
        is written here: the chunks went to the OS as they were stored (direct chunk writes
        bypass HDF5's caches) and the small rows' values travel in the journal. A resume
        trusts no HDF5 metadata of a killed file, so none is flushed; and a flush at clock
        times would make the file's layout depend on the clock (HDF5 gives up its space
        aggregators at every flush), where a release must be reproducible byte for byte.
        """
        assert self.file is not None
        assert self.consistent
        self._ensure_room(0, "flushing")  # a disk about to fill fails here, before HDF5 does
        stored = self._stored
        writers = list({id(writer): writer for writer, _, _ in stored}.values())
        index = {id(writer): i for i, writer in enumerate(writers)}
        which = [index[id(writer)] for writer, _, _ in stored]
        wanted: list[set[tuple[int, ...]]] = [set() for _ in writers]
        for (_, offset, _), i in zip(stored, which, strict=True):
            wanted[i].add(offset)
        # one pass over each dataset's chunk index, not a lookup per chunk
        found = [chunk_places(w.dataset, wanted[i]) for i, w in enumerate(writers)]
        chunks = journal.pack_chunks(
            [writer.dataset.name for writer in writers],
            which,
            [offset for _, offset, _ in stored],
            [found[i][offset] for (_, offset, _), i in zip(stored, which, strict=True)],
            [sha for _, _, sha in stored],
        )
        count = len(stored)
        self._stored.clear()  # (in place: the writers share the list)
        self._journaled_chunks += count
        runs, self._runs = self._runs, []
        delta = {
            "rows": dict(self.counts),
            "chunks": chunks,
            "runs": [list(run) for run in runs],
            "blocks": {w.stats.path: w.block_delta() for w in self.arrays.values()},
        }
        delta["texts"], delta["lineage"] = self._small.journal_delta()
        if self.ragged:
            delta["ragged"] = {
                self.arrays[key].stats.path: snapshot(self.arrays[key]) for key in self.ragged
            }
        return delta

    def _note_run(self, split: str) -> None:
        self._runs.append((split, self._journaled_chunks + len(self._stored)))

    def sync(self) -> None:
        """fsync the file and hand the page cache back what is durable
        (``sink_disk.sync_and_drop``): no HDF5 call, so it may run beside the writer in a
        thread."""
        try:
            sink_disk.sync_and_drop(self.path)
        except OSError as exc:
            # no _failed here: it may run beside the writer, which then fails on the file
            raise SinkError(f"fsync failed: {io_problem(exc)}", path=self.path) from exc

    def restore(self, state: ResumeState, partial: Path) -> None:
        """Copy what a killed build stored (per its journal) from its temp file, verified.

        Raises:
            ResumeMismatch: a recorded chunk is missing or its bytes changed.
        """
        assert self.file is not None
        writers = {writer.stats.path: writer for writer in self.arrays.values()}
        for split in self.layout.splits:  # buffered first: their runs come between the chunks
            small = {
                name: state.texts.get(path, [])
                for name, path in self.layout.buffered(split).items()
            }
            lineage = state.lineage.get(split, [])
            if lineage:
                self._small.restore(split, small, lineage)
                self.counts[split] = len(lineage)
        runs = list(state.runs)
        try:
            with open(partial, "rb") as source:
                for index, record in enumerate(state.chunks):
                    runs = self._small.replay_runs(runs, index)
                    source.seek(record.byte_offset)
                    data = source.read(record.size)
                    writer = writers.get(record.dataset)
                    if writer is None or hashlib.sha256(data).hexdigest() != record.sha256:
                        raise ResumeMismatch(
                            f"chunk {record.offset} of {record.dataset} does not match the journal",
                            path=partial,
                        )
                    self._copy_chunk(writer, record.offset, data, record.filter_mask)
                    writer.note_copied(record.offset, record.sha256)
            self._small.replay_runs(runs, len(state.chunks))
        except ValueError as exc:  # the journal places more runs than its rows fill
            raise ResumeMismatch(str(exc), path=partial) from exc
        except SinkError:  # (an OSError too) a mismatch, or a write that failed
            raise
        except OSError as exc:
            raise ResumeMismatch(
                f"cannot read the earlier temp file: {io_problem(exc)}", path=partial
            ) from exc
        for key, writer in self.arrays.items():
            blocks = state.blocks.get(writer.stats.path, [])
            if key in self.ragged:
                ends = state.texts.get(self.layout.offsets_path(*key), [])
                found = state.ragged.get(writer.stats.path, EMPTY)
                restore_ragged(writer, found, blocks, int(ends[-1]) if ends else 0)
            else:
                writer.restore(state.rows.get(key[0], 0), blocks)

    def _copy_chunk(
        self, writer: ArrayWriter, offset: tuple[int, ...], data: bytes, filter_mask: int
    ) -> None:
        """Store one chunk copied from a killed build; a failed write is a write error (a
        full disk), not a reason to distrust the killed build's file."""
        try:
            if writer.dataset.shape[0] < offset[0] + 1:
                writer.dataset.resize(offset[0] + 1, axis=0)
            writer.dataset.id.write_direct_chunk(offset, data, filter_mask)
        except OSError as exc:
            raise self._failed("copying the killed build's chunks", exc) from exc
