"""codec: workers compress whole chunks exactly as HDF5 would store them."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from h5etl.config.sections import Compression
from h5etl.format import codec as chunkcodec
from h5etl.format.codec import ChunkLayout, decode_block, encode_block, encode_direct, has_direct

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


def _hdf5_chunk(layout: ChunkLayout, rows: np.ndarray) -> tuple[int, bytes]:
    """What HDF5's own filter pipeline stores for one block (an h5py dataset of the layout)."""
    with h5py.File("direct-reference", "w", driver="core", backing_store=False) as handle:
        dataset = handle.create_dataset(
            "d",
            shape=rows.shape,
            dtype=layout.dtype,
            chunks=layout.chunks,
            **layout.filter_kwargs(),
        )
        dataset[...] = rows
        mask, data = dataset.id.read_direct_chunk((0,) * rows.ndim)
    return int(mask), bytes(data)


DIRECT = [
    pytest.param(Compression(codec="none"), True, id="none"),
    pytest.param(Compression(codec="gzip", level=1), True, id="gzip-shuffle"),
    pytest.param(Compression(codec="gzip", level=0), False, id="gzip-level-0"),
    pytest.param(Compression(codec="zstd", level=5), True, id="zstd-shuffle"),
    pytest.param(Compression(codec="zstd"), False, id="zstd"),
    *(
        pytest.param(Compression(codec="blosc", cname=cname, blosc_shuffle=s), True, id=id_)
        for cname, s, id_ in [
            ("lz4", "byte", "blosc-lz4-byte"),
            ("zstd", "bit", "blosc-zstd-bit"),
            ("blosclz", "none", "blosc-blosclz"),
            ("lz4hc", "byte", "blosc-lz4hc"),
        ]
    ),
]


@pytest.mark.parametrize(("compression", "shuffle"), DIRECT)
@pytest.mark.parametrize(
    ("dtype", "shape", "rows"),
    [
        pytest.param("float32", (3,), 512, id="f4x3"),
        pytest.param("float64", (), 1000, id="f8"),
        pytest.param("int16", (2, 5), 7, id="i2"),
        pytest.param("uint8", (4,), 64, id="u1"),
    ],
)
@pytest.mark.parametrize("content", ["noise", "quantised", "zeros", "random-bytes"])
def test_direct_codec_calls_make_hdf5s_own_bytes(
    compression: Compression,
    shuffle: bool,
    dtype: str,
    shape: tuple[int, ...],
    rows: int,
    content: str,
) -> None:
    # the sink compresses ragged values on threads through these calls: the file must hold
    # what HDF5 itself would have stored, or the same inputs would make different files
    layout = ChunkLayout(shape, dtype, (rows, *shape), compression, shuffle)
    rng = np.random.default_rng(5)
    size = (rows, *shape)
    if content == "noise":
        block = (rng.normal(size=size) * 100).astype(dtype)
    elif content == "quantised":
        block = np.round(rng.normal(size=size) * 3).astype(dtype)
    elif content == "zeros":
        block = np.zeros(size, dtype)
    else:
        raw = rng.integers(0, 256, rows * layout.block_nbytes // rows, dtype=np.uint8)
        block = raw.view(dtype).reshape(size)
    assert has_direct(layout)
    mask, stored = _hdf5_chunk(layout, block)
    direct = encode_direct(layout, block)
    if direct is None:  # did not compress: left to HDF5, which stores it raw
        assert compression.codec != "none"
    else:
        [chunk] = direct
        assert (chunk.filter_mask, chunk.data) == (mask, stored)
    [chunk] = encode_block(layout, block)
    assert (chunk.filter_mask, chunk.data) == (mask, stored)


def test_no_direct_call_for_tiled_chunks_or_lzf_of_wide_elements() -> None:
    blosc = Compression(codec="blosc", cname="lz4")
    assert not has_direct(ChunkLayout((4, 6), "int16", (8, 2, 6), blosc, True))
    assert not has_direct(ChunkLayout((3,), "float32", (8, 3), Compression(codec="lzf"), True))
    rows = np.arange(48, dtype=np.int16).reshape(8, 1, 6).repeat(4, axis=1)
    layout = ChunkLayout((4, 6), "int16", (8, 2, 6), blosc, True)
    assert encode_direct(layout, rows) is None
    np.testing.assert_array_equal(decode_block(layout, encode_block(layout, rows)), rows)


def test_a_codec_call_that_disagrees_with_hdf5_leaves_hdf5_to_encode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a codec library built otherwise than HDF5's plugin (another blosc release, say)
    layout = ChunkLayout((3,), "float32", (256, 3), Compression(codec="gzip", level=9), True)
    monkeypatch.setattr(chunkcodec, "_codec_call", lambda layout: lambda data: b"other bytes")
    chunkcodec.has_direct.cache_clear()
    try:
        assert not has_direct(layout)
        rows = np.linspace(0, 1, 768, dtype=np.float32).reshape(256, 3)
        assert encode_direct(layout, rows) is None
        [chunk] = encode_block(layout, rows)
        assert (chunk.filter_mask, chunk.data) == _hdf5_chunk(layout, rows)
    finally:
        chunkcodec.has_direct.cache_clear()
