"""extras: the optional libraries some inputs are read with, and the extra that installs each.

A kind names the optional modules its workers import (``Kind.optional_modules``); whether
they are installed is found here without importing them (``importlib.util.find_spec``), so
``validate``, every build and dry run and ``demo`` can refuse a config whose libraries are
missing in one line, before any work (``h5etl.plan.kind_registry.check_installed``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

EXTRA_OF = {"pydicom": "medical", "nibabel": "medical", "scipy": "medical"}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found on the path; not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked import, or a None left in sys.modules
        return False


def install_hint(modules: Iterable[str]) -> str:
    """``pip install 'h5etl[medical]'``: what installs ``modules``."""
    extras = sorted({EXTRA_OF[m] for m in modules if m in EXTRA_OF})
    if not extras:
        return "pip install " + " ".join(sorted(modules))
    return f"pip install 'h5etl[{','.join(extras)}]'"
