"""sink_copy: carry stored chunks from another HDF5 file into the sink, never re-encoded.

Part of the sink (the only code that writes HDF5). ``carry_chunks`` reads each stored chunk of
a source dataset with ``read_direct_chunk``, checks its bytes against the SHA-256 its writer
recorded, and stores it with ``write_direct_chunk`` at a row offset of the target: the chunks
of a sharded build's shards into the release (the stitch), or, for any build, the chunks of
another file whose rows it keeps. ``carry_shard`` carries a whole shard: every array column
by chunks, the small columns (texts, scalars, lineage) by rows, each checked against the
digests the shard recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from h5etl import digest, fileformat
from h5etl.errors import ShardError
from h5etl.kinds.base import ScalarColumn
from h5etl.sink_virtual import add_part

if TYPE_CHECKING:
    from h5etl.sink import Sink

__all__ = ["Carried", "carry_chunks", "carry_shard", "same_storage", "verify_chunks"]

ChunkDigests = Mapping[tuple[int, ...], str]  # chunk offset -> SHA-256 (hex) of its bytes


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
    expected: ChunkDigests | None = None,
) -> Carried:
    """Store every chunk of ``source`` in ``target``, ``row_offset`` rows down, as it is.

    ``target`` grows to hold the source's rows after ``row_offset``, which must start a chunk.
    Chunks go in C order of their offsets, so the same inputs write the same bytes.

    Raises:
        ValueError: the datasets store chunks differently, or a chunk's bytes do not match
            ``expected`` (or it has no entry there).
    """
    problem = same_storage(source, target)
    if problem is not None:
        raise ValueError(f"cannot carry the chunks of {source.name}: {problem}")
    rows = target.chunks[0]
    if row_offset % rows:
        raise ValueError(f"row {row_offset} does not start a chunk of {rows} rows")
    if target.shape[0] < row_offset + source.shape[0]:
        target.resize(row_offset + source.shape[0], axis=0)
    dataset_id = source.id
    offsets = sorted(
        tuple(dataset_id.get_chunk_info(i).chunk_offset) for i in range(dataset_id.get_num_chunks())
    )
    carried, stored = [], 0
    for offset in offsets:
        mask, data = dataset_id.read_direct_chunk(offset)
        sha = hashlib.sha256(data).hexdigest()
        if expected is not None and expected.get(offset) != sha:
            raise ValueError(f"chunk {list(offset)} of {source.name} does not match its digest")
        moved = (offset[0] + row_offset, *offset[1:])
        target.id.write_direct_chunk(moved, data, mask)
        carried.append((moved, sha))
        stored += len(data)
    return Carried(carried, stored)


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


def verify_chunks(source: h5py.Dataset, expected: ChunkDigests) -> int:
    """Read every stored chunk of ``source`` and check it against ``expected``; return the
    bytes stored (a virtual release maps its parts without copying, but not unread).

    Raises:
        ValueError: a chunk's bytes do not match, or a recorded chunk is not there.
    """
    dataset_id, stored, seen = source.id, 0, 0
    for index in range(dataset_id.get_num_chunks()):
        offset = tuple(dataset_id.get_chunk_info(index).chunk_offset)
        _, data = dataset_id.read_direct_chunk(offset)
        if expected.get(offset) != hashlib.sha256(data).hexdigest():
            raise ValueError(f"chunk {list(offset)} of {source.name} does not match its digest")
        stored, seen = stored + len(data), seen + 1
    if seen != len(expected):
        raise ValueError(f"{source.name} holds {seen} chunks, its manifest {len(expected)}")
    return stored


def carry_shard(
    sink: Sink,
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
                if part is None:
                    stored += _carry_split(sink, handle, split, count, chunks)
                else:
                    stored += _map_split(sink, handle, split, count, chunks, part)
                _carry_small(sink, handle, split, count)
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


def _carry_split(
    sink: Sink, handle: h5py.File, split: str, rows: int, chunks: Mapping[str, ChunkDigests]
) -> int:
    stored = 0
    for (target, name), writer in sink.images.items():
        if target != split:
            continue
        path = sink.layout.path(split, name)
        blocks = _checked_blocks(handle, path, rows, writer.layout.rows)
        carried = carry_chunks(
            handle[path], writer.dataset, row_offset=writer.rows, expected=chunks.get(path, {})
        )
        writer.adopt(rows, blocks, carried.chunks)
        stored += carried.stored_bytes
    return stored


def _map_split(
    sink: Sink,
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


def _carry_small(sink: Sink, handle: h5py.File, split: str, rows: int) -> None:
    """The small columns' rows and the lineage, checked against their stream digests."""
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
    lineage = handle[lineage_path][...]
    _check_digest(lineage.tobytes(), recorded_blocks(handle, lineage_path)[0], lineage_path)
    if rows:
        sink.append_rows(split, small, [[h.decode() for h in row] for row in lineage])
