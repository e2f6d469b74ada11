"""filesystem: the fsspec file system for a Location, opened in the process that uses it.

fsspec and its backends (s3fs for ``s3://``; gcsfs, adlfs for ``gs://``, ``az://``) are the
optional ``cloud`` extra, imported here on first use; without them a URL is refused in one line
naming ``pip install 'h5etl[cloud]'``. Credentials are never passed in: each backend finds them
in its standard environment variables and config files (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/credentials``, ``AWS_ENDPOINT_URL`` for a
non-AWS server), so a Location pickles to a worker without them and every process opens its own
file system. Errors of the backends become one line through ``problem``, which never repeats a
credential (``scrub``).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from h5etl.remote.errors import RemoteAccessDenied, RemoteError, RemoteUsageError
from h5etl.remote.location import Location

__all__ = [
    "EXTRA",
    "FileSystem",
    "client_code",
    "environment_key",
    "filesystem",
    "problem",
    "run",
    "scrub",
]

EXTRA = "pip install 'h5etl[cloud]'"
FileSystem = Any  # an fsspec AbstractFileSystem (fsspec ships no type hints)
T = TypeVar("T")

# The library each protocol's fsspec file system needs, and the extra that installs it
_BACKEND = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "https": "aiohttp", "http": "aiohttp"}
# The environment a backend reads its credentials and endpoint from: a change of any of them
# opens a new file system (a test's wrong credentials; a rotated token in a long-lived worker)
_ENVIRONMENT = re.compile(r"^(AWS_|GOOGLE_|GCS_|AZURE_|FSSPEC_)")
_SECRET_NAME = re.compile(r"(SECRET|KEY|TOKEN|PASSWORD|CONNECTION_STRING|SAS|CREDENTIAL)")
# What a server may echo of a signed request
_SIGNED = re.compile(r"(Credential|Signature|X-Amz-Security-Token|AWSAccessKeyId)=[^&\s,\"']+")
_USERINFO = re.compile(r"://[^/@\s]+@")  # an endpoint URL with a user and password in it
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
    "AllAccessDisabled",
}
# botocore's errors for credentials it cannot find at all (no request was sent)
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
_GONE = {"NoSuchBucket", "NoSuchKey", "NoSuchVersion", "404"}
# obstore's (h5etl.remote.direct) errors for the same, by class name
_DENIED_CLASSES = {"PermissionDeniedError", "UnauthenticatedError"}
_OPEN: dict[tuple[str, str, int, bool], FileSystem] = {}


def filesystem(location: Location, *, versioned: bool = True) -> FileSystem:
    """The fsspec file system that reads and writes ``location``, opened in this process.

    One per protocol, environment and process: a forked worker opens its own (a file system's
    event loop thread does not survive a fork), as does a changed environment. ``versioned``
    False lists S3 without versions (ListObjectsV2), for servers that have no
    ListObjectVersions (``list_objects``).

    Raises:
        RemoteUsageError: fsspec or the protocol's backend is not installed (exit code 2).
    """
    key = (location.protocol, environment_key(), os.getpid(), versioned)
    if key not in _OPEN:
        if len(_OPEN) >= 8:  # environments come and go in tests, never many in a build
            _OPEN.clear()
        _OPEN[key] = _open(location, versioned)
    return _OPEN[key]


def environment_key() -> str:
    """A digest of the environment the backends read credentials and endpoints from: a
    client opened under another one is not reused."""
    return hashlib.sha256(
        repr(sorted((k, v) for k, v in os.environ.items() if _ENVIRONMENT.match(k))).encode()
    ).hexdigest()


def _open(location: Location, versioned: bool = True) -> FileSystem:
    fsspec = _imported("fsspec", location)
    if location.protocol in _BACKEND:
        _imported(_BACKEND[location.protocol], location)
    if location.protocol == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return fsspec.filesystem(
            "s3",
            # the VersionId of each object in listings and reads, in a versioned bucket
            version_aware=versioned,
            # a listing is always asked anew: a cached one would hide a changed object
            use_listings_cache=False,
            skip_instance_cache=True,
            endpoint_url=endpoint,
            config_kwargs={"retries": _retries(), "connect_timeout": 10},
        )
    return fsspec.filesystem(location.protocol, skip_instance_cache=True)


def _retries() -> dict[str, Any]:
    """botocore's retries of one request: three in its standard mode, unless the environment
    says otherwise (``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``, as for every AWS tool: a
    setting passed here would override them)."""
    retries: dict[str, Any] = {}
    if not os.environ.get("AWS_MAX_ATTEMPTS"):
        retries["max_attempts"] = 3
    if not os.environ.get("AWS_RETRY_MODE"):
        retries["mode"] = "standard"
    return retries


def check_installed(location: Location) -> None:
    """That fsspec and ``location``'s backend can be imported, without importing them (s3fs
    takes 0.17 s of CPU).

    Raises:
        RemoteUsageError: one is missing, as ``filesystem`` would raise it.
    """
    for module in ("fsspec", _BACKEND.get(location.protocol)):
        if module is not None and importlib.util.find_spec(module) is None:
            _imported(module, location)  # raises, naming the extra


def _imported(module: str, location: Location) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RemoteUsageError(
            f"reading {location.protocol}:// needs {module} (the cloud extra): {EXTRA}",
            path=location.url,
        ) from exc


def run(fs: FileSystem, func: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kw: Any) -> T:
    """Run the coroutine function ``func`` on ``fs``'s event loop (an async fsspec file system)
    and return its result: for the S3 requests s3fs has no method for (conditional ones)."""
    from fsspec.asyn import sync

    result: T = sync(fs.loop, func, *args, **kw)
    return result


def scrub(text: str) -> str:
    """``text`` with every credential of the environment, and whatever a server echoes of a
    signed request, replaced by ``***``."""
    for name, value in os.environ.items():
        if _ENVIRONMENT.match(name) and _SECRET_NAME.search(name) and len(value) >= 4:
            text = text.replace(value, "***")
    text = _USERINFO.sub("://***@", text)
    return _SIGNED.sub(lambda m: f"{m[1]}=***", text)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, nearest first (s3fs re-raises botocore's errors ``from`` them)."""
    found = [exc]
    while len(found) < 8 and (cause := found[-1].__cause__ or found[-1].__context__):
        found.append(cause)
    return found


def client_code(exc: BaseException) -> str | None:
    """The S3 error code (``NoSuchKey``, ``PreconditionFailed``) behind ``exc``, found along its
    causes (s3fs turns botocore's ClientError into an OSError ``from`` it)."""
    for seen in _chain(exc):
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code else None
    return None


def problem(
    exc: BaseException, location: Location, doing: str, missing: str = "no such object or prefix"
) -> RemoteError:
    """One line for a failed request ``doing`` (``"list"``, ``"read"``) on ``location``: what
    went wrong and what to do, as the error class the CLI gives its exit code by; ``missing``
    says what a not-found answer means."""
    code = client_code(exc)
    url = location.url
    if _NO_CREDENTIALS & {type(e).__name__ for e in _chain(exc)}:
        return RemoteAccessDenied(
            f"cannot {doing}: no {location.protocol} credentials found; set them in the "
            f"environment or the backend's config files (for S3: AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials)",
            path=url,
        )
    if code in _DENIED or isinstance(exc, PermissionError) or type(exc).__name__ in _DENIED_CLASSES:
        return RemoteAccessDenied(
            f"cannot {doing}: the server refused the credentials ({code or 'access denied'}); "
            f"check the {location.protocol} credentials in the environment or config files",
            path=url,
        )
    if code == "NoSuchBucket":
        return RemoteUsageError(f"cannot {doing}: no such bucket {location.bucket!r}", path=url)
    if code in _GONE or isinstance(exc, FileNotFoundError):
        return RemoteUsageError(f"cannot {doing}: {missing}", path=url)
    if getattr(exc, "errno", None) == errno.ENOSPC:
        return RemoteError(f"cannot {doing}: no space left on the local disk", path=url)
    # obstore's messages go on with a "Debug source:" chain of their causes after a blank line
    text = scrub(" ".join(str(exc).split("\n\n")[0].split())) or type(exc).__name__
    return RemoteError(f"cannot {doing}: {code + ': ' if code else ''}{text}", path=url)
