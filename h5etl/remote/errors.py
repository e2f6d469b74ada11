"""errors: what object storage adds to h5etl's error tree (``h5etl.errors``).

::

    H5EtlError
    └── RemoteError                 the object store failed a request (unreachable, I/O);
        │                           exit code 1
        ├── RemoteChanged           an object changed between listing and reading it (its
        │                           ETag or version is not the listed one); exit code 1
        ├── RemoteReadFailed        (also ReaderError) a reader's range read failed every
        │                           attempt (the server stopped mid-read); exit code 1
        └── RemoteUsageError        (also UsageError) an unknown scheme, a URL with
            │                       credentials, no such bucket or object; exit code 2
            └── RemoteAccessDenied  the store refused the credentials it was given; exit
                                    code 2

Every message names the URL and never a credential: texts that come from the backend pass
through ``h5etl.remote.filesystem.scrub`` first.
"""

from __future__ import annotations

from h5etl.errors import H5EtlError, ReaderError, UsageError

__all__ = [
    "RemoteAccessDenied",
    "RemoteChanged",
    "RemoteError",
    "RemoteReadFailed",
    "RemoteUsageError",
    "object_changed",
]


class RemoteError(H5EtlError):
    """A request to the object store failed (the server unreachable, an I/O error)."""


class RemoteChanged(RemoteError):
    """An object changed during the build: its ETag or version is not the one listed."""


class RemoteReadFailed(RemoteError, ReaderError):
    """A reader's range read failed however many times it was sent (the server is gone)."""

    exit_code = 1


class RemoteUsageError(RemoteError, UsageError):
    """The URL names something that is not there or cannot be used; nothing was done."""

    exit_code = 2


class RemoteAccessDenied(RemoteUsageError):
    """The object store refused the credentials of the environment or config files."""


def object_changed(url: str, how: str) -> RemoteChanged:
    """The error of an object ``url`` whose read found it changed since it was listed."""
    return RemoteChanged(
        f"the object changed during the build ({how}); nothing from it was used: build again "
        f"once the uploads to that prefix are done",
        path=url,
    )
