"""Dataset digests that workers can compute in parallel and ``check --deep`` can recompute.

A dataset's digest is SHA-256 over the SHA-256 of each block of rows (one block per chunk of
the sample axis), in sample order. Each block hash covers the uncompressed C-order bytes of
those rows; text rows are hashed as length-prefixed UTF-8. The block list pinpoints damage.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

import numpy as np


def block_digest(rows: np.ndarray) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(rows).data).digest()


def text_rows_bytes(rows: Iterable[str | bytes]) -> bytes:
    """Rows as length-prefixed UTF-8, so that no choice of separator can make two lists equal."""
    parts = []
    for row in rows:
        data = row.encode("utf-8") if isinstance(row, str) else bytes(row)
        parts.append(struct.pack("<Q", len(data)))
        parts.append(data)
    return b"".join(parts)


def text_block_digest(rows: Iterable[str | bytes]) -> bytes:
    return hashlib.sha256(text_rows_bytes(rows)).digest()


def combine(blocks: Sequence[bytes]) -> str:
    """The dataset digest (hex) from its block digests, in order."""
    return hashlib.sha256(b"".join(blocks)).hexdigest()


def array_digest(data: np.ndarray, block_rows: int) -> tuple[str, list[bytes]]:
    """Digest of a whole in-memory dataset, for checks and tests."""
    blocks = [block_digest(data[i : i + block_rows]) for i in range(0, len(data), block_rows)]
    return combine(blocks), blocks
