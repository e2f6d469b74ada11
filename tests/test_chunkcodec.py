"""chunkcodec: workers compress whole chunks exactly as HDF5 would store them."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from h5etl.chunkcodec import ChunkLayout, decode_block, encode_block
from h5etl.spec import Compression

CODECS = [
    pytest.param(Compression(codec="none"), False, id="none"),
    pytest.param(Compression(codec="lzf"), True, id="lzf-shuffle"),
    pytest.param(Compression(codec="gzip", level=1), True, id="gzip"),
    pytest.param(Compression(codec="zstd"), False, id="zstd"),
    pytest.param(Compression(codec="blosc", cname="lz4"), True, id="blosc"),
]


def _rows(layout: ChunkLayout, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # half noise, half flat, so compression has something to do
    rows = rng.integers(0, 256, (layout.rows, *layout.shape), dtype=np.uint8)
    rows[:, :, : layout.shape[1] // 2] = 7
    return rows


@pytest.mark.parametrize(("compression", "shuffle"), CODECS)
@pytest.mark.parametrize(
    "chunks",
    [pytest.param((4, 3, 8, 10), id="whole-sample"), pytest.param((2, 1, 3, 4), id="tiled")],
)
def test_encoded_chunks_read_back_through_hdf5(
    tmp_path: Path, compression: Compression, shuffle: bool, chunks: tuple[int, ...]
) -> None:
    layout = ChunkLayout((3, 8, 10), "uint8", chunks, compression, shuffle)
    first, second = _rows(layout, 1), _rows(layout, 2)
    np.testing.assert_array_equal(decode_block(layout, encode_block(layout, first)), first)
    with h5py.File(tmp_path / "x.h5", "w") as handle:
        dataset = handle.create_dataset(
            "d",
            shape=(2 * layout.rows, *layout.shape),
            dtype="uint8",
            chunks=layout.chunks,
            **layout.filter_kwargs(),
        )
        for block, rows in enumerate((first, second)):
            for chunk in encode_block(layout, rows):
                offset = (block * layout.rows + chunk.offset[0], *chunk.offset[1:])
                dataset.id.write_direct_chunk(offset, chunk.data, chunk.filter_mask)
    with h5py.File(tmp_path / "x.h5", "r") as handle:
        np.testing.assert_array_equal(handle["d"][...], np.concatenate([first, second]))


def test_chunk_offsets_tile_the_block() -> None:
    layout = ChunkLayout((3, 8, 10), "uint8", (2, 1, 3, 4), Compression(codec="none"), False)
    offsets = layout.chunk_offsets()
    assert len(offsets) == 3 * 3 * 3
    assert offsets[0] == (0, 0, 0, 0)
    assert offsets[-1] == (0, 2, 6, 8)
    assert layout.block_nbytes == 2 * 3 * 8 * 10


def test_filter_kwargs() -> None:
    gzip = ChunkLayout((1, 4, 4), "uint8", (1, 1, 4, 4), Compression(codec="gzip"), True)
    assert gzip.filter_kwargs() == {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    none = ChunkLayout((1, 4, 4), "uint8", (1, 1, 4, 4), Compression(codec="none"), True)
    assert none.filter_kwargs() == {}  # shuffle without compression is pointless


def test_wrong_block_shape_is_refused() -> None:
    layout = ChunkLayout((1, 4, 4), "uint8", (2, 1, 4, 4), Compression(codec="lzf"), True)
    with pytest.raises(ValueError, match="block shape"):
        encode_block(layout, np.zeros((1, 1, 4, 4), np.uint8))


@pytest.mark.parametrize(
    ("content", "expected_mask"),
    [
        pytest.param("smooth", 0, id="compressible-lzf-outside-hdf5"),
        pytest.param("noise", 0b10, id="incompressible-stored-raw-filter-skipped"),
    ],
)
def test_lzf_fast_path_reads_back_through_plain_h5py(
    tmp_path: Path, content: str, expected_mask: int
) -> None:
    layout = ChunkLayout((3, 16, 16), "uint8", (4, 3, 16, 16), Compression(codec="lzf"), True)
    rng = np.random.default_rng(3)
    if content == "smooth":
        rows = np.broadcast_to(np.arange(16, dtype=np.uint8), (4, 3, 16, 16)).copy()
    else:
        rows = rng.integers(0, 256, (4, 3, 16, 16), dtype=np.uint8)
    [chunk] = encode_block(layout, rows)
    assert chunk.filter_mask == expected_mask  # shuffle is filter 0, lzf filter 1
    path = tmp_path / "direct.h5"
    with h5py.File(path, "w") as handle:
        dataset = handle.create_dataset(
            "rows", shape=rows.shape, chunks=layout.chunks, dtype="uint8", **layout.filter_kwargs()
        )
        dataset.id.write_direct_chunk(chunk.offset, chunk.data, chunk.filter_mask)
    with h5py.File(path, "r") as handle:
        np.testing.assert_array_equal(handle["rows"][...], rows)
