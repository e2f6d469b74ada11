"""sink_carry: the sink's copying of a parent release's rows into the file it writes.

Part of the sink (the only code that writes HDF5): for an incremental build, each carried
block's chunks are copied byte for byte (``ImageWriter.add_copied``) with the block digests
the parent recorded, and its text, scalar and lineage rows are read as values for the small
rows' writer. Reading the parent happens here too, so one module owns the copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import h5py

from h5etl import fileformat
from h5etl.kinds.base import ScalarColumn
from h5etl.sink_chunks import ImageWriter
from h5etl.sink_rows import SinkLayout

Spans = list[tuple[int, int]]  # (first row, rows) of each carried block, in the parent


def copy_chunks(
    source: h5py.File,
    layout: SinkLayout,
    writers: Mapping[tuple[str, str], ImageWriter],
    split: str,
    spans: Spans,
) -> int:
    """Append the spans' chunks of every array column of ``split``; return the bytes."""
    nodes = source[fileformat.DIAGNOSTICS_DATASETS]
    copied = 0
    for (target, name), writer in writers.items():
        if target != split:
            continue
        path = layout.path(split, name)
        digests = nodes[fileformat.diagnostics_node(path)][fileformat.BLOCK_DIGESTS]
        step = writer.layout.rows
        for start, rows in spans:
            found = digests[start // step : -(-(start + rows) // step)]
            sha = [bytes.fromhex(d.decode()) for d in found]
            copied += writer.add_copied(source[path], start, rows, sha)
    return copied


def parent_rows(
    source: h5py.File, layout: SinkLayout, split: str, spans: Spans
) -> tuple[dict[str, list[Any]], list[list[str]]]:
    """The small columns' rows (but the per-sample record) and the lineage of the spans."""
    small: dict[str, list[Any]] = {}
    for name in layout.small:
        if name in fileformat.SAMPLE_RECORD:
            continue  # this build's own record of the samples, given by the caller
        dataset = source[layout.path(split, name)]
        view = dataset if isinstance(layout.columns[name], ScalarColumn) else dataset.asstr()
        small[name] = [v for start, rows in spans for v in view[start : start + rows].tolist()]
    lineage = source[layout.path(split, fileformat.LINEAGE)]
    rows = [
        [digest.decode() for digest in row]
        for start, count in spans
        for row in lineage[start : start + count]
    ]
    return small, rows
