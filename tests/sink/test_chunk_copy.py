"""chunk_copy.copy_rows: the one way stored chunks move between files (incremental builds and
the stitch of a sharded build), for fixed arrays and ragged values at any place in a chunk.

Expectations: the rows as numpy concatenates them, block digests from ``digest.array_digest``
over those rows, and the source's stored chunk bytes (``read_direct_chunk``) wherever the
two chunk grids line up.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5etl.format import digest
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.sink.array_writer import ArrayWriter, DatasetStats
from h5etl.sink.chunk_copy import copy_rows

TRAILING = (4,)


def _writer(handle: h5py.File, name: str, rows: int, codec: str) -> ArrayWriter:
    level = 4 if codec == "gzip" else None
    layout = ChunkLayout(TRAILING, "int16", (rows, 2), Codec(codec, level, "lz4", "byte"), True)
    dataset = handle.create_dataset(
        name,
        shape=(0, *TRAILING),
        maxshape=(None, *TRAILING),
        dtype="int16",
        chunks=layout.chunks,
        **layout.filter_kwargs(),
    )
    return ArrayWriter(dataset, layout, DatasetStats(dataset.name, block_rows=rows))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 5),
    length=st.integers(0, 23),
    before=st.integers(0, 12),
    after=st.integers(0, 7),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    codec=st.sampled_from(["gzip", "lzf"]),
)
def test_any_range_lands_exactly_and_aligned_chunks_keep_their_bytes(
    tmp_path: Path,
    rows: int,
    length: int,
    before: int,
    after: int,
    cut: tuple[float, float],
    codec: str,
) -> None:
    rng = np.random.default_rng(length * 31 + before)
    source_rows = rng.integers(-500, 500, (length, *TRAILING), dtype=np.int16)
    start, stop = sorted(round(c * length) for c in cut)
    head = rng.integers(-9, 9, (before, *TRAILING), dtype=np.int16)
    tail = rng.integers(-9, 9, (after, *TRAILING), dtype=np.int16)
    path = tmp_path / f"copy-{rows}-{length}-{before}-{after}-{start}-{stop}-{codec}.h5"
    with h5py.File(path, "w") as handle:
        source = _writer(handle, "source", rows, codec)
        source.add_raw(source_rows)
        source.finish()
        target = _writer(handle, "target", rows, codec)
        target.add_raw(head)
        copied = copy_rows(target, source.dataset, start, stop, source.stats.blocks)
        target.add_raw(tail)
        target.finish()
        expected = np.concatenate([head, source_rows[start:stop], tail])
        np.testing.assert_array_equal(target.dataset[...], expected)
        assert target.stats.blocks == digest.array_digest(expected, rows)[1]
        lined_up = (before - start) % rows == 0
        whole = range(-(-start // rows) * rows, stop // rows * rows, rows)
        assert (copied > 0) == (lined_up and len(whole) > 0)
        if lined_up:
            for row in whole:  # the source's chunk, stored where it lands
                for tile in (0, 2):
                    there = source.dataset.id.read_direct_chunk((row, tile))
                    here = target.dataset.id.read_direct_chunk((row - start + before, tile))
                    assert here == there
        source.close()
        target.close()


def test_a_chunk_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "x.h5", "w") as handle:
        source = _writer(handle, "source", 2, "gzip")
        source.add_raw(np.arange(24, dtype=np.int16).reshape(6, 4))
        target = _writer(handle, "target", 2, "gzip")
        wrong: dict[tuple[int, ...], str] = {(r, t): "0" * 64 for r in (0, 2, 4) for t in (0, 2)}
        with pytest.raises(ValueError, match="does not match its digest"):
            copy_rows(target, source.dataset, 0, 6, source.stats.blocks, expected=wrong)
        with pytest.raises(ValueError, match="does not match its digest"):  # re-cut: checked too
            copy_rows(target, source.dataset, 1, 6, source.stats.blocks, expected=wrong)
        other = handle.create_dataset(
            "lzf", shape=(0, 4), maxshape=(None, 4), dtype="int16", chunks=(2, 2), compression="lzf"
        )
        lzf = ArrayWriter(other, target.layout, DatasetStats(other.name, block_rows=2))
        with pytest.raises(ValueError, match="compression"):
            copy_rows(lzf, source.dataset, 0, 6, source.stats.blocks)


def test_a_fixed_array_copied_mid_chunk_is_a_clear_error(tmp_path: Path) -> None:
    """Fixed arrays move in whole chunk rows only (``edge``): a range that would land
    mid-chunk is refused naming both datasets, before HDF5 fails on an unaligned write."""
    with h5py.File(tmp_path / "x.h5", "w") as handle:
        source = _writer(handle, "source", 2, "gzip")
        source.add_raw(np.arange(24, dtype=np.int16).reshape(6, 4))
        source.finish()
        target = _writer(handle, "target", 2, "gzip")
        with pytest.raises(ValueError, match=r"rows 1:6 of /source would land mid-chunk in"):
            copy_rows(target, source.dataset, 1, 6, source.stats.blocks, edge=True)
        assert copy_rows(target, source.dataset, 0, 6, source.stats.blocks, edge=True) > 0
        target.finish()
        np.testing.assert_array_equal(target.dataset[...], source.dataset[...])
        source.close()
        target.close()
