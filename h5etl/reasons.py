"""reasons: what a rejected input is called, whatever stage found it.

One damage, one reason. A plain dry run reads headers (``h5etl.probes``); a build and
``--dry-run --decode`` decode. Both name a damaged file by ``damaged`` and a sample by the
first of its defects in ``TABLE``'s order, which puts what headers show before what only
pixels show: a build that rejects a sample probes its headers as a dry run would and, when
they show a defect, names that one (``h5etl.decode``). Plain data, no Pillow.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["TABLE", "Reason", "damaged", "ends_early", "looks_whole"]


@dataclass(frozen=True, slots=True)
class Reason:
    """A reject reason of an image, mask or label input: the defect it names, and whether
    a plain dry run's header probe finds it (``"headers"``) or only decoding does."""

    code: str
    defect: str
    found_by: str


# The order a sample's defects are named in: the first one found by this order wins.
TABLE: tuple[Reason, ...] = (
    Reason("orphan", "no partner file with the same stem in another source", "headers"),
    Reason("duplicate_key", "two files give the same sample key", "headers"),
    Reason("not_a_file", "a FIFO, socket, device or linked folder", "headers"),
    Reason("dangling_symlink", "a symbolic link that points nowhere", "headers"),
    Reason("symlink_loop", "a symbolic link loop", "headers"),
    Reason("unreadable", "cannot be read, empty, or not an image (no known format)", "headers"),
    Reason(
        "truncated",
        "a PNG, JPEG, GIF, WebP or BMP that ends before its image does, wherever it was cut",
        "headers",
    ),
    Reason("decompression_bomb", "more pixels than Pillow's MAX_IMAGE_PIXELS", "headers"),
    Reason("empty_image", "zero width or height", "headers"),
    Reason("size_mismatch", "a mask's height x width differs from its image's", "headers"),
    Reason("scale_mismatch", "not exactly `scale.factor` times the other field", "headers"),
    Reason("oversize", "larger than the field's shape (`pad.oversize: reject`)", "headers"),
    Reason("decode_error", "a complete file whose pixels cannot be decoded", "pixels"),
    Reason("unsupported_mode", "a pixel mode the field cannot take", "pixels"),
    Reason("lossy_conversion", "values the field's dtype cannot hold exactly", "pixels"),
    Reason("mask_not_single_channel", "a colour mask whose R, G and B differ", "pixels"),
    Reason("mask_values", "mask labels outside the field's `values`", "pixels"),
    Reason("unknown_color", "a mask colour missing from `colors`", "pixels"),
    Reason("memory_error", "ran out of memory decoding it", "pixels"),
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
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return struct.unpack_from("<I", data, 4)[0] + 8 > len(data)
    if data.startswith(b"BM") and len(data) >= 6:
        return struct.unpack_from("<I", data, 2)[0] > len(data)
    return False


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
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return struct.unpack_from("<I", head, 4)[0] + 8 <= size
    if head.startswith(b"BM") and len(head) >= 6:
        return struct.unpack_from("<I", head, 2)[0] <= size
    return True


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
