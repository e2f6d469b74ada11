"""durable: files written so that a crash leaves the old file or the new one, never a torn one.

fsync of a file and of the folder that names it, JSON written and synced, and
``write_atomically`` (a temp file synced, renamed over the path, the folder synced): the
release folder's publish, a shard's manifest (its commit), the demo's config.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "fsync_file", "write_atomically", "write_json"]


def fsync_dir(folder: Path) -> None:
    """Make the names in ``folder`` (a rename, a new link) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path`` and sync it (not atomic: a temp name)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: a temp file fsynced, renamed, the folder
    fsynced (a shard's manifest: its commit).

    Raises:
        OSError: the write failed; nothing is left under ``path``.
    """
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data if isinstance(data, bytes) else data.encode("utf-8", errors="backslashreplace")
    try:
        with open(temp, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
