"""remote_files: input files on object storage (``s3://``, ``gs://``, ``az://``, ``https://``),
as discover lists them and a worker reads them.

A source whose ``dir`` is a URL is listed once, in the build's parent, through
``h5etl.remote.list_objects``: each object's stamp (size, ETag, VersionId; never a modification
time) becomes its file's stamp in the plan (``Plan.stamps``), and a decode task carries its
samples' stamps (``DecodeTask.stamps``). A worker (a loky process, a thread, a Dask worker on
another host) reads each object itself from its URL and that stamp: the request names the listed
version or carries ``If-Match`` on the listed ETag, so an object replaced since the listing is
refused by the server and its sample rejected as ``changed_during_build``, never mixed in.
Credentials are never carried: each process opens its file system from the standard
environment (``h5etl.remote.filesystem``).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator, Sequence

from h5etl.errors import RejectError
from h5etl.inputs.urls import is_remote
from h5etl.remote import Location, RemoteObject, list_objects, parse_location, read_bytes
from h5etl.remote.errors import RemoteChanged, RemoteError, RemoteUsageError
from h5etl.remote.objects import Reading, read_ahead, stat_object

__all__ = [
    "fetched",
    "list_folder",
    "object_of",
    "read_remote",
    "remember",
    "remember_stamps",
    "stamp_of",
]

_STAMP = re.compile(r"^size=(\d+);etag=([^;]*)(?:;version=(.*))?$")
# What this process listed (discover, in the parent; threads there stamp from it): URL -> object
_LISTED: dict[str, RemoteObject] = {}
_LOCK = threading.Lock()
# Per thread (the in-process decoders are threads): the objects of the task being decoded,
# read ahead of decoding (``fetched``): URL -> its read
_AHEAD = threading.local()


def list_folder(folder: str) -> list[RemoteObject]:
    """The objects under the source folder URL ``folder``, remembered for stamping.

    Raises:
        RemoteUsageError: no such bucket, refused credentials, the extra missing (exit 2).
        RemoteError: the server failed the listing.
    """
    found = list_objects(parse_location(folder))
    remember(found)
    return found


def remember(objects: Iterable[RemoteObject]) -> None:
    with _LOCK:
        if len(_LISTED) > 4_000_000:  # a long-lived process listing build after build
            _LISTED.clear()
        _LISTED.update((obj.url, obj) for obj in objects)


def remember_stamps(paths: Iterable[str], stamps: str) -> None:
    """Remember each object of ``paths`` as its stamp in ``stamps`` (a sample's, as the plan
    joins them: one per file, comma-separated) says it was listed: a worker's reads of it
    (its own, or a kind's that opens its file itself) then get exactly those bytes."""
    for path, stamp in zip(paths, stamps.split(","), strict=False):
        if not is_remote(path):
            continue
        listed = _LISTED.get(path)
        if listed is None or listed.stamp != stamp:
            remember([object_of(path, stamp)])


def stamp_of(url: str) -> str:
    """The stamp of the object ``url`` as listed by this process (else asked of the store).

    Raises:
        RejectError: ``unreadable``: the object is gone or cannot be asked for.
    """
    listed = _LISTED.get(url)
    if listed is not None:
        return listed.stamp
    try:
        return stat_object(parse_location(url)).stamp
    except RemoteError as exc:
        raise RejectError("unreadable", exc.message, path=url) from exc


def object_of(url: str, stamp: str | None) -> RemoteObject:
    """The object ``url`` as its stamp (``RemoteObject.stamp``) says it was listed."""
    listed = _LISTED.get(url)
    if listed is not None and (stamp is None or listed.stamp == stamp):
        return listed
    found = _STAMP.match(stamp or "")
    location: Location = parse_location(url)
    if found is None:  # no stamp at hand (a dry run's header probe): the object as it is now
        return stat_object(location)
    size, etag, version = found.groups()
    return RemoteObject(location, int(size), etag or None, version or None)


@contextlib.contextmanager
def fetched(samples: Iterable[tuple[Sequence[str], str]]) -> Iterator[None]:
    """Within: the objects of ``samples`` (each sample's paths and stamps) are being read, as
    listed, concurrently and in order, and ``read_remote`` takes each from its read: a
    worker waits for a round trip per batch of requests, not per object (on S3 a request
    costs tens of ms, a PNG's decode one), and decodes the first samples while the rest
    arrive. On leaving, reads not yet sent are dropped, and the bytes of those not taken."""
    wanted: dict[str, RemoteObject] = {}
    for paths, stamps in samples:
        remember_stamps(paths, stamps)
        wanted.update((path, _LISTED[path]) for path in paths if path in _LISTED)
    found: dict[str, Reading] = dict(zip(wanted, read_ahead(list(wanted.values())), strict=True))
    _AHEAD.found = found
    try:
        yield
    finally:
        _AHEAD.found = {}
        for reading in found.values():
            reading.cancel()


def read_remote(url: str, stamp: str | None = None) -> bytes:
    """All bytes of the object ``url``, exactly as listed with ``stamp``.

    Raises:
        RejectError: ``changed_during_build`` when the object was replaced or deleted since it
            was listed; ``unreadable`` when the store fails the read.
        RemoteUsageError: the credentials are refused or the extra is missing: no sample could
            be read, so the build stops in one line (exit 2) instead of rejecting every one.
    """
    try:
        ahead: Reading | None = getattr(_AHEAD, "found", {}).pop(url, None)
        got = ahead.wait() if ahead is not None else read_bytes(object_of(url, stamp))
        if isinstance(got, RemoteError):
            raise got
        return got
    except RemoteChanged as exc:
        raise RejectError("changed_during_build", exc.message, path=url) from exc
    except RemoteUsageError as exc:
        if "no such object" in exc.message:
            gone = f"it is gone since it was listed: {exc.message}"
            raise RejectError("changed_during_build", gone, path=url) from exc
        raise
    except RemoteError as exc:
        raise RejectError("unreadable", exc.message, path=url) from exc
