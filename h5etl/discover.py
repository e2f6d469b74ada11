"""discover: walk each source folder, pair files across sources by key, report orphans.

A key is a file's path relative to its source dir, without suffix, Unicode-normalised (NFC).
Hidden files and folders are ignored; symlinked folders are not walked (no loops); symlinked
files are kept so that clean can follow or reject them. Output is sorted by key.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from h5etl.records import Reject, Sample, SourceFile
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
    by_key: dict[str, dict[str, list[SourceFile]]] = defaultdict(lambda: defaultdict(list))
    seen = 0
    for source, source_spec in spec.sources.items():
        root = str(source_spec.dir)
        for relpath in list_source(source_spec.dir, source_spec.glob):
            seen += 1
            if progress is not None:
                progress(1)
            by_key[key_of(relpath)][source].append(SourceFile(source, root, relpath))
    samples: list[Sample] = []
    rejects: list[Reject] = []
    for key in sorted(by_key):
        files = by_key[key]
        duplicated = {s: f for s, f in files.items() if len(f) > 1}
        for source, copies in sorted(duplicated.items()):
            names = ", ".join(f.relpath for f in copies)
            rejects.extend(
                Reject(
                    f.path,
                    STAGE,
                    "duplicate_key",
                    f"{source} has {len(copies)} files with key {key!r}: {names}",
                    key,
                )
                for f in copies
            )
        unique = {s: f[0] for s, f in files.items() if s not in duplicated}
        missing = [s for s in spec.sources if s not in files]
        if duplicated or missing:
            if missing:
                rejects.extend(
                    Reject(
                        f.path,
                        STAGE,
                        "orphan",
                        f"no {', '.join(missing)} file with key {key!r}",
                        key,
                    )
                    for f in unique.values()
                )
            else:
                rejects.extend(
                    Reject(f.path, STAGE, "duplicate_key", "its partner has a duplicate key", key)
                    for f in unique.values()
                )
            continue
        samples.append(Sample(key, tuple(unique[s] for s in spec.sources)))
    return Discovery(samples, rejects, seen)
