"""direct: the workers' whole-object S3 GETs through obstore (Rust's object_store), if installed.

A decode worker reads each object of its task with one GET; through s3fs/aiobotocore a GET
costs ~1.2 ms of the worker's CPU in Python (signing, events, response parsing), as much as
decoding the PNG it fetches, on the cores the build decodes on. obstore sends the same
request from Rust for ~0.12 ms, from a thread of the worker's own. It is optional (in the
``cloud`` extra): without it, or with ``H5ETL_S3_CLIENT=s3fs``,
``h5etl.remote.objects.read_ahead`` uses s3fs as before; listing,
uploads, locks, pointers and the readers' range reads always go through s3fs.

The request is the same as s3fs's: the listed VersionId and ``If-Match`` on the listed ETag,
so the server refuses a changed object (``RemoteChanged``). Credentials come from botocore's
own chain (environment, ``AWS_PROFILE``, config files, instance metadata: what s3fs would
use), asked for again before they expire, and are never put in a message. The endpoint is
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``; failed requests are sent again as botocore's
standard mode would (``AWS_MAX_ATTEMPTS`` attempts, 3 by default).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from h5etl.remote.errors import RemoteError, object_changed
from h5etl.remote.filesystem import environment_key, problem
from h5etl.remote.location import Location

if TYPE_CHECKING:
    from obstore import GetOptions  # TypedDicts of its stubs only
    from obstore.store import S3Credential

__all__ = ["CLIENT_VARIABLE", "enabled", "get_each", "list_keys"]

CLIENT_VARIABLE = "H5ETL_S3_CLIENT"  # "s3fs": the workers' GETs through s3fs too
# Refreshable credentials (an assumed role, SSO) are asked of botocore again this often; it
# renews them itself before they expire
_CREDENTIALS_TTL = timedelta(minutes=5)
_STORES: dict[tuple[str, str, int], Any] = {}
_THREADS: dict[tuple[int, int], ThreadPoolExecutor] = {}


class Listed(Protocol):
    """An object as listed (``h5etl.remote.objects.RemoteObject``, which imports this module)."""

    @property
    def location(self) -> Location: ...
    @property
    def etag(self) -> str | None: ...
    @property
    def version_id(self) -> str | None: ...
    @property
    def url(self) -> str: ...


def enabled() -> bool:
    """Whether the workers' GETs (and the listings of buckets without versions) go through
    obstore: it is installed and not turned off."""
    if os.environ.get(CLIENT_VARIABLE, "").lower() == "s3fs":
        return False
    return importlib.util.find_spec("obstore") is not None


def get_each(
    objects: Sequence[Listed], concurrency: int
) -> list[Future[bytes | RemoteError | None]]:
    """Start a GET of each of ``objects`` (S3, as listed), ``concurrency`` at a time, in their
    order: each future gives the object's bytes, or the error its read met, or None for an
    object this client cannot ask for (no credentials found: s3fs then reads it, and says so
    in its own words). A future not yet started can be cancelled.

    Each GET is one blocking obstore call on a thread of this process's pool (obstore lets
    go of the GIL while it waits), so the caller decodes the first objects while the rest are
    on their way. Gathering obstore's coroutines on fsspec's event loop thread cost twice the
    CPU: 264 against 123 us a GET (1,024 GETs from s3rver, 64 at a call), the loop's wake-ups
    and the handoffs between the two threads."""
    import obstore

    # asked once per batch: the environment's digest costs ~25 us, a GET's CPU ~120 us
    stores = {bucket: _store(bucket) for bucket in {obj.location.bucket for obj in objects}}

    def one(obj: Listed) -> bytes | RemoteError | None:
        store = stores[obj.location.bucket]
        if store is None:
            return None
        options: GetOptions = {}
        if obj.version_id:
            options["version"] = obj.version_id  # that version's bytes, whatever came after
        if obj.etag:
            options["if_match"] = f'"{obj.etag}"'
        try:
            return bytes(obstore.get(store, obj.location.key, options=options).bytes())
        except Exception as exc:
            return _error(obj, exc)

    pool = _threads(concurrency)
    return [pool.submit(one, obj) for obj in objects]


def list_keys(
    bucket: str, prefix: str, stop: Callable[[], bool] = lambda: False
) -> list[tuple[str, int, str | None]] | None:
    """Each object under ``prefix`` of ``bucket`` (a folder: whole path segments): its key,
    size and ETag (quotes off), by one ListObjectsV2 request per 1,000; None when botocore
    finds no credentials, or once ``stop()`` (asked between requests) says so. obstore's
    errors are raised as they are."""
    pages = _pages(bucket, prefix, 1000)
    if pages is None:
        return None
    found: list[tuple[str, int, str | None]] = []
    for page in pages:
        if stop():
            return None
        for meta in page:
            etag = meta.get("e_tag")
            found.append((meta["path"], int(meta["size"]), etag.strip('"') if etag else None))
    return found


def any_key(bucket: str, prefix: str) -> bool | None:
    """Whether ``prefix`` of ``bucket`` holds an object, by one listing request (which fails
    for a missing bucket or refused credentials); None when botocore finds no credentials.
    obstore's errors are raised as they are."""
    pages = _pages(bucket, prefix, 1)
    if pages is None:
        return None
    for page in pages:
        return bool(page)
    return False


def _pages(bucket: str, prefix: str, per_page: int) -> Iterator[Sequence[Any]] | None:
    """obstore's listing of ``prefix`` in ``bucket``, ``per_page`` objects a request (a
    folder: whole path segments); None when botocore finds no credentials."""
    import obstore

    store = _store(bucket)
    if store is None:
        return None
    return iter(obstore.list(store, prefix=prefix or None, chunk_size=per_page))


def _threads(count: int) -> ThreadPoolExecutor:
    """This process's pool of ``count`` GET threads (a fork gets its own: a parent's threads
    do not exist in its child)."""
    key = (os.getpid(), count)
    pool = _THREADS.get(key)
    if pool is None:
        _THREADS.clear()  # a forked child's copy of its parent's pool, or another size
        pool = _THREADS[key] = ThreadPoolExecutor(count, thread_name_prefix="h5etl-get")
    return pool


def _error(obj: Listed, exc: Exception) -> RemoteError:
    """obstore's error as ``read_ahead``'s: a changed or vanished object, else ``problem``."""
    # obstore raises FileNotFoundError for a 404 (its NotFoundError for other not-founds)
    gone = isinstance(exc, FileNotFoundError) or type(exc).__name__ == "NotFoundError"
    if gone or type(exc).__name__ == "PreconditionError" or "NoSuchVersion" in str(exc):
        return object_changed(obj.url, "its ETag or version is no longer the listed one")
    return problem(exc, obj.location, "read")


def _store(bucket: str) -> Any:
    """The obstore S3Store of ``bucket`` for this process and environment, or None when
    botocore finds no credentials."""
    key = (bucket, environment_key(), os.getpid())
    if key not in _STORES:
        if len(_STORES) >= 8:  # environments come and go in tests, never many in a build
            _STORES.clear()
        _STORES[key] = _open(bucket)
    return _STORES[key]


def _open(bucket: str) -> Any:
    import botocore.session
    from obstore.store import S3Store

    session = botocore.session.get_session()
    if session.get_credentials() is None:
        return None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or 3)
    config: dict[str, Any] = {"region": session.get_config_variable("region") or "us-east-1"}
    if endpoint:
        config["endpoint"] = endpoint
    return S3Store(
        bucket,
        config=config,  # type: ignore[arg-type]
        client_options={
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "connect_timeout": timedelta(seconds=10),
        },
        retry_config={
            "max_retries": max(attempts - 1, 0),
            "backoff": {"init_backoff": timedelta(milliseconds=100), "base": 2},
            "retry_timeout": timedelta(seconds=60),
        },
        credential_provider=_Credentials(session),
    )


class _Credentials:
    """obstore's credential callback: botocore's credentials as they are now."""

    def __init__(self, session: Any):
        self.session = session

    def __call__(self) -> S3Credential:
        credentials = self.session.get_credentials()
        frozen = credentials.get_frozen_credentials()
        refreshable = hasattr(credentials, "refresh_needed")
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + _CREDENTIALS_TTL if refreshable else None,
        }
