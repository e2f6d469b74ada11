"""sink_chunks: the sink's writer of one image dataset, whole chunks at a time.

Part of the sink (the only code that writes HDF5): pre-compressed chunks go to
``write_direct_chunk``; raw rows (a task isolated after a worker crash) are re-cut into whole
chunks in a carry buffer. It records each block's digest and where each chunk sits, for the
resume journal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl import digest
from h5etl.chunkcodec import BlockEncoder, ChunkLayout, decode_block, encode_rows
from h5etl.records import EncodedChunk


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


StoredChunks = list[tuple["ImageWriter", tuple[int, ...], str]]
"""Chunks stored since the last checkpoint, in the order they were written, across datasets:
(writer, chunk offset, SHA-256 of the stored bytes). The sink's writers share one."""


class ImageWriter:
    """Appends rows of one image dataset as whole chunks."""

    def __init__(
        self,
        dataset: h5py.Dataset,
        layout: ChunkLayout,
        stats: DatasetStats,
        stored: StoredChunks | None = None,
    ):
        self.dataset = dataset
        self.layout = layout
        self.stats = stats
        self.stored: StoredChunks = [] if stored is None else stored
        self.rows = 0
        self.carry: list[np.ndarray] = []
        self.carry_rows = 0
        self.direct_blocks = 0
        self.rechunked_blocks = 0
        self.copied_blocks = 0  # copied from another file (a parent, a shard), bytes as they were
        self.unjournaled_blocks: list[bytes] = []
        # One scratch dataset for every block this writer re-cuts (a ragged column re-cuts
        # nearly all of its blocks): a new in-memory HDF5 file per block cost 5x the encode.
        self._encoder: BlockEncoder | None = None

    def add_encoded(
        self,
        blocks: list[list[EncodedChunk]],
        sha: list[bytes],
        count: int,
        *,
        release: bool = False,
    ) -> None:
        """Store encoded blocks; ``release``: empty each in ``blocks`` once it is stored (the
        caller is done with them), so a CT case's hundred megabytes of chunks leave memory as
        they are written, not once the whole case is (when the next case is arriving)."""
        if self.carry_rows or self.rows % self.layout.rows:
            self.add_raw(np.concatenate([decode_block(self.layout, b) for b in blocks])[:count])
            return
        self._store_blocks(blocks, sha, count, release=release)
        self.direct_blocks += len(blocks)

    def _store_blocks(
        self,
        blocks: list[list[EncodedChunk]],
        sha: list[bytes],
        count: int,
        *,
        release: bool = False,
    ) -> None:
        """Store whole encoded blocks from a chunk boundary: one resize, then their chunks."""
        self.dataset.resize(self.rows + count, axis=0)
        for index, block in enumerate(blocks):
            self._store(self.rows + index * self.layout.rows, block)
            if release:
                blocks[index] = []
        self.rows += count
        self.stats.blocks.extend(sha)
        self.unjournaled_blocks.extend(sha)
        self.stats.raw_bytes += count * self.layout.block_nbytes // self.layout.rows

    def add_raw(self, rows: np.ndarray, *, final: bool = False) -> None:
        """Store raw rows. Whole blocks at a chunk boundary (or a final task's rows) are
        compressed here and stored as a worker's would be, with the same writes in the same
        order, so a task a crash isolation joined leaves the very bytes an uneventful build
        does; anything else is re-cut in the carry buffer."""
        if len(rows) == 0:
            return
        aligned = not self.carry_rows and not self.rows % self.layout.rows
        if aligned and (final or not len(rows) % self.layout.rows):
            blocks, digests = encode_rows(self.layout, rows)
            self._store_blocks(blocks, digests, len(rows))
            self.rechunked_blocks += len(blocks)  # compressed by the writer all the same
            return
        self.carry.append(rows)
        self.carry_rows += len(rows)
        step = self.layout.rows
        if self.carry_rows < step:
            return
        pending = np.concatenate(self.carry)
        whole = (len(pending) // step) * step
        for start in range(0, whole, step):
            self._store_rows(pending[start : start + step])
        self.carry = [pending[whole:]] if whole < len(pending) else []
        self.carry_rows = len(pending) - whole

    def finish(self) -> None:
        if not self.carry_rows:
            return
        rows = np.concatenate(self.carry)
        padded = np.zeros((self.layout.rows, *self.layout.shape), dtype=self.layout.dtype)
        padded[: len(rows)] = rows
        self._store_rows(padded, count=len(rows))
        self.carry, self.carry_rows = [], 0

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
        (``sink_copy.copy_rows``), with their block digests; ``chunks`` (offset, SHA-256)
        go to the resume journal."""
        assert not self.carry_rows, "rows carried in behind rows still in the carry"
        assert not self.rows % self.layout.rows, "rows carried in mid-chunk"
        self.rows += rows
        self.stats.blocks.extend(blocks)
        self.unjournaled_blocks.extend(blocks)
        self.stats.raw_bytes += rows * self.layout.block_nbytes // self.layout.rows
        self.stored.extend((self, offset, sha) for offset, sha in chunks)
        self.copied_blocks += len(blocks)

    def note_copied(self, offset: tuple[int, ...], sha256: str) -> None:
        self.stored.append((self, offset, sha256))

    def _store_rows(self, block: np.ndarray, count: int | None = None) -> None:
        count = len(block) if count is None else count
        self.dataset.resize(self.rows + count, axis=0)
        if self._encoder is None:
            self._encoder = BlockEncoder(self.layout)
        self._store(self.rows, self._encoder.encode(block))
        self.stats.blocks.append(digest.block_digest(block[:count]))
        self.unjournaled_blocks.append(self.stats.blocks[-1])
        self.stats.raw_bytes += block[:count].nbytes
        self.rows += count
        self.rechunked_blocks += 1

    def _store(self, row: int, chunks: list[EncodedChunk]) -> None:
        for chunk in chunks:
            offset = (row + chunk.offset[0], *chunk.offset[1:])
            self.dataset.id.write_direct_chunk(offset, chunk.data, chunk.filter_mask)
            self.stored.append(
                (self, offset, chunk.sha256 or hashlib.sha256(chunk.data).hexdigest())
            )

    def close(self) -> None:
        """Free the scratch dataset of the re-cut blocks (the file itself is the sink's)."""
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None

    def chunk_record(
        self, offset: tuple[int, ...], sha256: str, place: tuple[int, int, int] | None = None
    ) -> dict[str, Any]:
        """Where a stored chunk sits in the file, for the resume journal (after its write);
        ``place`` (filter mask, byte offset, size) as ``chunk_places`` found it."""
        if place is None:
            place = chunk_places(self.dataset, {offset})[offset]
        filter_mask, byte_offset, size = place
        return {
            "dataset": self.dataset.name,
            "offset": list(offset),
            "filter_mask": filter_mask,
            "byte_offset": byte_offset,
            "size": size,
            "sha256": sha256,
        }

    def block_delta(self) -> list[str]:
        """The block digests stored since the last call, for the resume journal."""
        blocks = [b.hex() for b in self.unjournaled_blocks]
        self.unjournaled_blocks = []
        return blocks


def chunk_places(
    dataset: h5py.Dataset, wanted: set[tuple[int, ...]]
) -> dict[tuple[int, ...], tuple[int, int, int]]:
    """(filter mask, byte offset, size) of each chunk of ``dataset`` at ``wanted`` offsets.

    One pass over the chunk index (``H5Dchunk_iter``) when many are asked for: a lookup by
    coordinates costs about a millisecond each (HDF5 2.0), which made the writer's journal
    the bottleneck of a volume build (16 tiles a slice; 6,400 chunks: 7 s by coordinates,
    0.03 s in one pass). Lookups by coordinates for a few, or where the pass is missing.
    """
    places: dict[tuple[int, ...], tuple[int, int, int]] = {}
    if len(wanted) > 64 and hasattr(dataset.id, "chunk_iter"):

        def visit(info: Any) -> None:
            offset = tuple(int(v) for v in info.chunk_offset)
            if offset in wanted:
                places[offset] = (int(info.filter_mask), int(info.byte_offset), int(info.size))

        dataset.id.chunk_iter(visit)
    for offset in wanted - places.keys():
        info = dataset.id.get_chunk_info_by_coord(offset)
        places[offset] = (int(info.filter_mask), int(info.byte_offset), int(info.size))
    return places
