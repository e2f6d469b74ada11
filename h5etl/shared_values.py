"""shared_values: a local worker's raw ragged values reach the parent through shared memory.

A ragged column of many value rows per chunk comes back raw (the parent cuts its chunks), and
pickling it, piping it and unpickling it cost the build as much CPU as compressing it (0.7
CPU-s of the 120-recording series benchmark). A local worker writes such an array to a file
in ``/dev/shm`` (one copy, as pickling made) and sends its name; the parent maps it (no copy)
and unlinks the name at once, so the memory goes when the array does. Names carry the
parent's pid: what a cancelled or crashed build leaves is swept (``sweep``). Without
``/dev/shm`` (not Linux) the values travel pickled, as ever; a Dask worker never shares.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from h5etl.records import BatchResult, RaggedRows

SHM = Path("/dev/shm")
PREFIX = "h5etl-values"
MIN_BYTES = 1 << 20  # smaller arrays cost less pickled than a file


@dataclass(frozen=True, slots=True)
class SharedArray:
    """Where a worker left one column's values: a file name, their shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def share(result: BatchResult, owner: int) -> BatchResult:
    """In a local worker: move every raw ragged values array of ``MIN_BYTES`` or more into a
    file of ``/dev/shm`` named for the parent ``owner`` (``result.shared``), leaving an empty
    array of its trailing shape in its place. Any error leaves the values where they are."""
    if not SHM.is_dir():
        return result
    for name, rows in result.columns.items():
        values = rows.values if isinstance(rows, RaggedRows) else None
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


def attach(result: BatchResult) -> BatchResult:
    """In the parent: put the shared values back into their columns (read-only arrays over
    the mapped files), unlinking each name at once."""
    for name, ref in result.shared.items():
        path = SHM / ref.name
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        path.unlink()
        rows = result.columns[name]
        assert isinstance(rows, RaggedRows)
        rows.values = np.frombuffer(mapped, dtype=ref.dtype).reshape(ref.shape)
    result.shared = {}
    return result


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
        if pid == owner or not _alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
