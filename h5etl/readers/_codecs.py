"""A stored chunk's bytes decoded as HDF5's filter pipeline would: whole, or in part for Blosc.

Pure functions of bytes, no file: ``Pipeline`` undoes a dataset's filters; ``blosc_range``
decodes only the Blosc blocks that hold a byte range of the chunk. A Blosc frame is a header,
the offsets of its blocks and the blocks, each compressed (and shuffled) on its own, so one
sample of a 32-sample chunk costs two or three 128 KiB blocks instead of the whole chunk.
"""

from __future__ import annotations

import bisect
import math
import struct
from dataclasses import dataclass
from typing import Any

import h5py
import imagecodecs
import numpy as np

from h5etl.format import contract as fileformat

SHUFFLE, FLETCHER32, DEFLATE = (
    fileformat.FILTER_SHUFFLE,
    fileformat.FILTER_FLETCHER32,
    fileformat.FILTER_DEFLATE,
)
LZF, BLOSC, ZSTD = fileformat.FILTER_LZF, fileformat.FILTER_BLOSC, fileformat.FILTER_ZSTD
CODECS = frozenset({DEFLATE, LZF, BLOSC, ZSTD})

# c-blosc 1.x frame: version, codec version, flags, typesize, nbytes, blocksize, cbytes.
BLOSC_HEADER = struct.Struct("<BBBBiii")
BLOSC_MEMCPYED = 0x2  # the data follows the header as it is, no blocks
BLOSC_KNOWN_FLAGS = 0x1 | 0x2 | 0x4 | 0x10 | 0xE0  # shuffle, memcpy, bitshuffle, split, codec
BLOSC_VERSIONS = frozenset({1, 2})  # the frame formats of c-blosc 1.x (what hdf5plugin writes)


class NotDecodable(Exception):
    """This layout, pipeline or chunk is not decoded here; h5py reads it instead."""


def _codec(filter_id: int, stored: Any, nbytes: int) -> Any:
    """One codec's decoded bytes; ``out=nbytes`` makes a longer output an error, not a loss."""
    if filter_id == LZF:
        return imagecodecs.lzf_decode(stored, out=nbytes)
    if filter_id == DEFLATE:  # a zlib stream; libdeflate when the size is known
        return imagecodecs.deflate_decode(stored, out=nbytes)
    if filter_id == ZSTD:
        return imagecodecs.zstd_decode(stored, out=nbytes)
    return imagecodecs.blosc_decode(stored, numthreads=1)  # the frame states its own size


def unshuffle(data: Any, itemsize: int) -> np.ndarray:
    """Undo HDF5's byte shuffle: byte ``j`` of every item is stored together, for each ``j``."""
    flat = np.frombuffer(data, dtype=np.uint8)
    if itemsize == 1 or flat.size % itemsize:
        raise NotDecodable(f"cannot unshuffle {flat.size} bytes of {itemsize}-byte items")
    return np.ascontiguousarray(flat.reshape(itemsize, -1).T).reshape(-1)


def blosc_range(frame: np.ndarray, start: int, stop: int) -> np.ndarray | None:
    """Bytes ``start:stop`` of a Blosc frame's decoded data, decoding only the blocks holding them.

    The blocks are copied into a smaller frame of their own (same header but for its sizes,
    offsets renumbered) that Blosc decodes as usual: every codec, shuffle and split it knows,
    at the cost of copying a few compressed blocks. The last block stays the short one only
    when it is the frame's own, so Blosc splits each block as it did when it wrote it; it
    never comes alone (c-blosc refuses a frame shorter than its blocksize).
    Returns None for a frame this does not read in part (unknown version or flags, sizes
    that do not add up); ``Pipeline.decode`` of the whole frame then judges it.
    """
    if frame.size < BLOSC_HEADER.size:
        return None
    version, codec, flags, typesize, nbytes, blocksize, cbytes = BLOSC_HEADER.unpack_from(
        frame.data
    )
    if (
        version not in BLOSC_VERSIONS
        or flags & ~BLOSC_KNOWN_FLAGS
        or not 0 <= start < stop <= nbytes
        or blocksize <= 0
        or not BLOSC_HEADER.size <= cbytes <= frame.size
    ):
        return None
    if flags & BLOSC_MEMCPYED:
        if cbytes != BLOSC_HEADER.size + nbytes:
            return None
        return frame[BLOSC_HEADER.size + start : BLOSC_HEADER.size + stop]
    nblocks = math.ceil(nbytes / blocksize)
    first, last = start // blocksize, (stop - 1) // blocksize + 1
    if first and min(nbytes, last * blocksize) - first * blocksize < blocksize:
        first -= (
            1  # Blosc refuses a frame smaller than its blocksize: the short block needs company
        )
    table = BLOSC_HEADER.size + 4 * nblocks
    if table > cbytes:
        return None
    # Python ints: for a few dozen blocks they are several times faster than numpy here.
    offsets = struct.unpack_from(f"<{nblocks}i", frame.data, BLOSC_HEADER.size)
    # A block ends where the next stored one starts: threads may store blocks out of order.
    stored = sorted({*offsets, cbytes})
    if stored[0] < table or stored[-1] != cbytes or cbytes in offsets:
        return None
    begins = offsets[first:last]
    ends = [stored[bisect.bisect_right(stored, begin)] for begin in begins]
    head = BLOSC_HEADER.size + 4 * len(begins)
    starts: list[int] = []  # the blocks' offsets in the smaller frame
    at = head
    for begin, end in zip(begins, ends, strict=True):
        starts.append(at)
        at += end - begin
    part_nbytes = min(nbytes, last * blocksize) - first * blocksize
    view = frame.data
    part = b"".join(
        [
            BLOSC_HEADER.pack(version, codec, flags, typesize, part_nbytes, blocksize, at),
            struct.pack(f"<{len(starts)}i", *starts),
            *(view[begin:end] for begin, end in zip(begins, ends, strict=True)),
        ]
    )
    try:
        decoded = np.frombuffer(imagecodecs.blosc_decode(part, numthreads=1), dtype=np.uint8)
    except (RuntimeError, ValueError) as exc:  # imagecodecs' errors are RuntimeErrors
        raise NotDecodable(f"Blosc blocks {first}:{last}: {exc}") from exc
    if decoded.size != part_nbytes:
        raise NotDecodable(f"Blosc blocks {first}:{last} decoded to {decoded.size} bytes")
    skip = start - first * blocksize
    return decoded[skip : skip + stop - start]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A dataset's filters in write order, reduced to what decoding a chunk needs.

    Accepted: one codec (deflate, lzf, Blosc or Zstd), the byte shuffle, or the shuffle then
    one codec; anything else (fletcher32, scale-offset, two codecs, shuffle after the codec,
    unknown plugins) raises ``NotDecodable``. Every stage then has the chunk's own size.
    """

    filters: tuple[int, ...]
    itemsize: int
    nbytes: int  # one decoded chunk

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> Pipeline:
        plist = dataset.id.get_create_plist()
        filters = tuple(int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters()))
        codecs = [f for f in filters if f in CODECS]
        allowed = filters in {(*codecs,), (SHUFFLE, *codecs)}
        if len(codecs) > 1 or not allowed or not filters:
            raise NotDecodable(f"filter pipeline {filters} is not decoded here")
        itemsize = dataset.dtype.itemsize
        return cls(filters, itemsize, math.prod(dataset.chunks) * itemsize)

    @property
    def ranged(self) -> bool:
        """Whether part of a chunk can be decoded alone: Blosc, with no HDF5 shuffle that
        moves bytes across the whole chunk (the shuffle of one-byte items moves none)."""
        return self.filters == (BLOSC,) or (self.filters == (SHUFFLE, BLOSC) and self.itemsize == 1)

    def decode(self, stored: Any, mask: int) -> np.ndarray:
        """One chunk's bytes; filters whose bit is set in ``mask`` were skipped at write time."""
        data = stored
        for position in reversed(range(len(self.filters))):
            if mask >> position & 1:
                continue
            filter_id = self.filters[position]
            if filter_id == SHUFFLE:
                if self.itemsize > 1:  # HDF5 leaves 1-byte items as they are
                    data = unshuffle(data, self.itemsize)
                continue
            try:
                data = _codec(filter_id, data, self.nbytes)
            except (RuntimeError, ValueError) as exc:  # imagecodecs' errors are RuntimeErrors
                raise NotDecodable(f"filter {filter_id}: {exc}") from exc
        decoded = np.frombuffer(data, dtype=np.uint8)
        if decoded.size != self.nbytes:
            raise NotDecodable(f"decoded {decoded.size} bytes, the chunk has {self.nbytes}")
        return decoded

    def decode_range(
        self, stored: np.ndarray, mask: int, start: int, stop: int
    ) -> np.ndarray | None:
        """Bytes ``start:stop`` of one chunk, decoding no more than the blocks holding them.

        None where the chunk cannot be decoded in part (not ``ranged``, a filter skipped at
        write time, a frame ``blosc_range`` does not read): decode it whole instead.
        """
        if not self.ranged or mask or self.nbytes != _blosc_nbytes(stored):
            return None
        return blosc_range(stored, start, stop)


def _blosc_nbytes(frame: np.ndarray) -> int:
    """The decoded size a Blosc frame states (-1 if it is too short to state one)."""
    if frame.size < BLOSC_HEADER.size:
        return -1
    return int(BLOSC_HEADER.unpack_from(frame.data)[4])
