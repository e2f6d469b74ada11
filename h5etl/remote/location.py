"""location: where data lives, as a small frozen record that never holds a credential.

``parse_location("s3://bucket/raw/images")`` -> ``Location("s3", "bucket", "raw/images")``; a
plain path (or ``file://``) is a ``Location("file", "", "/abs/path")``, so local folders go
through the same API. A Location pickles to a worker as three strings: the worker opens the file
system itself from the protocol and the backend's standard environment and config files
(``h5etl.remote.filesystem``). A URL that carries credentials (``s3://KEY:SECRET@bucket``, a
presigned ``https://...?X-Amz-Signature=...``) is refused, and the refusal does not repeat them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from h5etl.remote.errors import RemoteUsageError

__all__ = ["PROTOCOLS", "READ_ONLY", "Location", "is_url", "parse_location"]

# The URL schemes h5etl reads (and the name fsspec knows each by); ``az``/``abfs`` are Azure
# Blob Storage (adlfs), ``gs``/``gcs`` Google Cloud Storage (gcsfs).
PROTOCOLS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "abfs": "az",
    "https": "https",
    "http": "http",
    "file": "file",
}
READ_ONLY = frozenset({"https", "http"})  # plain web servers: sources only, never releases
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # the S3 naming rules, in short


@dataclass(frozen=True, slots=True)
class Location:
    """A folder or object: ``protocol`` (``s3``, ``gs``, ``az``, ``https``, ``file``),
    ``bucket`` (the bucket or container; the host for ``https``; empty for ``file``) and ``key``
    (the key or key prefix inside it, no leading or trailing ``/``; an absolute path for
    ``file``)."""

    protocol: str
    bucket: str
    key: str

    @property
    def is_local(self) -> bool:
        return self.protocol == "file"

    @property
    def url(self) -> str:
        """The location as a user writes it (a plain path for local ones)."""
        if self.is_local:
            return self.key
        root = f"{self.protocol}://{self.bucket}"
        return f"{root}/{self.key}" if self.key else root

    @property
    def fs_path(self) -> str:
        """The path fsspec's file system for ``protocol`` takes (bucket/key, or the URL)."""
        if self.protocol in READ_ONLY:
            return self.url
        if self.is_local:
            return self.key
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    @property
    def name(self) -> str:
        """The last part of the key: an object's file name."""
        return self.key.rstrip("/").rsplit("/", 1)[-1]

    def child(self, *parts: str) -> Location:
        """The location ``parts`` below this one (``parts`` may hold ``/``)."""
        tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
        if not tail:
            return self
        if self.is_local:
            return Location("file", "", str(Path(self.key, tail)))
        return Location(self.protocol, self.bucket, f"{self.key}/{tail}" if self.key else tail)

    def parent(self) -> Location:
        """The folder (key prefix) this object is in."""
        if self.is_local:
            return Location("file", "", str(Path(self.key).parent))
        return Location(self.protocol, self.bucket, self.key.rpartition("/")[0])

    def relative(self, other: Location) -> str:
        """``other``'s key relative to this folder (``other`` must be below it)."""
        base = self.key.rstrip("/")
        if self.is_local:
            return Path(other.key).relative_to(base).as_posix()
        return other.key[len(base) + 1 :] if base else other.key

    def __str__(self) -> str:
        return self.url


def is_url(text: str | os.PathLike[str]) -> bool:
    """Whether ``text`` names a remote location (has a scheme other than ``file://``)."""
    found = _SCHEME.match(os.fspath(text))
    return found is not None and found["scheme"].lower() != "file"


def parse_location(text: str | os.PathLike[str]) -> Location:
    """``text`` (a URL or a local path) as a Location.

    Raises:
        RemoteUsageError: an unknown scheme, a URL without a bucket, a bucket name S3 refuses,
            or a URL with credentials or a query string in it (exit code 2). The message never
            repeats the credentials.
    """
    raw = os.fspath(text)
    found = _SCHEME.match(raw)
    if found is None:
        return Location("file", "", str(Path(raw).expanduser().absolute()))
    scheme = found["scheme"].lower()
    if scheme not in PROTOCOLS:
        known = ", ".join(f"{s}://" for s in sorted(set(PROTOCOLS.values())))
        raise RemoteUsageError(f"unknown URL scheme {scheme + '://'!r}: h5etl reads {known}")
    parts = urlsplit(raw)
    shown = _without_secrets(raw, parts.netloc, parts.query)
    if "@" in parts.netloc:
        raise RemoteUsageError(
            f"{shown}: a URL must not carry credentials; give them through the backend's "
            f"environment variables or config files (e.g. AWS_ACCESS_KEY_ID, ~/.aws/credentials)"
        )
    if parts.query or parts.fragment:
        raise RemoteUsageError(
            f"{shown}: a URL with a query string is not accepted (a presigned URL carries its "
            f"credentials in it, and a release would record them); give the plain URL"
        )
    protocol = PROTOCOLS[scheme]
    if protocol == "file":
        return Location("file", "", str(Path(parts.path).absolute()))
    key = parts.path.strip("/")
    if not parts.netloc:
        raise RemoteUsageError(f"{shown}: the URL names no bucket ({scheme}://BUCKET/prefix)")
    if protocol == "s3" and not _S3_BUCKET.match(parts.netloc):
        raise RemoteUsageError(
            f"{shown}: {parts.netloc!r} is not a valid S3 bucket name (3 to 63 lower-case "
            f"letters, digits, dots and hyphens)"
        )
    return Location(protocol, parts.netloc, re.sub(r"/+", "/", key))


def _without_secrets(raw: str, netloc: str, query: str) -> str:
    """``raw`` with its user info and query string replaced by ``***``."""
    shown = raw
    if "@" in netloc:
        shown = shown.replace(netloc, "***@" + netloc.rpartition("@")[2], 1)
    if query:
        shown = shown.replace(query, "***", 1)
    return shown
