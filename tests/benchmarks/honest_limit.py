"""The honest work limit: the work h5etl does per sample, done by a process that imports nothing
of h5etl.

    python tests/benchmarks/honest_limit.py --corpus DIR --codec lzf|blosc-lz4 [--jobs 2]
        [--write DIR]

``build.py``'s older work limit decodes with h5etl's own modules and computes the statistics
with h5etl's kinds, so its processes pay part of h5etl's fixed cost (importing h5etl, pydantic,
h5py and the kinds) and the ratio ``h5etl / limit`` comes out too kind. This limit uses only
numpy, imagecodecs, hashlib and joblib's loky pool, and checks it: the process and each worker
refuse to run with any ``h5etl`` module loaded. Per pair and per block of 32 it does what an
``h5etl build`` of the benchmark corpus does in its workers:

- read both files and SHA-256 each (the source fingerprint);
- decode with libpng through imagecodecs (h5etl's decoder for plain PNGs), the mask checked
  and read as h5etl reads a 0/255 mask (two counts, then ``== 255``), padded, centred, into
  the block's (32, c, 224, 224) rows (RGB stored channels first);
- the statistics a release carries, as plain numpy: per-channel sums, sums of squares, minima
  and maxima of each image's pixels; the mask's label counts;
- each block compressed as h5etl stores it (``h5etl/format/codec.py``: plain LZF of the rows,
  or blosc with lz4, level 5, byte shuffle, typesize 1, one thread), the SHA-256 of the
  compressed chunk and of the raw rows.

The compressed blocks are discarded: no pipe to a writer, no file. With ``--write DIR`` each
worker appends its compressed blocks to a file of its own in ``DIR`` (``os.write``, as they
are made), and this process fsyncs and removes the files once every block is done: the same
bytes a release stores reach the disk, the cost a limit that writes nothing leaves out
(copying them into the page cache and its writeback), still with no HDF5, no pipe and no
ordering. The workers are a loky pool
as joblib starts one (``get_reusable_executor``; h5etl's own pool is a loky pool too), started
by this process, so their start-up is inside the timed wall; they take the blocks in order.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCH = 32
SIZE = 224
# h5etl.execute.pool.NATIVE_THREAD_LIMITS, which h5etl's workers get (copied, not imported;
# a smoke test holds the two equal).
THREAD_LIMITS = dict.fromkeys(
    (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ),
    "1",
)
# The corpus configs' codecs as h5etl encodes a whole 32-sample block of uint8 rows
# (``h5etl.format.codec``: ``_lzf_direct``, ``_codec_call``; blosc's default level is 5 and
# its byte shuffle replaces HDF5's). A smoke test compares the bytes with h5etl's.
CODECS = ("lzf", "blosc-lz4")
BLOSC_LEVEL, BLOSC_CNAME, BLOSC_SHUFFLE_BYTE = 5, "lz4", 1

Pair = tuple[str, str]


def no_h5etl(where: str) -> None:
    """Refuse to go on where any module of h5etl is loaded: the limit would pay its cost."""
    loaded = sorted(name for name in sys.modules if name.startswith("h5etl"))
    if loaded:
        raise RuntimeError(f"honest limit ({where}) imported h5etl modules: {loaded[:5]}")


def encode(codec: str, rows: Any) -> memoryview:
    """One block's stored chunk, as h5etl's workers encode it, into a buffer reused block
    after block (the chunk is hashed and dropped): a fresh output object per block took new
    pages from the kernel each time (LZF: about 90 us a sample of page faults)."""
    import imagecodecs

    room = rows.nbytes + rows.nbytes // 16 + 64  # LZF's and blosc's worst growth, and more
    out = _OUTPUT.get(codec)
    if out is None or len(out) < room:
        out = _OUTPUT[codec] = bytearray(room)
    encoded: Any
    if codec == "lzf":
        encoded = imagecodecs.lzf_encode(rows.data, out=out)
    else:
        encoded = imagecodecs.blosc_encode(
            rows.data,
            BLOSC_LEVEL,
            compressor=BLOSC_CNAME,
            shuffle=BLOSC_SHUFFLE_BYTE,
            typesize=1,
            numthreads=1,
            out=out,
        )
    return memoryview(encoded)  # a view of ``out``: what was written


_OUTPUT: dict[str, bytearray] = {}
_BUFFERS: dict[str, Any] = {}


def _place(rows: Any, pixels: Any) -> Any:
    """``pixels`` (h, w) or (h, w, 3) centred into ``rows`` (c, 224, 224); the window."""
    height, width = pixels.shape[:2]
    top, left = (SIZE - height) // 2, (SIZE - width) // 2
    window = rows[:, top : top + height, left : left + width]
    window[...] = pixels.transpose(2, 0, 1) if pixels.ndim == 3 else pixels
    return window


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read()
    hashlib.sha256(data).hexdigest()
    return data


def _mask_labels(mask: Any, path: str) -> Any:
    """A 0/255 (or 0/1) mask as 0/1, checked the way h5etl checks it."""
    import numpy as np

    if int(mask.max(initial=0)) <= 1:
        return mask
    ones = mask == 255
    if np.count_nonzero(ones) != np.count_nonzero(mask):
        raise ValueError(f"{path}: mask values other than 0 and 255")
    return ones.view(np.uint8)


def _image_stats(window: Any) -> list[list[int]]:
    """Per channel: sum, sum of squares, minimum, maximum (uint8: squares fit uint16)."""
    import numpy as np

    values = window.astype(np.uint16).reshape(window.shape[0], -1)
    low, high = values.min(axis=1).tolist(), values.max(axis=1).tolist()
    sums = values.sum(axis=1, dtype=np.uint32).tolist()
    np.multiply(values, values, out=values)
    return [sums, values.sum(axis=1, dtype=np.uint32).tolist(), low, high]


# The folder -> this worker's file descriptor there, its bytes, and the bytes whose writeback
# started: as h5etl's writer does (``h5etl.sink.disk.WRITEBACK_BYTES``), every 16 MiB the
# kernel is told to start writing them (Linux ``sync_file_range``), not left to the final fsync.
_WRITTEN: dict[str, list[int]] = {}
WRITEBACK_BYTES = 16 << 20


def _stored_to(folder: str, chunk: memoryview) -> None:
    """Append ``chunk`` to this worker's file in ``folder`` (opened once per worker)."""
    state = _WRITTEN.get(folder)
    if state is None:
        path = os.path.join(folder, f"limit-{os.getpid()}.bin")
        state = _WRITTEN[folder] = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 0, 0]
    fd = state[0]
    while chunk:
        written = os.write(fd, chunk)
        chunk, state[1] = chunk[written:], state[1] + written
    if state[1] - state[2] >= WRITEBACK_BYTES and sys.platform == "linux":
        _sync_file_range()(fd, state[2], state[1] - state[2], 2)  # SYNC_FILE_RANGE_WRITE
        state[2] = state[1]


@functools.lru_cache(maxsize=1)
def _sync_file_range() -> Any:
    import ctypes

    call = ctypes.CDLL(None, use_errno=True).sync_file_range
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return call


def block(
    pairs: Sequence[Pair], codec: str, invert: bool = False, write: str | None = None
) -> dict[str, Any]:
    """Decode, check, pad, count and compress one block of pairs; its digests and counts.
    ``invert``: each image inverted after decoding, before it is placed (what a build with the
    user transform ``transform_build.py`` writes, ``255 - value``, does there). ``write``: a
    folder where this worker appends the compressed chunks (``--write``)."""
    import imagecodecs
    import numpy as np

    no_h5etl("worker")
    # Reused like h5etl's own batch buffers: fresh arrays would add a page fault per 4 KiB.
    image = _BUFFERS.setdefault("image", np.empty((BATCH, 3, SIZE, SIZE), np.uint8))
    mask = _BUFFERS.setdefault("mask", np.empty((BATCH, 1, SIZE, SIZE), np.uint8))
    image.fill(0)
    mask.fill(0)
    sums = np.zeros(3, np.int64)
    ones = zeros = 0
    for row, (image_path, mask_path) in enumerate(pairs):
        rgb = imagecodecs.png_decode(_read(image_path))
        if rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"{image_path}: not an 8-bit RGB PNG")
        if invert:
            rgb = np.subtract(255, rgb, dtype=rgb.dtype)
        sums += np.array(_image_stats(_place(image[row], rgb))[0])
        labels = _mask_labels(imagecodecs.png_decode(_read(mask_path)), mask_path)
        window = _place(mask[row], labels)
        nonzero = int(np.count_nonzero(window))
        ones, zeros = ones + nonzero, zeros + window.size - nonzero
    digests = []
    for rows in (image, mask):
        stored = encode(codec, rows)
        digests.append(hashlib.sha256(stored).hexdigest())  # the chunk's, as h5etl keeps it
        if write is not None:
            _stored_to(write, stored)
        digests.append(hashlib.sha256(rows.data).hexdigest())  # the raw rows' (block digest)
    return {"samples": len(pairs), "sums": sums.tolist(), "ones": ones, "zeros": zeros}


def pairs_of(corpus: Path) -> list[Pair]:
    """The corpus's image/mask pairs by name, sorted."""
    masks = {entry.name for entry in os.scandir(corpus / "masks") if entry.name.endswith(".png")}
    names = sorted(e.name for e in os.scandir(corpus / "images") if e.name in masks)
    return [(str(corpus / "images" / n), str(corpus / "masks" / n)) for n in names]


def run(
    corpus: Path, codec: str, jobs: int, invert: bool = False, write: Path | None = None
) -> dict[str, Any]:
    """Every block of the corpus on ``jobs`` loky workers; totals to show the work was done.
    ``write``: the workers append their chunks to files there, fsynced and removed here."""
    from joblib.externals.loky import get_reusable_executor

    no_h5etl("process")
    pairs = pairs_of(corpus)
    blocks = [pairs[i : i + BATCH] for i in range(0, len(pairs), BATCH)]
    executor = get_reusable_executor(max_workers=jobs, env=THREAD_LIMITS)
    folder = None if write is None else str(write)
    count = len(blocks)
    done = list(executor.map(block, blocks, [codec] * count, [invert] * count, [folder] * count))
    written = _synced_and_removed(write) if write is not None else 0
    no_h5etl("process, after the work")
    return {
        "samples": sum(d["samples"] for d in done),
        "mask_ones": sum(d["ones"] for d in done),
        "image_sum": sum(sum(d["sums"]) for d in done),
        "h5etl_modules": 0,  # no_h5etl held in this process and in every task
        "written_bytes": written,
    }


def _synced_and_removed(folder: Path) -> int:
    """fsync the workers' files in ``folder`` (a release is durable before it is published),
    then remove them; their bytes. A worker's descriptor closes as its process ends."""
    written = 0
    for path in sorted(folder.glob("limit-*.bin")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            written += os.fstat(fd).st_size
        finally:
            os.close(fd)
        path.unlink()
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="folder with images/, masks/")
    parser.add_argument("--codec", choices=CODECS, default="lzf")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--invert", action="store_true", help="invert each image (a transform)")
    parser.add_argument("--write", type=Path, help="append the compressed chunks to files here")
    args = parser.parse_args(argv)
    for name, value in THREAD_LIMITS.items():  # before numpy loads, as the h5etl CLI does
        os.environ.setdefault(name, value)
    print(json.dumps(run(args.corpus, args.codec, args.jobs, args.invert, args.write)))


if __name__ == "__main__":
    # The workers unpickle ``block`` from this file imported by name (loky passes our
    # sys.path), not from ``__main__``: one module, whichever way it is started.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import honest_limit

    honest_limit.main()
