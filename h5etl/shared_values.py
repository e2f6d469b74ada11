"""shared_values: a local worker's big results reach the parent through shared memory.

A ragged column of many value rows per chunk comes back raw (the parent cuts its chunks), and
pickling it, piping it and unpickling it cost the build as much CPU as compressing it (0.7
CPU-s of the 120-recording series benchmark). Compressed chunks, the bulk of every other
result, went the same way: the pipe and unpickling were the single writer's largest cost
after the writes themselves (at 30,000 image pairs, 1.76 GB through loky's result pipe). A
local worker writes such an array, or a column's chunks one after another, to a file in
``/dev/shm`` (one copy, as pickling made) and sends its name; the parent maps it (no copy;
the chunks become views of the mapping that ``write_direct_chunk`` reads) and unlinks the
name at once, so the memory goes when the result does. Names carry the
parent's pid: what a cancelled or crashed build leaves is swept (``sweep``). Without
``/dev/shm`` (not Linux) the values travel pickled, as ever; a Dask worker never shares.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from h5etl.buildlock import pid_alive
from h5etl.records import BatchResult, EncodedChunk, EncodedRows, RaggedRows

SHM = Path("/dev/shm")
PREFIX = "h5etl-values"
MIN_BYTES = 1 << 20  # smaller arrays cost less pickled than a file


@dataclass(frozen=True, slots=True)
class SharedArray:
    """Where a worker left one column's values: a file name, their shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class SharedChunks:
    """Where a worker left one column's compressed chunks: a file name, each chunk's size in
    the order of ``EncodedRows.blocks`` (block by block, chunk by chunk)."""

    name: str
    sizes: tuple[int, ...]


def share(result: BatchResult, owner: int) -> BatchResult:
    """In a local worker: move every raw ragged values array of ``MIN_BYTES`` or more into a
    file of ``/dev/shm`` named for the parent ``owner`` (``result.shared``), leaving an empty
    array of its trailing shape in its place. Any error leaves the values where they are."""
    if not SHM.is_dir():
        return result
    for name, rows in result.columns.items():
        values = rows.values if isinstance(rows, RaggedRows) else rows
        if isinstance(values, EncodedRows):
            _share_chunks(result, name, values, owner)
            continue
        if not isinstance(values, np.ndarray) or values.nbytes < MIN_BYTES:
            continue
        path = SHM / f"{PREFIX}-{owner}-{uuid.uuid4().hex}"
        try:
            with open(path, "xb") as handle:
                handle.write(np.ascontiguousarray(values).data)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        assert isinstance(rows, RaggedRows)
        result.shared[name] = SharedArray(path.name, values.shape, values.dtype.str)
        rows.values = values[:0]
    return result


def _share_chunks(result: BatchResult, name: str, rows: EncodedRows, owner: int) -> None:
    """Move a column's compressed chunks into one file when they are ``MIN_BYTES`` or more,
    leaving chunks without bytes in their place; any error leaves them where they are."""
    chunks = [chunk for block in rows.blocks for chunk in block]
    if sum(len(chunk.data) for chunk in chunks) < MIN_BYTES:
        return
    path = SHM / f"{PREFIX}-{owner}-{uuid.uuid4().hex}"
    try:
        _write_all(path, [chunk.data for chunk in chunks])
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        return
    result.shared[name] = SharedChunks(path.name, tuple(len(chunk.data) for chunk in chunks))
    # (the constructor, not dataclasses.replace: 6x cheaper, for thousands of chunks a case)
    rows.blocks = [
        [EncodedChunk(c.offset, c.filter_mask, b"", c.sha256) for c in block]
        for block in rows.blocks
    ]


IOV_MAX = 1024  # buffers per writev (Linux's limit)


def _write_all(path: Path, buffers: Sequence[bytes | memoryview]) -> None:
    """Write ``buffers`` end to end to a new file, ``IOV_MAX`` to a system call: a CT case
    is thousands of chunks of a few KB, and a write each cost a third more (36 against
    27 ms for 3,200 chunks of 14 KB)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        pending: list[bytes | memoryview] = [b for b in buffers if len(b)]
        while pending:
            written = os.writev(fd, pending[:IOV_MAX])
            done = 0  # whole buffers written; a short write resumes inside the next
            while done < len(pending) and written >= len(pending[done]):
                written -= len(pending[done])
                done += 1
            pending = pending[done:]
            if written:
                pending[0] = memoryview(pending[0])[written:]
    finally:
        os.close(fd)


def attach(result: BatchResult) -> BatchResult:
    """In the parent: put the shared values back into their columns (read-only arrays, or
    chunks whose bytes are views, over the mapped files), unlinking each name at once."""
    for name, ref in result.shared.items():
        path = SHM / ref.name
        with open(path, "rb") as handle:
            # prefaulted in one call: a fault per page, as a fresh buffer takes, cost more
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(handle.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        path.unlink()
        rows = result.columns[name]
        if isinstance(ref, SharedChunks):
            encoded = rows.values if isinstance(rows, RaggedRows) else rows
            assert isinstance(encoded, EncodedRows)
            _attach_chunks(encoded, memoryview(mapped), ref.sizes)
            continue
        assert isinstance(rows, RaggedRows)
        rows.values = np.frombuffer(mapped, dtype=ref.dtype).reshape(ref.shape)
    result.shared = {}
    return result


def _attach_chunks(rows: EncodedRows, view: memoryview, sizes: tuple[int, ...]) -> None:
    """Give each chunk of ``rows`` its bytes back, as views of ``view`` in their order."""
    blocks, start, index = [], 0, 0
    for block in rows.blocks:
        placed = []
        for chunk in block:
            size = sizes[index]
            data = view[start : start + size]
            placed.append(EncodedChunk(chunk.offset, chunk.filter_mask, data, chunk.sha256))
            start, index = start + size, index + 1
        blocks.append(placed)
    rows.blocks = blocks


@contextlib.contextmanager
def swept(owner: int) -> Iterator[None]:
    """Around a build's task stream: what killed builds left is removed first, and what this
    one (``owner``) gave up after it (results of a build that stopped early)."""
    sweep()
    try:
        yield
    finally:
        sweep(owner)


def sweep(owner: int | None = None) -> None:
    """Remove what no parent will attach: ``owner``'s files (results given up: a build that
    stopped early), and those of parents that are gone (a killed build)."""
    if not SHM.is_dir():
        return
    for path in SHM.glob(f"{PREFIX}-*-*"):
        try:
            pid = int(path.name[len(PREFIX) + 1 :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == owner or not pid_alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()
