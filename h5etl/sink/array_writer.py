"""array_writer: the sink's writer of one image dataset, whole chunks at a time.

Part of the sink (the only code that writes HDF5): pre-compressed chunks go to
``write_direct_chunk``; raw rows (a ragged column's values, a task isolated after a worker
crash) are re-cut into whole chunks in a partial-chunk buffer and compressed on the sink's
threads (``compress_threads``). Rows are queued by ``add_*`` and stored, in the order queued,
by ``drain``, so the blocks of every dataset of a batch compress at once while the file sees
the same writes in the same order. It records each block's digest and where each chunk
sits, for the resume journal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl.dataflow import EncodedChunk
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.format.codec import BlockEncoder, ChunkLayout, decode_block
from h5etl.sink.compress_threads import ChunkPool, Encoded


@dataclass(slots=True)
class DatasetStats:
    path: str
    raw_bytes: int = 0
    blocks: list[bytes] = field(default_factory=list)
    block_rows: int = 0
    stream: Any = None  # hashlib object, for datasets hashed as one stream

    @property
    def sha256(self) -> str:
        if self.stream is not None:
            return digest.combine([self.stream.digest()])
        return digest.combine(self.blocks)


StoredChunks = list[tuple["ArrayWriter", tuple[int, ...], str]]
"""Chunks stored since the last checkpoint, in the order they were written, across datasets:
(writer, chunk offset, SHA-256 of the stored bytes). The sink's writers share one."""


def _ready(chunks: list[EncodedChunk], sha: bytes) -> Future[Encoded]:
    done: Future[Encoded] = Future()
    done.set_result(Encoded(chunks, sha, None))
    return done


_STORED = _ready([], b"")  # in the queue, in place of a block stored


class ArrayWriter:
    """Appends rows of one image dataset as whole chunks."""

    def __init__(
        self,
        dataset: h5py.Dataset,
        layout: ChunkLayout,
        stats: DatasetStats,
        stored: StoredChunks | None = None,
        pool: ChunkPool | None = None,
    ):
        self.dataset = dataset
        self.layout = layout
        self.stats = stats
        self.stored: StoredChunks = [] if stored is None else stored
        self._own_pool = pool is None
        self.pool = pool if pool is not None else ChunkPool(1)
        self.rows = 0  # stored; ``queued`` more wait for ``drain``
        self.queued = 0
        # (rows, blocks, the caller's blocks to empty once stored) per resize
        self._queue: list[tuple[int, list[Future[Encoded]], list[list[EncodedChunk]] | None]] = []
        self.partial: list[np.ndarray] = []
        self.partial_rows = 0
        self.direct_blocks = 0
        self.rechunked_blocks = 0
        self.copied_blocks = 0  # copied from another file (a parent, a shard), bytes as they were
        self.unjournaled_blocks: list[bytes] = []
        # One scratch dataset for every block this writer encodes through HDF5 (a layout
        # without a direct codec call): a new in-memory HDF5 file per block cost 5x the encode.
        self._encoder: BlockEncoder | None = None

    @property
    def _aligned(self) -> bool:
        """Whether the next row queued starts a chunk."""
        return not self.partial_rows and not (self.rows + self.queued) % self.layout.rows

    def add_encoded(
        self,
        blocks: list[list[EncodedChunk]],
        sha: list[bytes],
        count: int,
        *,
        release: bool = False,
        defer: bool = False,
    ) -> None:
        """Store encoded blocks; ``release``: empty each in ``blocks`` once it is stored (the
        caller is done with them), so a CT case's hundred megabytes of chunks leave memory as
        they are written, not once the whole case is (when the next case is arriving);
        ``defer``: queue them for ``drain``."""
        if not self._aligned:
            rows = np.concatenate([decode_block(self.layout, b) for b in blocks])[:count]
            self.add_raw(rows, defer=defer)
            return
        ready = [_ready(b, d) for b, d in zip(blocks, sha, strict=True)]
        self._enqueue(count, ready, blocks if release else None)
        self.direct_blocks += len(blocks)
        if not defer:
            self.drain()

    def _enqueue(
        self,
        count: int,
        blocks: list[Future[Encoded]],
        source: list[list[EncodedChunk]] | None = None,
    ) -> None:
        """Queue ``count`` rows in whole blocks from a chunk boundary: one resize, then their
        chunks, at the next ``drain``, which empties each of ``source`` as it stores it."""
        self._queue.append((count, blocks, source))
        self.queued += count

    def _submit(self, block: np.ndarray, count: int | None = None) -> Future[Encoded]:
        """A whole block (``count`` real rows, the rest zero padding) to the pool."""
        count = len(block) if count is None else count
        if len(block) < self.layout.rows:  # a last partial block: HDF5's edge chunk
            padded = np.zeros((self.layout.rows, *self.layout.shape), dtype=self.layout.dtype)
            padded[: len(block)] = block
            block = padded
        self.rechunked_blocks += 1  # compressed beside the writer, not in a worker
        return self.pool.submit(self.layout, block, count)

    def drain(self) -> None:
        """Store what is queued, in order: each block once its thread has encoded it (one
        without a direct codec call is encoded here, through HDF5)."""
        queue, self._queue = self._queue, []
        step = self.layout.rows
        for count, blocks, source in queue:
            self.dataset.resize(self.rows + count, axis=0)
            for index in range(len(blocks)):
                encoded = blocks[index].result()
                blocks[index] = _STORED  # let go of its chunks as they are stored
                chunks = encoded.chunks
                if chunks is None:
                    assert encoded.rows is not None
                    if self._encoder is None:
                        self._encoder = BlockEncoder(self.layout)
                    chunks = self._encoder.encode(encoded.rows)
                self._store(self.rows + index * step, chunks)
                if source is not None:
                    source[index] = []
                self.stats.blocks.append(encoded.digest)
                self.unjournaled_blocks.append(encoded.digest)
            self.rows += count
            self.queued -= count
            self.stats.raw_bytes += count * self.layout.block_nbytes // step

    def add_raw(self, rows: np.ndarray, *, final: bool = False, defer: bool = False) -> None:
        """Store raw rows (``defer``: queue them for ``drain``). Whole blocks at a chunk
        boundary (or a final task's rows) are stored as a worker's would be, with the same
        writes in the same order, so a task a crash isolation joined leaves the very bytes an
        uneventful build does; anything else is re-cut through the partial-chunk buffer, a resize
        per block."""
        self._cut(rows, final=final)
        if not defer:
            self.drain()

    def _cut(self, rows: np.ndarray, *, final: bool) -> None:
        if len(rows) == 0:
            return
        step = self.layout.rows
        if self._aligned and (final or not len(rows) % step):
            cuts = range(0, len(rows), step)
            self._enqueue(len(rows), [self._submit(rows[start : start + step]) for start in cuts])
            return
        if self.partial_rows + len(rows) < step:
            self.partial.append(rows)
            self.partial_rows += len(rows)
            return
        start = 0
        if self.partial_rows:  # the partial chunk and the first rows make a block
            start = step - self.partial_rows
            self._enqueue(step, [self._submit(np.concatenate([*self.partial, rows[:start]]))])
        whole = start + (len(rows) - start) // step * step
        for begin in range(start, whole, step):  # views: the rest are cut, never copied
            self._enqueue(step, [self._submit(rows[begin : begin + step])])
        # a copy: the partial chunk must not keep the whole batch's values alive
        self.partial = [rows[whole:].copy()] if whole < len(rows) else []
        self.partial_rows = len(rows) - whole

    def flush_partial(self) -> None:
        """Queue the partial chunk as the last chunk, padded (nothing follows it)."""
        if not self.partial_rows:
            return
        rows = np.concatenate(self.partial)
        self._enqueue(len(rows), [self._submit(rows)])
        self.partial, self.partial_rows = [], 0

    def finish(self) -> None:
        """Store everything: what is queued and the partial chunk."""
        self.flush_partial()
        self.drain()

    def restore(self, rows: int, blocks: list[str]) -> None:
        """Adopt ``rows`` rows already copied in, with their block digests.

        The copied chunks (``note_copied``) and these digests stay unjournaled: the new
        build's journal must describe the whole file, or a second kill loses them.
        """
        self.dataset.resize(rows, axis=0)
        self.rows = rows
        self.stats.blocks = [bytes.fromhex(b) for b in blocks]
        self.stats.raw_bytes = rows * self.layout.block_nbytes // self.layout.rows
        self.unjournaled_blocks = list(self.stats.blocks)

    def adopt(
        self, rows: int, blocks: list[bytes], chunks: list[tuple[tuple[int, ...], str]]
    ) -> None:
        """Count ``rows`` rows whose chunks were copied in after those stored so far
        (``chunk_copy.copy_rows``), with their block digests; ``chunks`` (offset, SHA-256)
        go to the resume journal."""
        assert not self.partial_rows, "rows carried in behind rows still in the partial chunk"
        assert not self.queued, "rows carried in behind rows still queued"
        assert not self.rows % self.layout.rows, "rows carried in mid-chunk"
        self.rows += rows
        self.stats.blocks.extend(blocks)
        self.unjournaled_blocks.extend(blocks)
        self.stats.raw_bytes += rows * self.layout.block_nbytes // self.layout.rows
        self.stored.extend((self, offset, sha) for offset, sha in chunks)
        self.copied_blocks += len(blocks)

    def note_copied(self, offset: tuple[int, ...], sha256: str) -> None:
        self.stored.append((self, offset, sha256))

    def _store(self, row: int, chunks: list[EncodedChunk]) -> None:
        for chunk in chunks:
            offset = (row + chunk.offset[0], *chunk.offset[1:])
            self.dataset.id.write_direct_chunk(offset, chunk.data, chunk.filter_mask)
            self.stored.append(
                (self, offset, chunk.sha256 or hashlib.sha256(chunk.data).hexdigest())
            )

    def close(self) -> None:
        """Free the scratch dataset (and the threads, if its own; the file is the sink's)."""
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        if self._own_pool:
            self.pool.close()

    def block_delta(self) -> list[str]:
        """The block digests stored since the last call, for the resume journal."""
        blocks = [b.hex() for b in self.unjournaled_blocks]
        self.unjournaled_blocks = []
        return blocks


def chunk_places(
    dataset: h5py.Dataset, wanted: set[tuple[int, ...]]
) -> dict[tuple[int, ...], tuple[int, int, int]]:
    """(filter mask, byte offset, size) of each chunk of ``dataset`` at ``wanted`` offsets.

    One pass over the chunk index (``H5Dchunk_iter``), however few are asked for: a lookup
    by coordinates (``H5Dget_chunk_info_by_coord``) moves where HDF5 puts the file's later
    metadata and chunks (a volume build checkpointed after every task of 2 cases stored its
    chunks 2 KiB further on than one never checkpointed), so a file's layout depended on
    when its checkpoints came: a killed and resumed build, whose checkpoints fall elsewhere,
    was not the same file byte for byte. The pass also costs less than the lookups (6,400
    chunks of a volume build: 7 s by coordinates, 0.03 s in one pass). Lookups by
    coordinates only where h5py lacks the pass (HDF5 before 1.14; not reproducible then).
    """
    places: dict[tuple[int, ...], tuple[int, int, int]] = {}
    if hasattr(dataset.id, "chunk_iter"):

        def visit(info: Any) -> None:  # called for every chunk of the dataset: kept lean
            if info.chunk_offset in wanted:  # (a tuple of ints)
                places[info.chunk_offset] = (info.filter_mask, info.byte_offset, info.size)

        dataset.id.chunk_iter(visit)
    for offset in wanted - places.keys():
        info = dataset.id.get_chunk_info_by_coord(offset)
        places[offset] = (int(info.filter_mask), int(info.byte_offset), int(info.size))
    return places


def dataset_report(
    file: h5py.File, stats: Mapping[str, DatasetStats], in_parts: Mapping[str, int]
) -> dict[str, dict[str, Any]]:
    """Each written dataset's digests and sizes, by path: what ``/diagnostics`` records.
    ``in_parts``: the stored bytes of a virtual release's datasets (in its part files)."""
    report = {}
    for path, dataset in stats.items():
        stored = in_parts.get(path)
        if stored is None:
            stored = int(file[path].id.get_storage_size())
        blocks = [dataset.stream.digest()] if dataset.stream is not None else dataset.blocks
        report[path] = {
            "dataset": path,
            "sha256": dataset.sha256,
            "raw_bytes": dataset.raw_bytes,
            "stored_bytes": stored,
            "ratio": round(dataset.raw_bytes / stored, 4) if stored else 0.0,
            "block_rows": dataset.block_rows,
            fileformat.BLOCK_DIGESTS: [b.hex() for b in blocks],
        }
    return report
