"""yaml_load: YAML parsed by libyaml where that is safe, by PyYAML's own parser otherwise.

libyaml's parser is about ten times faster (a small build spent a fifth of its time parsing its
config and recipe in pure Python), but it composes nested flow collections recursively in C:
``[[[[...`` a hundred thousand deep kills the process with a segmentation fault, where the
pure-Python parser raises ``RecursionError`` (which config loading reports in one line). A text
with few flow brackets cannot nest deeply enough to matter (block nesting deep enough would need
gigabytes of indentation), so it goes to libyaml; any other text to the pure parser.
"""

from __future__ import annotations

from typing import Any

import yaml

# Nesting of 10,000 parsed fine in libyaml here; it crashed between that and 100,000.
C_PARSER_MAX_BRACKETS = 2_000
C_SAFE_LOADER: type[Any] | None = getattr(yaml, "CSafeLoader", None)


def c_parser_is_safe(text: str) -> bool:
    """Whether libyaml may parse ``text``: it is there, and ``text`` cannot nest deeply."""
    return C_SAFE_LOADER is not None and (text.count("[") + text.count("{") < C_PARSER_MAX_BRACKETS)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, through libyaml when ``c_parser_is_safe``."""
    if C_SAFE_LOADER is not None and c_parser_is_safe(text):
        return yaml.load(text, Loader=C_SAFE_LOADER)
    return yaml.load(text, Loader=yaml.SafeLoader)
