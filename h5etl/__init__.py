"""h5etl: turn folders of images and masks into versioned, checksummed HDF5 releases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from h5etl._version import __version__
from h5etl.errors import (
    BuildFailed,
    CheckFailed,
    ConfigError,
    H5EtlError,
    ReleaseError,
    SinkError,
    UsageError,
)

if TYPE_CHECKING:
    from h5etl.config.load import load_spec
    from h5etl.config.spec import Spec
    from h5etl.history.build_report import BuildReport
    from h5etl.pipeline.run import build

# The build API loads on first use: decode workers import h5etl.decode.task, and should not pay
# for pydantic and the whole pipeline (about half a CPU-second per worker).
_LAZY = {
    "BuildReport": "h5etl.history.build_report",
    "build": "h5etl.pipeline.run",
    "Spec": "h5etl.config.spec",
    "load_spec": "h5etl.config.load",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'h5etl' has no attribute {name!r}")


__all__ = [
    "BuildFailed",
    "BuildReport",
    "CheckFailed",
    "ConfigError",
    "H5EtlError",
    "ReleaseError",
    "SinkError",
    "Spec",
    "UsageError",
    "__version__",
    "build",
    "load_spec",
]
