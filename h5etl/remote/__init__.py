"""remote: sources and releases on object storage (S3-compatible; also gs://, az://, https://).

Worker side: never imports the config or pydantic, and opens its file systems itself from a
``Location`` (three strings, no credential). fsspec and its backends are the optional ``cloud``
extra, imported on first use.
"""

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
