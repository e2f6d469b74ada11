"""deep: what ``check --deep`` recomputes of a release: every dataset's SHA-256, block
by block as the sink hashed it, against the digests in ``/diagnostics``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from h5etl.format import digest, partfiles
from h5etl.format.contract import BLOCK_DIGESTS, NODE_BLOCK_ROWS, NODE_SHA256
from h5etl.units import human_size


@dataclass(slots=True)
class DeepTally:
    """What ``deep`` recomputed: datasets, blocks and uncompressed bytes hashed."""

    datasets: int = 0
    blocks: int = 0
    nbytes: int = 0
    differ: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        hashed = human_size(self.nbytes)
        done = f"deep: {self.datasets} datasets, {self.blocks} blocks, {hashed} hashed"
        if not self.differ and not self.unreadable:
            return f"{done}, all SHA-256 digests equal"
        if self.differ:
            done += (
                f", SHA-256 digests differ in {len(self.differ)} of {self.datasets}: "
                + ", ".join(self.differ)
            )
        if self.unreadable:
            done += f"; {len(self.unreadable)} unreadable: " + ", ".join(self.unreadable)
        return done


def _recompute(dataset: h5py.Dataset, info: dict[str, Any]) -> tuple[str, list[str], int]:
    """The dataset's digest, block digests and bytes hashed, recomputed from the stored data."""
    if dataset.dtype.kind == "O":
        texts = [r.decode("utf-8") if isinstance(r, bytes) else r for r in dataset[...]]
        data = digest.text_rows_bytes(texts)
        block = hashlib.sha256(data).digest()
        return digest.combine([block]), [block.hex()], len(data)
    if not info.get(NODE_BLOCK_ROWS):
        # the sink hashes these (lineage) as one stream: one block, even when empty
        array = np.ascontiguousarray(dataset[...])
        block = digest.block_digest(array)
        return digest.combine([block]), [block.hex()], array.nbytes
    step = int(info[NODE_BLOCK_ROWS])
    blocks, nbytes = [], 0
    for start in range(0, len(dataset), step):
        try:
            rows = np.ascontiguousarray(dataset[start : start + step])
        except OSError as exc:
            part = partfiles.part_of_row(dataset, start)
            held = f" (in part {part})" if part else ""
            raise OSError(f"rows {start}..{start + step - 1} unreadable{held}: {exc}") from exc
        blocks.append(digest.block_digest(rows))
        nbytes += rows.nbytes
    return digest.combine(blocks), [b.hex() for b in blocks], nbytes


def verify(dataset: h5py.Dataset, info: dict[str, Any], tally: DeepTally) -> str | None:
    """Recompute ``dataset``'s digests against its diagnostics node ``info``, counting in
    ``tally``; the problem found (unreadable rows, a digest mismatch and its first bad
    block), or None."""
    tally.datasets += 1
    try:
        sha, blocks, nbytes = _recompute(dataset, info)
    except OSError as exc:
        tally.unreadable.append(dataset.name)
        return f"{dataset.name}: {exc}"
    tally.blocks += len(blocks)
    tally.nbytes += nbytes
    stored = str(info[NODE_SHA256])
    if sha == stored:
        return None
    tally.differ.append(dataset.name)
    bad = [i for i, (a, b) in enumerate(zip(blocks, info[BLOCK_DIGESTS], strict=False)) if a != b]
    rows = int(info[NODE_BLOCK_ROWS])
    part = partfiles.part_of_row(dataset, bad[0] * rows) if bad else None
    held = f", in part {part}" if part else ""  # a virtual release: the part to look at
    where = f" (first bad block {bad[0]}, rows from {bad[0] * rows}{held})" if bad else ""
    return (
        f"{dataset.name}: SHA-256 mismatch{where}: stored {stored[:16]}..., computed {sha[:16]}..."
    )
