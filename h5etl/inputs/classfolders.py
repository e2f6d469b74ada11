"""classfolders: class labels from a ``root/<class>/<file>`` tree.

Which folder names a file's class, which class folders are empty, and the order of the class
names (labels are int64 indices into it). Pure and light: no pydantic, no HDF5.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path

from h5etl.errors import ConfigError
from h5etl.inputs import opening as inputs

__all__ = ["class_names", "class_of", "empty_class_folders"]

_INTEGER = re.compile(r"-?[0-9]+")


def class_of(relpath: str) -> str | None:
    """The class of a file at ``relpath`` (POSIX, relative to the source folder), or None.

    Only ``<class>/<file>`` is a member of class ``<class>`` (its folder name, NFC). A file
    directly in the root has no class, and neither has a file deeper down
    (``<class>/sub/x.jpg``): nested folders are not classes, and the label kind rejects such
    files as ``no_label``.
    """
    parts = relpath.split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return unicodedata.normalize("NFC", parts[0])


def empty_class_folders(root: Path, *, matches: Callable[[str], bool] | None = None) -> list[str]:
    """The class folders under ``root`` that hold no file of their class, sorted (NFC names).

    A class folder is a non-hidden folder directly under ``root`` (symlinked folders are not,
    as discover does not walk them). It is empty when it holds no non-hidden regular file
    (or link to one) directly; files in deeper folders are no class members. ``matches``
    (the source's pattern, given ``<class>/<file>``) narrows which files count. A folder that
    cannot be listed is not reported here: discover reports it as unreadable.

    Raises:
        ConfigError: ``root`` cannot be listed.
    """
    try:
        with os.scandir(root) as scan:
            folders = [e for e in scan if not e.name.startswith(".") and inputs.is_folder(e)]
    except OSError as exc:
        raise ConfigError(
            f"cannot list the class folders: {exc.strerror or exc}", path=root
        ) from exc
    empty = []
    for folder in folders:
        try:
            with os.scandir(folder.path) as scan:
                members = any(_is_member(folder.name, e, matches) for e in scan)
        except OSError:
            continue
        if not members:
            empty.append(unicodedata.normalize("NFC", folder.name))
    return sorted(empty)


def _is_member(folder: str, entry: os.DirEntry[str], matches: Callable[[str], bool] | None) -> bool:
    if entry.name.startswith("."):
        return False
    try:
        regular = entry.is_file()
    except OSError:
        return False
    return regular and (matches is None or matches(f"{folder}/{entry.name}"))


def class_names(labels: Iterable[str]) -> list[str]:
    """The distinct class names, sorted: by value when every one is an integer (``"2"``
    before ``"10"``; ASCII digits, optional ``-``), else as text. Labels are int64 indices
    into this list."""
    names = set(labels)
    if names and all(_INTEGER.fullmatch(name) for name in names):
        return sorted(names, key=lambda name: (int(name), name))
    return sorted(names)
