"""compress_threads: compress and hash re-cut blocks in threads beside the single writer.

A ragged column's values land wherever the samples before them end, so they come to the sink
raw and the sink cuts them into whole chunks. Compressing and hashing those blocks is most of
what storing them costs; here it runs on threads (the codecs of ``chunkcodec.encode_direct``
and hashlib release the GIL), while the writer only waits for each block in order and stores
it. No thread touches HDF5: a layout without a direct codec call, or a block that does not
compress, is encoded by the writer itself, through HDF5 (``Encoded.chunks`` None).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from h5etl.dataflow import EncodedChunk
from h5etl.format import digest
from h5etl.format.codec import ChunkLayout, encode_direct, has_direct

MAX_THREADS = 4  # past the cores the decode workers leave, threads only queue


@dataclass(frozen=True, slots=True)
class Encoded:
    """One block: its stored chunks (None: for the writer to encode through HDF5), the
    digest of its real rows, and the (padded) rows themselves while they are to encode."""

    chunks: list[EncodedChunk] | None
    digest: bytes
    rows: np.ndarray | None


def encode(layout: ChunkLayout, block: np.ndarray, count: int) -> Encoded:
    """Compress one whole block (``count`` real rows, the rest padding) and hash its rows."""
    return Encoded(encode_direct(layout, block), digest.block_digest(block[:count]), block)


class ChunkPool:
    """The threads a sink's writers share; made on first use, shut down with the sink."""

    def __init__(self, threads: int | None = None):
        self.threads = threads or max(1, min(MAX_THREADS, os.cpu_count() or 1))
        self._executor: ThreadPoolExecutor | None = None

    def submit(self, layout: ChunkLayout, block: np.ndarray, count: int) -> Future[Encoded]:
        """Encode ``block`` on a thread when its layout has a direct codec call, else here
        at once (hashed only: the writer encodes it through HDF5)."""
        if not has_direct(layout):
            done: Future[Encoded] = Future()
            done.set_result(Encoded(None, digest.block_digest(block[:count]), block))
            return done
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="h5etl-chunks")
        return self._executor.submit(encode, layout, block, count)

    def close(self) -> None:
        """Stop the threads; blocks still queued (a failed write) are dropped."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
