"""sink_carry: the sink's copying of a parent release's rows into the file it writes.

Part of the sink (the only code that writes HDF5): for an incremental build, each carried
block's chunks are copied byte for byte (``sink_copy.copy_rows``, the one mechanism a stitch
uses too) with the block digests the parent recorded, and its text, scalar and lineage rows
are read as values for the small rows' writer. A ragged column's blocks are the value rows of
the carried samples: whole chunks are copied where the parent's chunk grid and the new file's
line up, the value rows around them re-cut from the parent's stored values; its offsets are
rebased to where the values land. Reading the parent happens here too, so one module owns
the copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import h5py
import numpy as np

from h5etl import fileformat
from h5etl.kinds.base import ArrayColumn, ScalarColumn
from h5etl.sink_chunks import ImageWriter
from h5etl.sink_copy import copy_rows
from h5etl.sink_rows import SinkLayout

Spans = list[tuple[int, int]]  # (first row, rows) of each carried block, in the parent
# A fixed array's run is copied this many rows at a time, ``between`` called after each: an
# incremental build fsyncs what it copied meanwhile and hands the page cache back, as the
# writer does every checkpoint (1.8 GB copied in one go: the kernel's writeback throttled it).
PIECE_ROWS = 1024


def runs(spans: Spans) -> Spans:
    """The spans with each set of adjacent ones joined: (first row, rows) per run."""
    out: Spans = []
    for start, rows in spans:
        if out and sum(out[-1]) == start:
            out[-1] = (out[-1][0], out[-1][1] + rows)
        else:
            out.append((start, rows))
    return out


def copy_parent_columns(
    source: h5py.File,
    layout: SinkLayout,
    writers: Mapping[tuple[str, str], ImageWriter],
    split: str,
    spans: Spans,
    between: Callable[[], None] = lambda: None,
) -> tuple[int, dict[str, list[int]]]:
    """Append the spans' rows of every array and ragged column of ``split``; return the
    stored bytes copied and each ragged column's offsets rows (its samples' ends, rebased).
    ``between``: called after each piece of ``PIECE_ROWS`` rows of a fixed array (the same
    chunks in the same order as in one go: pieces start and end on chunk rows)."""
    nodes = source[fileformat.DIAGNOSTICS_DATASETS]
    copied = 0
    ends: dict[str, list[int]] = {}
    for (target, name), writer in writers.items():
        if target != split:
            continue
        path = layout.path(split, name)
        recorded = nodes[fileformat.diagnostics_node(path)][fileformat.BLOCK_DIGESTS][...]
        blocks = [bytes.fromhex(d.decode()) for d in recorded]
        values = source[path]
        if isinstance(layout.columns[name], ArrayColumn):
            piece = PIECE_ROWS // writer.layout.rows * writer.layout.rows or writer.layout.rows
            for start, rows in runs(spans):
                for first in range(start, start + rows, piece):
                    last = min(first + piece, start + rows)
                    copied += copy_rows(writer, values, first, last, blocks, edge=True)
                    between()
            continue
        offsets = np.asarray(source[layout.offsets_path(split, name)][...], dtype=np.int64)
        base = writer.rows + writer.carry_rows
        lengths = []
        for start, rows in runs(spans):  # a run's chunks across its samples are copied too
            first, last = int(offsets[start]), int(offsets[start + rows])
            copied += copy_rows(writer, values, first, last, blocks)
            lengths.append(np.diff(offsets[start : start + rows + 1]))
        found = np.concatenate([np.zeros(0, np.int64), *lengths])
        ends[name + fileformat.OFFSETS_SUFFIX] = (base + np.cumsum(found)).tolist()
    return copied, ends


def parent_rows(
    source: h5py.File, layout: SinkLayout, split: str, spans: Spans
) -> tuple[dict[str, list[Any]], np.ndarray]:
    """The small columns' rows (but the per-sample record) and the lineage of the spans
    (its stored S64 digests, as they are). Read a run of adjacent spans at a time: one read
    of each column, not one per block (0.04 s of 0.5 for 3,000 carried rows)."""
    joined = runs(spans)
    small: dict[str, list[Any]] = {}
    for name in layout.small:
        if name in fileformat.SAMPLE_RECORD:
            continue  # this build's own record of the samples, given by the caller
        dataset = source[layout.path(split, name)]
        view = dataset if isinstance(layout.columns[name], ScalarColumn) else dataset.asstr()
        small[name] = [v for start, rows in joined for v in view[start : start + rows].tolist()]
    lineage = source[layout.path(split, fileformat.LINEAGE)]
    parts = [lineage[start : start + count] for start, count in joined]
    rows = np.concatenate(parts) if parts else np.zeros((0, lineage.shape[1]), "S64")
    return small, rows
