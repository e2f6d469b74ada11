"""chunk_copy: carry stored chunks from another HDF5 file into the sink, never re-encoded.

Part of the sink (the only code that writes HDF5). ``carry_chunks`` reads stored chunks of a
source dataset with ``read_direct_chunk`` (checking their bytes against the SHA-256 their
writer recorded, when given) and stores them with ``write_direct_chunk`` at a row offset of
the target. ``copy_rows`` is the one way rows move between files, for fixed arrays and
ragged values alike: an incremental build's carried blocks (``parent_rows``) and a sharded
build's stitch (``carry_shard``: every array and ragged column by chunks, ragged offsets
rebased, the small columns by rows, each checked against the digests the shard recorded).
Whole chunks are copied where the chunk grids line up; the value rows around them (a ragged
column's values start anywhere in a chunk) are read back and re-cut by the writer.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from h5etl.errors import ShardError
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.kinds.columns import ArrayColumn, ScalarColumn
from h5etl.sink.array_writer import ArrayWriter, DatasetStats
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.virtual import VirtualColumn, add_part


class CopyTarget(Protocol):
    """What a copy needs of the writer (``h5etl.sink.writer.Sink`` is one): its layout and
    columns, and taking small rows. A protocol, so this module does not import the writer
    that imports it (through ``parent_rows``)."""

    @property
    def layout(self) -> SinkLayout: ...
    @property
    def virtual(self) -> dict[tuple[str, str], VirtualColumn] | None: ...
    @property
    def arrays(self) -> dict[tuple[str, str], ArrayWriter]: ...
    @property
    def stats(self) -> dict[str, DatasetStats]: ...
    def append_rows(
        self, split: str, small: dict[str, list[Any]], lineage: list[list[str]]
    ) -> None: ...


__all__ = ["Carried", "carry_chunks", "carry_shard", "copy_rows", "same_storage", "verify_chunks"]

ChunkDigests = Mapping[tuple[int, ...], str]  # chunk offset -> SHA-256 (hex) of its bytes
RECUT_BYTES = 16 << 20  # rows read back at a time to be re-cut (a few chunks of a CT case)


@dataclass(frozen=True, slots=True)
class Carried:
    """What ``carry_chunks`` stored: (offset in the target, SHA-256 hex) per chunk, in order."""

    chunks: list[tuple[tuple[int, ...], str]]
    stored_bytes: int


def same_storage(source: h5py.Dataset, target: h5py.Dataset) -> str | None:
    """Why the chunks of ``source`` cannot be stored as they are in ``target``, or None."""
    for what in ("dtype", "chunks", "compression", "compression_opts", "shuffle"):
        mine, theirs = getattr(source, what), getattr(target, what)
        if mine != theirs:
            return f"{what} {mine} differs from {theirs}"
    if source.shape[1:] != target.shape[1:]:
        return f"rows of shape {source.shape[1:]} differ from {target.shape[1:]}"
    if source.id.get_create_plist().get_nfilters() != target.id.get_create_plist().get_nfilters():
        return "the filter pipelines differ"
    return None


def carry_chunks(
    source: h5py.Dataset,
    target: h5py.Dataset,
    *,
    row_offset: int,
    start: int = 0,
    stop: int | None = None,
    expected: ChunkDigests | None = None,
    hashed: bool = True,
) -> Carried:
    """Store the chunks of rows ``start:stop`` of ``source`` in ``target``, as they are,
    ``row_offset`` rows down (``read_direct_chunk`` -> ``write_direct_chunk``: the filter mask
    travels with the bytes, so every codec stays intact and nothing is decoded).

    The rows must be whole chunks (the source's last, edge chunk counting as whole) and
    ``row_offset`` must start one; ``target`` grows to hold them. Chunks go in C order of
    their offsets, so the same inputs write the same bytes. ``hashed``: the SHA-256 of each
    chunk's bytes is computed (always with ``expected``), else recorded as "".

    Raises:
        ValueError: the datasets store chunks differently, the rows are not whole chunks, or a
            chunk's bytes do not match ``expected`` (or it has no entry there).
    """
    problem = same_storage(source, target)
    if problem is not None:
        raise ValueError(f"cannot carry the chunks of {source.name}: {problem}")
    stop = len(source) if stop is None else stop
    rows = target.chunks[0]
    if row_offset % rows or start % rows:
        raise ValueError(f"row {row_offset if row_offset % rows else start} does not start a chunk")
    if stop % rows and stop != len(source):
        raise ValueError(f"row {stop} does not end a chunk of {source.name}")
    if target.shape[0] < row_offset + stop - start:
        target.resize(row_offset + stop - start, axis=0)
    hashed = hashed or expected is not None
    inner = list(
        itertools.product(
            *(range(0, n, c) for n, c in zip(source.shape[1:], source.chunks[1:], strict=True))
        )
    )
    carried, stored = [], 0
    for row in range(start, stop, rows):
        for tile in inner:
            offset = (row, *tile)
            mask, data = source.id.read_direct_chunk(offset)
            sha = hashlib.sha256(data).hexdigest() if hashed else ""
            if expected is not None and expected.get(offset) != sha:
                raise ValueError(f"chunk {list(offset)} of {source.name} does not match its digest")
            moved = (row - start + row_offset, *tile)
            target.id.write_direct_chunk(moved, data, mask)
            carried.append((moved, sha))
            stored += len(data)
    return Carried(carried, stored)


def copy_rows(
    writer: ArrayWriter,
    source: h5py.Dataset,
    start: int,
    stop: int,
    blocks: Sequence[bytes],
    *,
    expected: ChunkDigests | None = None,
    journal: bool = False,
    edge: bool = False,
) -> int:
    """Append rows ``start:stop`` of ``source`` to ``writer``'s dataset; return the stored bytes
    copied. The one way stored chunks move between files (a parent's into an incremental
    build, a shard's into its release), for fixed arrays and ragged values alike.

    Where the two chunk grids line up (the writer's next row and ``start`` sit at the same
    place in a chunk), every whole chunk of the range is copied byte for byte with its block
    digest from ``blocks`` (the source's, one per chunk row); the rows before the first and
    after the last whole chunk, or all of them where the grids do not line up (a ragged
    column's values start anywhere in a chunk), are read back (HDF5 decompresses them, no
    source file is read) and re-cut through the writer's carry, as decoded rows are.
    ``edge``: the source's last, partial chunk is copied as it is when the range ends there
    (a fixed array's split end: nothing follows it). ``expected``: the SHA-256 of each of the
    source's chunks, checked before its bytes are used; ``journal``: the copied chunks go to
    the resume journal (a stitch), else they stay out of it (an incremental build's journal
    is never resumed from: it names its parent).

    Raises:
        ValueError: the datasets store chunks differently, or a chunk does not match.
    """
    step = writer.layout.rows
    row, stored = start, 0
    aligned = (writer.rows + writer.partial_rows - start) % step == 0
    if edge and not aligned:  # a fixed array is only ever copied in whole chunk rows
        raise ValueError(
            f"rows {start}:{stop} of {source.name} would land mid-chunk in {writer.stats.path} "
            f"(its next row is {writer.rows + writer.partial_rows}, chunks of {step} rows)"
        )
    if aligned:
        head = min(stop, -(-start // step) * step)
        _recut(writer, source, start, head, expected)
        end = stop if edge and stop == len(source) else stop // step * step
        if end > head:
            carried = carry_chunks(
                source, writer.dataset, row_offset=writer.rows, start=head, stop=end,
                expected=expected, hashed=journal,
            )  # fmt: skip
            found = list(blocks[head // step : -(-end // step)])
            writer.adopt(end - head, found, carried.chunks if journal else [])
            stored, head = carried.stored_bytes, end
        row = head
    _recut(writer, source, row, stop, expected)
    return stored


def _recut(
    writer: ArrayWriter, source: h5py.Dataset, start: int, stop: int, expected: ChunkDigests | None
) -> None:
    """Rows ``start:stop`` of ``source`` read back and given to the writer as raw rows, a few
    chunks at a time (memory stays a few chunks); their chunks checked first if ``expected``."""
    if start >= stop:
        return
    step = writer.layout.rows
    if expected is not None:
        verify_chunks(source, expected, rows=(start // step * step, stop))
    slab = step * max(1, RECUT_BYTES // max(1, writer.layout.block_nbytes))
    for row in range(start, stop, slab):
        writer.add_raw(np.asarray(source[row : min(stop, row + slab)]))


def recorded_blocks(handle: h5py.File, path: str) -> tuple[list[bytes], str]:
    """The block digests and the dataset digest a release (or shard) recorded for ``path``."""
    node = handle[fileformat.DIAGNOSTICS_DATASETS][fileformat.diagnostics_node(path)]
    blocks = [bytes.fromhex(b.decode()) for b in node[fileformat.BLOCK_DIGESTS][...]]
    return blocks, str(node.attrs[fileformat.NODE_SHA256])


def _small_rows(dataset: h5py.Dataset, column: Any) -> tuple[list[Any], bytes]:
    """A small column's rows as the sink appends them, and the bytes its stream digest covers."""
    if isinstance(column, ScalarColumn):
        values = np.asarray(dataset[...], dtype=column.dtype)
        return values.tolist(), values.tobytes()
    texts = [str(t) for t in dataset.asstr()[...]]
    return texts, digest.text_rows_bytes(texts)


def verify_chunks(
    source: h5py.Dataset, expected: ChunkDigests, *, rows: tuple[int, int] | None = None
) -> int:
    """Read every stored chunk of ``source`` (of the chunk rows from ``rows[0]`` to
    ``rows[1]`` only, if given) and check it against ``expected``; return the bytes stored
    (a virtual release maps its parts without copying, but not unread).

    Raises:
        ValueError: a chunk's bytes do not match, or a recorded chunk is not there.
    """
    dataset_id, stored, seen = source.id, 0, 0
    first, last = rows if rows is not None else (0, len(source))
    wanted = {offset for offset in expected if first <= offset[0] < last}
    for index in range(dataset_id.get_num_chunks()):
        offset = tuple(dataset_id.get_chunk_info(index).chunk_offset)
        if not first <= offset[0] < last:
            continue
        _, data = dataset_id.read_direct_chunk(offset)
        if expected.get(offset) != hashlib.sha256(data).hexdigest():
            raise ValueError(f"chunk {list(offset)} of {source.name} does not match its digest")
        stored, seen = stored + len(data), seen + 1
    if seen != len(wanted):
        raise ValueError(f"{source.name} holds {seen} chunks, its manifest {len(wanted)}")
    return stored


def carry_shard(
    sink: CopyTarget,
    shard: Path,
    rows: Mapping[str, int],
    chunks: Mapping[str, ChunkDigests],
    *,
    part: str | None = None,
) -> int:
    """Append a shard's rows of every split to ``sink``, checked; return the stored bytes.

    ``rows`` is what the shard's manifest says it stored per split; ``chunks`` the SHA-256 of
    each chunk its workers compressed, by dataset path. With ``part`` (the name the shard is
    published under beside a virtual release), the array rows are mapped, not copied.

    Raises:
        ShardError: the shard does not hold what its manifest and digests say.
    """
    stored = 0
    try:
        with h5py.File(shard, "r") as handle:
            for split in sink.layout.splits:
                count = rows.get(split, 0)
                ends: dict[str, list[int]] = {}
                if part is None:
                    copied, ends = _carry_split(sink, handle, split, count, chunks)
                    stored += copied
                else:
                    stored += _map_split(sink, handle, split, count, chunks, part)
                _carry_small(sink, handle, split, count, ends)
    except ShardError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ShardError(f"cannot carry this shard: {exc}", path=shard) from exc
    return stored


def _check_digest(data: bytes, recorded: list[bytes], path: str) -> None:
    if [hashlib.sha256(data).digest()] != recorded:
        raise ValueError(f"the rows of {path} do not match their recorded digest")


def _checked_blocks(handle: h5py.File, path: str, rows: int, block_rows: int) -> list[bytes]:
    """A shard's array dataset: its rows and recorded block digests, checked to add up."""
    if len(handle[path]) != rows:
        raise ValueError(f"{path} holds {len(handle[path])} rows, not {rows}")
    blocks, sha = recorded_blocks(handle, path)
    if digest.combine(blocks) != sha or len(blocks) != -(-rows // block_rows):
        raise ValueError(f"the block digests of {path} do not add up")
    return blocks


def _checked_offsets(handle: h5py.File, path: str, rows: int) -> np.ndarray:
    """A shard's ragged offsets: ``rows`` + 1 of them, from 0, never falling, as recorded."""
    offsets = np.asarray(handle[path][...], dtype=np.int64)
    if len(offsets) != rows + 1:
        raise ValueError(f"{path} holds {len(offsets)} offsets, not {rows + 1} ({rows} rows)")
    if offsets[0] != 0:
        raise ValueError(f"{path} starts at {offsets[0]}, not 0")
    falling = np.flatnonzero(np.diff(offsets) < 0)
    if falling.size:
        row = int(falling[0])
        raise ValueError(f"{path} falls at row {row}: {offsets[row]} -> {offsets[row + 1]}")
    _check_digest(offsets.tobytes(), recorded_blocks(handle, path)[0], path)
    return offsets


def _carry_split(
    sink: CopyTarget, handle: h5py.File, split: str, rows: int, chunks: Mapping[str, ChunkDigests]
) -> tuple[int, dict[str, list[int]]]:
    """Carry a shard's array and ragged values of ``split``; return the stored bytes copied
    and each ragged column's offsets (ends) rebased to where its values landed."""
    stored = 0
    ends: dict[str, list[int]] = {}
    layout = sink.layout
    for (target, name), writer in sink.arrays.items():
        if target != split:
            continue
        path = layout.path(split, name)
        expected = chunks.get(path, {})
        count, fixed = rows, isinstance(layout.columns[name], ArrayColumn)
        if not fixed:  # ragged: its values, then its offsets rebased
            offsets = _checked_offsets(handle, layout.offsets_path(split, name), rows)
            count = int(offsets[-1])
            base = writer.rows + writer.partial_rows
            ends[name + fileformat.OFFSETS_SUFFIX] = (offsets[1:] + base).tolist()
        blocks = _checked_blocks(handle, path, count, writer.layout.rows)
        if handle[path].id.get_num_chunks() != len(expected):
            raise ValueError(f"{path} holds other chunks than its manifest names")
        stored += copy_rows(
            writer, handle[path], 0, count, blocks, expected=expected, journal=True, edge=fixed
        )
    return stored, ends


def _map_split(
    sink: CopyTarget,
    handle: h5py.File,
    split: str,
    rows: int,
    chunks: Mapping[str, ChunkDigests],
    part: str,
) -> int:
    stored = 0
    for (target, name), column in (sink.virtual or {}).items():
        if target != split:
            continue
        path = sink.layout.path(split, name)
        blocks = _checked_blocks(handle, path, rows, column.layout.rows)
        nbytes = verify_chunks(handle[path], chunks.get(path, {}))
        add_part(column, sink.stats[path], part, rows, blocks, nbytes)
        stored += nbytes
    return stored


def _carry_small(
    sink: CopyTarget, handle: h5py.File, split: str, rows: int, ends: dict[str, list[int]]
) -> None:
    """The small columns' rows and the lineage, checked against their stream digests, with
    the ragged columns' rebased offsets (``ends``)."""
    layout = sink.layout
    lineage_path = layout.path(split, fileformat.LINEAGE)
    found = len(handle[lineage_path])
    if found != rows:
        raise ValueError(f"{split} holds {found} rows, its manifest says {rows}")
    small: dict[str, list[Any]] = {}
    for name in layout.small:
        path = layout.path(split, name)
        values, data = _small_rows(handle[path], layout.columns[name])
        _check_digest(data, recorded_blocks(handle, path)[0], path)
        small[name] = values
    small.update(ends)
    lineage = handle[lineage_path][...]
    _check_digest(lineage.tobytes(), recorded_blocks(handle, lineage_path)[0], lineage_path)
    if rows:
        sink.append_rows(split, small, [[h.decode() for h in row] for row in lineage])
