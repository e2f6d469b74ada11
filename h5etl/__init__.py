"""h5etl: turn folders of images and masks into versioned, checksummed HDF5 releases."""

from __future__ import annotations

__version__ = "0.1.0"

from h5etl.errors import (
    BuildFailed,
    CheckFailed,
    ConfigError,
    H5EtlError,
    ReleaseError,
    SinkError,
)
from h5etl.pipeline import BuildReport, build
from h5etl.spec import Spec, load_spec

__all__ = [
    "BuildFailed",
    "BuildReport",
    "CheckFailed",
    "ConfigError",
    "H5EtlError",
    "ReleaseError",
    "SinkError",
    "Spec",
    "__version__",
    "build",
    "load_spec",
]
