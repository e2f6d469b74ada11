"""sink_disk: the sink's side of the disk: room before a write, durable bytes handed back.

Part of the sink: no HDF5 here, plain file system calls, so ``sync_and_drop`` may run in
the checkpoint thread beside the writer.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

from h5etl.records import BatchResult, array_nbytes

# Room kept free for the metadata HDF5 writes at a flush or at the close: a flush that fails
# leaves HDF5 unable to close the file at all, so the sink stops before the disk is full.
HEADROOM_BYTES = 1 << 20
# Of what a sync made durable, the page cache keeps only the file's last this many bytes.
# Written pages otherwise stay cached until memory runs short, and on a VM every page the
# cache takes fresh costs a fault in the hypervisor: past ~400 MB written, the kernel's
# share of each write grew tenfold (1.76 GB: 3.5 CPU-s against 0.65 s with the cache
# handed back every 2 s). Dropping clean pages also keeps a big build from pushing the
# training job's data out of the cache.
CACHE_KEEP_BYTES = 128 << 20


def batch_nbytes(result: BatchResult) -> int:
    """An upper bound of the bytes a result adds to the file (its chunks as they come, its
    raw rows uncompressed, texts at 4 bytes a character)."""
    texts = sum(
        4 * len(text) + 16
        for rows in result.columns.values()
        if isinstance(rows, list)
        for text in rows
    )
    return array_nbytes(result) + texts + sum(64 * len(row) for row in result.lineage)


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def no_room(path: Path, nbytes: int) -> tuple[OSError, str] | None:
    """Why ``nbytes`` more (and ``HEADROOM_BYTES``) would not fit in the file at ``path``
    (a full disk, a file size limit), as the error and its detail; None when they fit or
    when the file system cannot say (the write itself will)."""
    need = nbytes + HEADROOM_BYTES
    try:
        stat = os.statvfs(path.parent)
        size = os.path.getsize(path)
    except OSError:
        return None
    # root may use the blocks ext4 reserves; everyone else only the available ones
    free = (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if free < need:
        code, detail = errno.ENOSPC, f"{mib(free)} free, about {mib(need)} needed"
    elif limit != resource.RLIM_INFINITY and size + need > limit:
        code, detail = errno.EFBIG, f"the limit is {mib(limit)}"
    else:
        return None
    return OSError(code, os.strerror(code)), detail


def sync_and_drop(path: Path) -> None:
    """fsync the file, then let the page cache drop what is durable but its last
    ``CACHE_KEEP_BYTES`` (advice only: the file is the same byte for byte).

    Raises:
        OSError: the file cannot be opened or synced.
    """
    with open(path, "rb") as handle:
        durable = os.fstat(handle.fileno()).st_size  # every byte below: written
        os.fsync(handle.fileno())
        if durable > CACHE_KEEP_BYTES and hasattr(os, "posix_fadvise"):
            length = durable - CACHE_KEEP_BYTES
            os.posix_fadvise(handle.fileno(), 0, length, os.POSIX_FADV_DONTNEED)
