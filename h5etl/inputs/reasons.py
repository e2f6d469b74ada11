"""reasons: what a rejected input is called, whatever stage found it.

One damage, one reason. A plain dry run reads headers (``h5etl.decode.probes``); a build and
``--dry-run --decode`` decode. Both name a damaged file by ``damaged`` and a sample by the
first of its defects in ``TABLE``'s order, which puts what headers show before what only
pixels show: a build that rejects a sample probes its headers as a dry run would and, when
they show a defect, names that one (``h5etl.decode.task``). Plain data, no Pillow.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["TABLE", "Reason", "damaged", "ends_early", "looks_whole"]


@dataclass(frozen=True, slots=True)
class Reason:
    """A reject reason of a file-per-sample input: the defect it names, and which stage
    finds it first (a plain dry run, or only decoding: a build, ``--dry-run --decode``)."""

    code: str
    defect: str
    found_by: str


DRY_RUN, DECODE = "dry run", "decode"
_BOTH = "dry run (a table), decode (a sidecar)"

# The order a sample's defects are named in: the first one found by this order wins.
TABLE: tuple[Reason, ...] = (
    Reason("orphan", "no partner file with the same stem in another source", DRY_RUN),
    Reason("duplicate_key", "two files give the same sample key", DRY_RUN),
    Reason("not_a_file", "a FIFO, socket, device or linked folder", DRY_RUN),
    Reason("dangling_symlink", "a symbolic link that points nowhere", DRY_RUN),
    Reason("symlink_loop", "a symbolic link loop", DRY_RUN),
    Reason("unreadable", "cannot be read, empty, or no image format known", DRY_RUN),
    Reason("truncated", "a PNG, JPEG, GIF, WebP or BMP cut short, wherever it was cut", DRY_RUN),
    Reason("decompression_bomb", "more pixels than Pillow's `MAX_IMAGE_PIXELS`", DRY_RUN),
    Reason("empty_image", "zero width or height", DRY_RUN),
    Reason("size_mismatch", "a mask's height x width is not its image's", DRY_RUN),
    Reason("scale_mismatch", "not exactly `scale.factor` times the other field", DRY_RUN),
    Reason("oversize", "larger than the field's shape (`pad.oversize: reject`)", DRY_RUN),
    Reason("no_label", "a label field finds no class for the file", DRY_RUN),
    Reason("unknown_class", "a class that `classes` does not list", DRY_RUN),
    Reason("ambiguous_row", "a table key that matches files in two places", DRY_RUN),
    Reason("no_group", "no value of `splits.group_by` to group by", DRY_RUN),
    Reason("no_value", "no value for a field (no table row, no sidecar key)", _BOTH),
    Reason("bad_value", "a value the field's dtype cannot hold", _BOTH),
    Reason("bad_sidecar", "a JSON sidecar that is no JSON object", DECODE),
    Reason("decode_error", "a whole file whose pixels cannot be decoded", DECODE),
    Reason("unsupported_mode", "a pixel mode the field cannot take", DECODE),
    Reason("lossy_conversion", "values the field's dtype cannot hold exactly", DECODE),
    Reason("mask_not_single_channel", "a colour mask whose R, G and B differ", DECODE),
    Reason("mask_values", "mask labels outside the field's `values`", DECODE),
    Reason("unknown_color", "a mask colour missing from `colors`", DECODE),
    Reason("transform_error", "a transform of the config raised on it", DECODE),
    Reason("transform_output", "a transform's result the field cannot store", DECODE),
    Reason("memory_error", "ran out of memory decoding it", DECODE),
    Reason("worker_crashed", "its decoder kills the worker process", DECODE),
)

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG = b"\xff\xd8\xff"
_GIFS = (b"GIF87a", b"GIF89a")
_PREFIXES = (_PNG, _JPEG, *_GIFS)  # a file this short that starts one was cut in its header
CUT_SHORT = "file ends before the image does"


def _png_ends_early(data: bytes) -> bool:
    """Whether the chunks run past the end before IEND."""
    pos = len(_PNG)
    while pos + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IEND":
            return False
        pos += 12 + length
    return True


def ends_early(data: bytes) -> bool:
    """Whether ``data`` is an image file cut short: its format's structure says more bytes
    were to come. Only the formats whose structure says so cheaply; others, False."""
    if len(data) >= 2 and any(p.startswith(data) and len(data) < len(p) for p in _PREFIXES):
        return True
    if data.startswith(_PNG):
        return _png_ends_early(data)
    if data.startswith(_JPEG):
        return not data.endswith(b"\xff\xd9")  # EOI: a decoder that failed did not find it
    if data.startswith(_GIFS):
        return not data.endswith(b";")
    declared = _declared_size(data)
    return declared is not None and declared > len(data)


def _declared_size(head: bytes) -> int | None:
    """The size a WebP (RIFF) or BMP header says its file has, else None."""
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        size: int = struct.unpack_from("<I", head, 4)[0]
        return size + 8
    if head.startswith(b"BM") and head[6:10] == b"\0\0\0\0":  # BMP's reserved bytes
        size = struct.unpack_from("<I", head, 2)[0]
        return size
    return None


_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def looks_whole(head: bytes, tail: bytes, size: int) -> bool:
    """A cheap test from a file's first and last bytes: False when it may have been cut
    short (a header probe then decodes it to be sure), True when its end is where its
    format ends, or its format has no such mark."""
    if head.startswith(_PNG):
        return tail.endswith(_IEND)
    if head.startswith(_JPEG):
        return tail.endswith(b"\xff\xd9")
    if head.startswith(_GIFS):
        return tail.endswith(b";")
    declared = _declared_size(head)
    return declared is None or declared <= size


def damaged(data: bytes, error: str, *, unidentified: bool) -> tuple[str, str]:
    """The reason and detail of a file a decoder could not open or decode (``error`` is
    the decoder's words): the same for a header probe and a decode of the same bytes."""
    if not data:
        return "unreadable", "empty file"
    if ends_early(data) or "truncated" in error.lower():
        return "truncated", CUT_SHORT
    if unidentified:
        return "unreadable", "not an image Pillow can identify"
    return "decode_error", f"cannot decode: {error}"
