"""discover: walk each source folder, pair files across sources by key, report orphans.

A key is a file's path relative to its source dir, without suffix, Unicode-normalised (NFC).
Hidden files and folders are ignored; symlinked folders are not walked (no loops); symlinked
files are kept so that clean can follow or reject them. Output is sorted by key.
"""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from h5etl.records import Reject, Roots, Sample, SourceFile
from h5etl.spec import Spec

STAGE = "discover"


@dataclass(frozen=True, slots=True)
class Discovery:
    samples: list[Sample]
    rejects: list[Reject]
    files_seen: int


@lru_cache(maxsize=64)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a glob (``*``, ``?``, ``[...]``, ``**/``) into a regex over relative paths."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def list_source(root: Path, pattern: str) -> list[str]:
    """Relative POSIX paths of the non-hidden entries under ``root`` that match ``pattern``."""
    regex = glob_regex(pattern)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        relative_dir = os.path.relpath(dirpath, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if name.startswith("."):
                continue
            relpath = name if relative_dir == "." else f"{relative_dir}/{name}"
            relpath = relpath.replace(os.sep, "/")
            if regex.match(relpath):
                found.append(relpath)
    return sorted(found)


def key_of(relpath: str) -> str:
    stem, dot, suffix = relpath.rpartition(".")
    base = stem if dot and "/" not in suffix and stem and not stem.endswith("/") else relpath
    return unicodedata.normalize("NFC", base)


def find_samples(spec: Spec, progress: Callable[[int], None] | None = None) -> Discovery:
    """Pair the files of every source by key.

    Returns:
        Samples sorted by key, plus one reject per file that has no partner (``orphan``) or
        that shares its key with another file of the same source (``duplicate_key``).
    """
    # One flat dict per source (key -> relative path) keeps discovery of millions of files
    # small; the rare duplicate keys go to a side table.
    roots: Roots = tuple((source, str(src.dir)) for source, src in spec.sources.items())
    unique: dict[str, dict[str, str]] = {}
    duplicated: dict[str, dict[str, list[str]]] = {}
    seen = 0
    for source, source_spec in spec.sources.items():
        files, copies = unique.setdefault(source, {}), duplicated.setdefault(source, {})
        for relpath in list_source(source_spec.dir, source_spec.glob):
            seen += 1
            if progress is not None:
                progress(1)
            key = sys.intern(key_of(relpath))  # image and mask share one key string
            if key in copies:
                copies[key].append(relpath)
            elif key in files:
                copies[key] = [files.pop(key), relpath]
            else:
                files[key] = relpath
    samples: list[Sample] = []
    rejects: list[Reject] = []
    keys = sorted(set().union(*unique.values(), *duplicated.values()))
    for key in keys:
        sample = _pair(key, roots, unique, duplicated, rejects)
        if sample is not None:
            samples.append(sample)
    return Discovery(samples, rejects, seen)


def _pair(
    key: str,
    roots: Roots,
    unique: dict[str, dict[str, str]],
    duplicated: dict[str, dict[str, list[str]]],
    rejects: list[Reject],
) -> Sample | None:
    """The sample of one key, or None after adding its files to ``rejects``."""
    root = dict(roots)
    copies = {s: duplicated[s][key] for s, _ in roots if key in duplicated[s]}
    single = {s: unique[s][key] for s, _ in roots if key in unique[s]}

    def path(source: str, relpath: str) -> str:
        return SourceFile(source, root[source], relpath).path

    for source, relpaths in copies.items():
        detail = f"{source} has {len(relpaths)} files with key {key!r}: {', '.join(relpaths)}"
        rejects.extend(
            Reject(path(source, r), STAGE, "duplicate_key", detail, key) for r in relpaths
        )
    missing = [s for s, _ in roots if s not in single and s not in copies]
    if missing or copies:
        reason = "orphan" if missing else "duplicate_key"
        detail = (
            f"no {', '.join(missing)} file with key {key!r}"
            if missing
            else "its partner has a duplicate key"
        )
        rejects.extend(Reject(path(s, r), STAGE, reason, detail, key) for s, r in single.items())
        return None
    return Sample(key, tuple(single[s] for s, _ in roots), roots)
