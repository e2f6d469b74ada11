"""parent_rows: the sink's copying of a parent release's rows into the file it writes.

Part of the sink (the only code that writes HDF5): for an incremental build, each carried
block's chunks are copied byte for byte (``chunk_copy.copy_rows``, the one mechanism a stitch
uses too) with the block digests the parent recorded, and its text, scalar and lineage rows
are read as values for the small rows' writer. A ragged column's blocks are the value rows of
the carried samples: whole chunks are copied where the parent's chunk grid and the new file's
line up, the value rows around them re-cut from the parent's stored values; its offsets are
rebased to where the values land. Reading the parent happens here too, so one module owns
the copy.

A split's first run of carried rows can instead come with its array datasets (``Seed``):
when the sink creates them, each is HDF5's own copy of the parent's (``H5Ocopy``, one call:
the raw chunks with their filter masks, never decoded), cut to the run's rows. A chunk loop
in Python hands the GIL back and forth twice per chunk, and while this process decodes a
small increment in its threads (``local_threads``) every hand-back waited for a
decoder: 170 MiB took 0.25-0.33 s so, 0.08-0.12 s as one object copy, which runs without the GIL
(``object_copy``): the decoders go on meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5etl.format import contract as fileformat
from h5etl.format.codec import ChunkLayout
from h5etl.kinds.columns import ArrayColumn, ScalarColumn
from h5etl.sink.array_writer import ArrayWriter
from h5etl.sink.chunk_copy import copy_rows
from h5etl.sink.object_copy import copy_object
from h5etl.sink.small_columns import SinkLayout

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class Seed:
    """The parent release whose first rows of each split (``rows``: split -> rows) a new
    file's array datasets are created as copies of (``seed_dataset``)."""

    parent: Path
    rows: Mapping[str, int]
    skip: frozenset[str] = frozenset()  # array columns made again, not copied (``redo``)


def open_seed(seed: Seed | None) -> h5py.File | None:
    """The seed's parent, open to read (None: no seed, or it cannot be opened: the datasets
    are created empty and the carry, reading the parent again, says what is wrong)."""
    if seed is None or not any(seed.rows.values()):
        return None
    try:
        return h5py.File(seed.parent, "r")
    except OSError as exc:
        logger.info("cannot open %s to copy its datasets (%s): copying chunks", seed.parent, exc)
        return None


def _filter_ids(plist: Any) -> list[int]:
    return [int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters())]


def _stored_as(node: h5py.Dataset, chunked: ChunkLayout) -> bool:
    """Whether ``node`` stores its rows as a dataset the sink creates for ``chunked`` would:
    dtype, row shape, chunks, unlimited rows, the same filters in the same order."""
    if (node.dtype, node.shape[1:], node.chunks) != (
        np.dtype(chunked.dtype),
        chunked.shape,
        chunked.chunks,
    ) or node.maxshape != (None, *chunked.shape):
        return False
    kwargs = chunked.filter_kwargs()
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    try:
        h5py.filters.fill_dcpl(
            plist, (0, *chunked.shape), node.dtype, chunked.chunks,
            kwargs.get("compression"), kwargs.get("compression_opts"), kwargs.get("shuffle"),
            None, (None, *chunked.shape), None, None,
        )  # fmt: skip
    except (ValueError, TypeError):  # a filter h5py cannot set here: copy chunk by chunk
        return False
    return _filter_ids(plist) == _filter_ids(node.id.get_create_plist())


def seed_dataset(
    file: h5py.File, source: h5py.File, path: str, rows: int, chunked: ChunkLayout
) -> h5py.Dataset | None:
    """Create the dataset at ``path`` as HDF5's copy of the parent's (its chunks as they are
    stored, without its attributes), cut to its first ``rows`` rows, which must end on a
    chunk row or at its end (no chunk is rewritten); None, and nothing created, when the
    parent's dataset is not stored as the sink would store ``chunked`` (``_stored_as``)."""
    node = source.get(path)
    if not isinstance(node, h5py.Dataset) or len(node) < rows or not _stored_as(node, chunked):
        return None
    assert rows == len(node) or not rows % chunked.rows, "a seed ends on a chunk row"
    group, name = path.rsplit("/", 1) if "/" in path else ("", path)
    if group and group not in file:
        file.create_group(group, track_order=True, track_times=False)
    copy_object(node, file[group or "/"], name, without_attrs=True)  # the decoders go on
    dataset: h5py.Dataset = file[path]
    dataset.resize(rows, axis=0)  # the chunks past it are dropped whole
    return dataset


def copy_parent_columns(
    source: h5py.File,
    layout: SinkLayout,
    writers: Mapping[tuple[str, str], ArrayWriter],
    split: str,
    spans: Spans,
    between: Callable[[], None] = lambda: None,
    seeded: Mapping[str, int] | None = None,
    skip: frozenset[str] = frozenset(),
) -> tuple[int, dict[str, list[int]]]:
    """Append the spans' rows of every array and ragged column of ``split``; return the
    stored bytes copied and each ragged column's offsets rows (its samples' ends, rebased).
    ``between``: called after each piece of ``PIECE_ROWS`` rows of a fixed array (the same
    chunks in the same order as in one go: pieces start and end on chunk rows).
    ``seeded``: array columns (by name) whose dataset holds the first run's rows already
    (``seed_dataset``): they are counted, with the parent's block digests, not copied.
    ``skip``: array columns not copied (an incremental build makes them again)."""
    nodes = source[fileformat.DIAGNOSTICS_DATASETS]
    copied = 0
    ends: dict[str, list[int]] = {}
    for (target, name), writer in writers.items():
        if target != split or name in skip:
            continue
        path = layout.path(split, name)
        recorded = nodes[fileformat.diagnostics_node(path)][fileformat.BLOCK_DIGESTS][...]
        blocks = [bytes.fromhex(d.decode()) for d in recorded]
        values = source[path]
        if isinstance(layout.columns[name], ArrayColumn):
            piece = PIECE_ROWS // writer.layout.rows * writer.layout.rows or writer.layout.rows
            todo = runs(spans)
            done = (seeded or {}).get(name, 0)
            if done:
                assert todo[0] == (0, done), "a seeded dataset holds the first run's rows"
                writer.adopt(done, blocks[: -(-done // writer.layout.rows)], [])
                copied += writer.dataset.id.get_storage_size()
                between()
                todo = todo[1:]
            for start, rows in todo:
                for first in range(start, start + rows, piece):
                    last = min(first + piece, start + rows)
                    copied += copy_rows(writer, values, first, last, blocks, edge=True)
                    between()
            continue
        offsets = np.asarray(source[layout.offsets_path(split, name)][...], dtype=np.int64)
        base = writer.rows + writer.partial_rows
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
    """The small columns' rows (but the sample keys) and the lineage of the spans
    (its stored S64 digests, as they are). Read a run of adjacent spans at a time: one read
    of each column, not one per block (0.04 s of 0.5 for 3,000 carried rows)."""
    joined = runs(spans)
    small: dict[str, list[Any]] = {}
    for name in layout.small:
        if name in fileformat.SAMPLE_KEYS:
            continue  # this build's own record of the samples, given by the caller
        dataset = source[layout.path(split, name)]
        view = dataset if isinstance(layout.columns[name], ScalarColumn) else dataset.asstr()
        small[name] = [v for start, rows in joined for v in view[start : start + rows].tolist()]
    lineage = source[layout.path(split, fileformat.LINEAGE)]
    parts = [lineage[start : start + count] for start, count in joined]
    rows = np.concatenate(parts) if parts else np.zeros((0, lineage.shape[1]), "S64")
    return small, rows
