"""remote: sources and releases on object storage (S3-compatible; also gs://, az://, https://).

Worker side: never imports the config or pydantic, and opens its file systems itself from a
``Location`` (three strings, no credential). fsspec and its backends are the optional ``cloud``
extra, imported on first use.

The names below load their module when first asked for: importing ``h5etl.remote.location``
(the CLI does, to tell a URL from a folder) does not import the readers and their clients
(``objects`` and its clients: about 2 ms of every command's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from h5etl.remote.location import Location, is_url, parse_location
    from h5etl.remote.objects import RemoteObject, list_objects, read_bytes, stat_object

__all__ = [
    "Location",
    "RemoteObject",
    "is_url",
    "list_objects",
    "parse_location",
    "read_bytes",
    "stat_object",
]

_MODULE_OF = {
    "Location": "location",
    "is_url": "location",
    "parse_location": "location",
    "RemoteObject": "objects",
    "list_objects": "objects",
    "read_bytes": "objects",
    "stat_object": "objects",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:  # a submodule not imported yet: the import system imports it
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
