"""HDF5's own filter pipeline, run in memory, so workers can compress whole chunks.

``encode_block`` writes a block of rows into an in-memory HDF5 file (core driver, no backing
store) with exactly the dataset's chunking and filters, and reads each stored chunk back with
``read_direct_chunk``. The sink then stores those bytes with ``write_direct_chunk``: the file
holds what HDF5 itself would have written, for every filter h5py or hdf5plugin offers, and
nothing touches the disk here.

Where HDF5's pipeline for a block is one codec call (one chunk a block; blosc, gzip, zstd or no
filter), ``encode_direct`` makes that call itself: the bytes are the same (checked once per
process and layout against HDF5's own, ``has_direct``), it is faster, and it runs without the
GIL, so the sink can compress re-cut blocks in threads beside the writer (``compress_threads``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import imagecodecs
import numpy as np

from h5etl.dataflow import EncodedChunk
from h5etl.format import digest
from h5etl.format.destination import Destination, current

# h5py and hdf5plugin load where HDF5 runs (a scratch file, a dataset's filters): a worker
# whose every block ``encode_direct`` encodes never needs them (0.1 CPU-s a worker).
if TYPE_CHECKING:
    import h5py

_BLOSC_SHUFFLE = {"none": 0, "byte": 1, "bit": 2}
_BLOSC_MAX_TYPESIZE = 255
_SCRATCH_NAMES = itertools.count()


class CompressionLike(Protocol):
    """What a layout needs of a compression setting (``spec.Compression`` is one)."""

    @property
    def codec(self) -> str: ...
    @property
    def effective_level(self) -> int | None: ...
    @property
    def cname(self) -> str: ...
    @property
    def blosc_shuffle(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Codec:
    """A plain copy of a compression setting: workers unpickle it without importing pydantic."""

    codec: str
    effective_level: int | None
    cname: str
    blosc_shuffle: str

    @classmethod
    def of(cls, compression: CompressionLike) -> Codec:
        return cls(
            compression.codec,
            compression.effective_level,
            compression.cname,
            compression.blosc_shuffle,
        )


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """How one image dataset is stored: per-sample shape, dtype, chunks and filters."""

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    compression: CompressionLike
    shuffle: bool

    def __post_init__(self) -> None:
        if not isinstance(self.compression, Codec):
            object.__setattr__(self, "compression", Codec.of(self.compression))

    @property
    def rows(self) -> int:
        return self.chunks[0]

    def filter_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``create_dataset`` that set the filters."""
        import hdf5plugin  # registers the Blosc and Zstd filters with HDF5, too

        codec = self.compression.codec
        kwargs: dict[str, Any] = {}
        if codec == "lzf":
            kwargs["compression"] = "lzf"
        elif codec == "gzip":
            kwargs.update(compression="gzip", compression_opts=self.compression.effective_level)
        elif codec == "blosc":
            kwargs.update(
                hdf5plugin.Blosc(
                    cname=cast(Any, self.compression.cname),  # validated by spec.Compression
                    clevel=self.compression.effective_level or 0,
                    shuffle=_BLOSC_SHUFFLE[self.compression.blosc_shuffle],
                )
            )
        elif codec == "zstd":
            kwargs.update(hdf5plugin.Zstd(clevel=self.compression.effective_level or 3))
        # Blosc shuffles inside its own frame; HDF5's byte shuffle in front of it is wasted work.
        if self.shuffle and codec not in {"none", "blosc"}:
            kwargs["shuffle"] = True
        return kwargs

    def chunk_offsets(self) -> list[tuple[int, ...]]:
        """Offsets of the chunks that tile one block of ``rows`` samples, in C order."""
        grids = [
            range(0, size, chunk) for size, chunk in zip(self.shape, self.chunks[1:], strict=True)
        ]
        return [(0, *inner) for inner in itertools.product(*grids)]

    @property
    def block_nbytes(self) -> int:
        return self.rows * math.prod(self.shape) * np.dtype(self.dtype).itemsize


def _scratch(layout: ChunkLayout) -> tuple[h5py.File, h5py.Dataset]:
    import h5py

    # a name of its own: HDF5 refuses to create a core file under the name of an open one
    name = f"h5etl-scratch-{os.getpid()}-{next(_SCRATCH_NAMES)}"
    scratch = h5py.File(name, "w", driver="core", backing_store=False)
    dataset = scratch.create_dataset(
        "block",
        shape=(layout.rows, *layout.shape),
        dtype=layout.dtype,
        chunks=layout.chunks,
        **layout.filter_kwargs(),
    )
    return scratch, dataset


def _lzf_direct(
    layout: ChunkLayout, rows: np.ndarray, destination: Destination | None = None
) -> list[EncodedChunk] | None:
    """lzf without HDF5's filter pipeline, where the stored bytes are plain LZF of the rows.

    That holds for one chunk per block of a one-byte dtype (HDF5's shuffle of one-byte
    elements is the identity). imagecodecs' LZF encoder is about 3x faster than the filter
    h5py registers, and HDF5's lzf filter decodes its output.
    """
    if not _plain_lzf(layout):
        return None
    buffer = np.ascontiguousarray(rows).data  # any buffer works; the stubs say bytes
    # a room one byte short of the rows: LZF refuses what does not shrink
    room = destination.reserve(rows.nbytes - 1) if destination is not None else None
    stored: bytes | memoryview
    if destination is None or room is None:
        stored = bytes(imagecodecs.lzf_encode(buffer))  # type: ignore[arg-type]
        if len(stored) >= rows.nbytes:
            return None  # incompressible: let HDF5 store it raw and flag the filter as skipped
    else:
        try:
            stored = cast(
                memoryview, imagecodecs.lzf_encode(cast(bytes, buffer), out=cast(Any, room))
            )
        except imagecodecs.LzfError:
            return None  # incompressible, as above
        destination.commit(stored)
    offset = (0,) * (len(layout.shape) + 1)
    return [EncodedChunk(offset, 0, stored, hashlib.sha256(stored).hexdigest())]


def _plain_lzf(layout: ChunkLayout) -> bool:
    """Whether ``layout`` stores plain LZF of its rows (see ``_lzf_direct``)."""
    return (
        layout.compression.codec == "lzf"
        and np.dtype(layout.dtype).itemsize == 1
        and layout.chunks[1:] == layout.shape
    )


def _hdf5_shuffled(data: np.ndarray) -> np.ndarray:
    """HDF5's shuffle filter: byte j of every element, then byte j + 1 (the identity for
    one-byte elements)."""
    item = data.dtype.itemsize
    if item == 1:
        return data
    return np.ascontiguousarray(data.reshape(-1).view(np.uint8).reshape(-1, item).T)


def _codec_call(layout: ChunkLayout) -> Callable[..., bytes | memoryview] | None:
    """The one codec call HDF5's pipeline makes for a (C-contiguous) block of ``layout``, or
    None where it is more than one call (tiled chunks; lzf, which ``_lzf_direct`` handles).
    blosc's takes ``out``, a room to write into (``Destination.reserve``), and returns the part
    it wrote."""
    if layout.chunks[1:] != layout.shape:
        return None
    compression = layout.compression
    codec, level = compression.codec, compression.effective_level
    shuffle = layout.shuffle and codec != "blosc"  # as filter_kwargs sets it
    # any buffer works; the stubs of imagecodecs say bytes
    if codec == "none":
        return lambda data: data.tobytes()
    if codec == "blosc":
        item = np.dtype(layout.dtype).itemsize
        typesize = item if item <= _BLOSC_MAX_TYPESIZE else 1  # what the HDF5 filter passes
        code, cname = _BLOSC_SHUFFLE[compression.blosc_shuffle], compression.cname

        def blosc(data: np.ndarray, out: memoryview | None = None) -> bytes | memoryview:
            encoded = imagecodecs.blosc_encode(
                cast(bytes, data.data),
                level or 0,
                compressor=cname,
                shuffle=code,
                typesize=typesize,
                numthreads=1,
                out=cast(Any, out),
            )
            return cast(bytes | memoryview, encoded)  # a view of ``out``, if given

        return blosc
    if codec == "gzip":
        gzip_level = 4 if level is None else level  # h5py's default
        return lambda data: zlib.compress(
            (_hdf5_shuffled(data) if shuffle else data).data, gzip_level
        )
    if codec == "zstd":
        return lambda data: bytes(
            imagecodecs.zstd_encode(
                (_hdf5_shuffled(data) if shuffle else data).data,  # type: ignore[arg-type]
                level or 3,
            )
        )
    return None


def _probe_rows(layout: ChunkLayout) -> np.ndarray:
    """A block of ``layout`` that every codec compresses, the same in every process: runs of
    zeros (even a block of a hundred bytes compresses) and low-entropy bytes."""
    nbytes = layout.block_nbytes
    data = np.zeros(nbytes, np.uint8)
    data[: nbytes // 8] = np.random.default_rng(20260101).integers(0, 16, nbytes // 8, np.uint8)
    return data.view(layout.dtype).reshape(layout.rows, *layout.shape)


_BLOSC_MAX_OVERHEAD = 16  # blosc's header: what a block that does not compress grows by


# ``has_direct`` answers another process of this machine found (``trust_direct``): a local
# pool's worker runs the parent's interpreter, libraries and environment, so it would find
# the same, and need not load HDF5 to check.
_TRUSTED: dict[ChunkLayout, bool] = {}


def trust_direct(verdicts: dict[ChunkLayout, bool]) -> None:
    """Take ``has_direct``'s answers from a process with this one's interpreter, libraries
    and environment (the parent of a local worker pool), instead of checking each again."""
    _TRUSTED.update(verdicts)


@functools.lru_cache(maxsize=256)
def has_direct(layout: ChunkLayout) -> bool:
    """Whether ``encode_direct`` encodes blocks of ``layout``: a codec call exists and makes,
    on this process's libraries, the very bytes HDF5's filter pipeline stores (checked once on
    a fixed block; a library built otherwise, or a ``BLOSC_*`` variable that HDF5's blosc
    filter obeys, leaves HDF5 to encode). The answer is the same in every process of a build,
    so every process encodes a layout's blocks alike."""
    trusted = _TRUSTED.get(layout)
    if trusted is not None:
        return trusted
    call = _codec_call(layout)
    if call is None:  # lzf's bytes are imagecodecs' by construction: no block to try
        return _plain_lzf(layout)
    rows = _probe_rows(layout)
    scratch, dataset = _scratch(layout)
    with scratch:
        dataset.write_direct(rows)
        mask, data = dataset.id.read_direct_chunk((0,) * (len(layout.shape) + 1))
    return mask == 0 and bytes(data) == call(rows)


def encode_direct(layout: ChunkLayout, rows: np.ndarray) -> list[EncodedChunk] | None:
    """One block's chunk as HDF5 would store it, without HDF5 (and without the GIL), for a
    layout that ``has_direct``; None for a block that does not compress: HDF5 then stores
    it raw with its filter skipped, a decision ``encode`` leaves to HDF5."""
    if not has_direct(layout):
        return None
    rows = np.ascontiguousarray(rows, dtype=layout.dtype)
    destination = current()
    call = _codec_call(layout)
    if call is None:
        return _lzf_direct(layout, rows, destination)
    room = None
    if destination is not None and layout.compression.codec == "blosc":
        room = destination.reserve(rows.nbytes + _BLOSC_MAX_OVERHEAD)
    stored = call(rows) if room is None else call(rows, room)
    if len(stored) >= rows.nbytes and layout.compression.codec != "none":
        return None
    if destination is not None and room is not None:
        assert isinstance(stored, memoryview)
        destination.commit(stored)
    offset = (0,) * (len(layout.shape) + 1)
    return [EncodedChunk(offset, 0, stored, hashlib.sha256(stored).hexdigest())]


def encode_block(layout: ChunkLayout, rows: np.ndarray) -> list[EncodedChunk]:
    """Compress one block of exactly ``layout.rows`` samples into its stored chunks."""
    with BlockEncoder(layout) as encoder:
        return encoder.encode(rows)


class BlockEncoder:
    """Compresses many blocks of one layout through a single in-memory scratch dataset (a
    ragged column of one value row per chunk encodes each row: a scratch file per row would
    cost more than the row)."""

    def __init__(self, layout: ChunkLayout):
        self.layout = layout
        self._scratch: tuple[h5py.File, h5py.Dataset] | None = None

    def __enter__(self) -> BlockEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the scratch file; the encoder makes a new one if used again."""
        if self._scratch is not None:
            self._scratch[0].close()
            self._scratch = None

    def encode(self, rows: np.ndarray) -> list[EncodedChunk]:
        layout = self.layout
        if rows.shape != (layout.rows, *layout.shape):
            raise ValueError(f"block shape {rows.shape} does not match layout {layout}")
        direct = encode_direct(layout, rows)
        if direct is not None:
            return direct
        if self._scratch is None:
            self._scratch = _scratch(layout)
        dataset = self._scratch[1]
        dataset.write_direct(np.ascontiguousarray(rows, dtype=layout.dtype))
        out = []
        for offset in layout.chunk_offsets():
            mask, data = dataset.id.read_direct_chunk(offset)
            stored = bytes(data)
            out.append(EncodedChunk(offset, int(mask), stored, hashlib.sha256(stored).hexdigest()))
        return out


def encode_rows(
    layout: ChunkLayout, rows: np.ndarray
) -> tuple[list[list[EncodedChunk]], list[bytes]]:
    """Compress and hash ``rows`` block by block: each block's chunks and the digest of its
    rows. A last partial block is zero-padded to a whole chunk, as HDF5 stores an edge chunk."""
    step = layout.rows
    blocks, digests = [], []
    for start in range(0, len(rows), step):
        block = rows[start : start + step]
        digests.append(digest.block_digest(block))
        if len(block) < step:
            padded = np.zeros((step, *layout.shape), dtype=layout.dtype)
            padded[: len(block)] = block
            block = padded
        blocks.append(encode_block(layout, block))
    return blocks, digests


def decode_block(layout: ChunkLayout, chunks: list[EncodedChunk]) -> np.ndarray:
    """The rows of an encoded block, uncompressed: the inverse of ``encode_block``."""
    scratch, dataset = _scratch(layout)
    with scratch:
        for chunk in chunks:
            dataset.id.write_direct_chunk(chunk.offset, chunk.data, chunk.filter_mask)
        # HDF5 2.0 keeps a stale filter mask for directly written chunks in the open dataset
        # and runs a skipped filter on read; a fresh handle reads the stored mask.
        dataset.id.close()
        return np.asarray(scratch["block"][...])
