"""Where the reference docs explain an error: the short, stable pointer an error line ends with.

Paths are the docs' source files from the project root (``docs/reference/rejects.md``), which a
reader finds in a checkout and the docs site serves at the same name; anchors are the reject
reason codes and the config's top-level keys, which the reference pages pin with explicit ids
(``tests/test_docs_errors.py`` checks every anchor an error can name exists).
"""

from __future__ import annotations

__all__ = ["CONFIG", "GUARD", "REJECTS", "config_key", "guard", "reject"]

_REFERENCE = "docs/reference"
REJECTS = f"{_REFERENCE}/rejects.md"
CONFIG = f"{_REFERENCE}/config.md"
_GUARD = f"{_REFERENCE}/guard.md"
GUARD = f"{_GUARD}#loss-guards"  # the publish guard: max_rejects, max_shrink, allow_empty


def guard(key: str) -> str:
    """The section of one loss guard (``max_rejects``, ``max_shrink``, ``allow_empty``)."""
    return f"{_GUARD}#{key}"


def reject(reason: str) -> str:
    """The section explaining a reject reason and what to do about it."""
    return f"{REJECTS}#{reason}"


def config_key(key: str | None) -> str | None:
    """The section of a config key (its top-level key's: ``storage.chunk_samples`` is under
    ``storage``); None for no key or one that is no config key (``--notes``): a missing file
    or a YAML syntax error is explained well enough by its own line."""
    top = (key or "").split(".", 1)[0]
    if not top or not top[0].isalpha():
        return None
    return f"{CONFIG}#{top}"
