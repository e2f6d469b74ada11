"""ragged: what the resume journal keeps of a ragged column beyond its chunks (sink part).

A ragged column's values are stored like an array dataset's rows
(``h5etl.sink.array_writer.ArrayWriter``: whole chunks of value rows, compressed, written with
``write_direct_chunk``, a digest per block of chunk rows); its offsets are appended with the
small rows' runs (``h5etl.sink.small_columns``). Its partial chunk, the values after the last
whole chunk, almost never empties, so a checkpoint records it (``snapshot``) and a resume takes
it back (``restore_ragged``). The journal keeps it under its old name, ``carry`` (journals
already on disk still resume).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from typing import Any

import numpy as np

from h5etl.errors import ResumeMismatch
from h5etl.sink.array_writer import ArrayWriter

EMPTY = {"rows": 0, "carry_rows": 0, "carry": "", "carry_sha256": ""}


def snapshot(writer: ArrayWriter) -> dict[str, Any]:
    """The rows stored in whole chunks, and the partial chunk (fewer than a chunk of rows, not
    yet written) as zlib-compressed base64 with its SHA-256, so a resume continues mid-chunk."""
    partial = (
        np.concatenate(writer.partial)
        if writer.partial
        else np.empty((0, *writer.layout.shape), writer.layout.dtype)
    )
    data = np.ascontiguousarray(partial).tobytes()
    return {
        "rows": writer.rows,
        "carry_rows": len(partial),
        "carry": base64.b64encode(zlib.compress(data, 1)).decode("ascii"),
        "carry_sha256": hashlib.sha256(data).hexdigest(),
    }


def restore_ragged(writer: ArrayWriter, found: dict[str, Any], blocks: list[str], end: int) -> None:
    """Adopt a killed build's ragged values (their chunks copied already): rows, digests and
    the partial chunk, verified against the journal; ``end`` is where its offsets end.

    Raises:
        ResumeMismatch: the partial chunk is damaged, or with the rows does not reach ``end``.
    """
    path = writer.stats.path
    rows, count = int(found["rows"]), int(found["carry_rows"])
    try:
        data = zlib.decompress(base64.b64decode(found["carry"])) if count else b""
    except (ValueError, zlib.error) as exc:
        raise ResumeMismatch(f"the journal's partial chunk of {path} is damaged: {exc}") from exc
    if count and hashlib.sha256(data).hexdigest() != found["carry_sha256"]:
        raise ResumeMismatch(f"the journal's partial chunk of {path} does not match its SHA-256")
    if rows + count != end:
        raise ResumeMismatch(
            f"the journal's offsets of {path} end at {end}, not at its {rows} stored and "
            f"{count} rows of its partial chunk"
        )
    writer.restore(rows, blocks)
    partial = np.frombuffer(data, dtype=writer.layout.dtype).reshape(count, *writer.layout.shape)
    writer.partial, writer.partial_rows = ([partial.copy()] if count else []), count
