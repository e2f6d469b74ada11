"""Sizes for people: the one formatter ``check`` and the CLI share."""

from __future__ import annotations


def human_size(size: float) -> str:
    """``1536`` -> ``1.5 KiB``; bytes below 1 KiB as a whole number, GiB as the largest unit."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} GiB"
