"""clock: the one clock a release stores, and where ``SOURCE_DATE_EPOCH`` sets it.

Two builds of the same inputs and config write the same bytes but for ``created_at``; with
``SOURCE_DATE_EPOCH`` set (reproducible-builds.org: whole seconds since 1970-01-01 UTC),
``created_at`` is that time and the files are identical. Everything else that depends on the
moment or the machine (stage timings, ``--jobs``, the host) is a build fact: it goes to the
``<name>-vNNNN.build.json`` beside the release, never into the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime

from h5etl.errors import ConfigError

__all__ = ["ENV", "created_at", "iso", "source_date_epoch"]

ENV = "SOURCE_DATE_EPOCH"
_LATEST = 253402300799  # 9999-12-31T23:59:59Z: the stamp keeps its 20 characters


def source_date_epoch(environ: Mapping[str, str] | None = None) -> datetime | None:
    """The time ``SOURCE_DATE_EPOCH`` fixes, or None when it is unset or empty.

    Raises:
        ConfigError: it is set to anything but whole seconds in 0..253402300799 (the
            specification asks a build to fail on a malformed value rather than ignore it).
    """
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) > _LATEST:
        raise ConfigError(
            f"must be whole seconds since 1970-01-01 UTC, from 0 to {_LATEST} (as "
            f"`date +%s` prints), got {value!r}; unset it to stamp the build's own time",
            key=ENV,
        )
    return datetime.fromtimestamp(int(value), UTC)


def iso(moment: datetime) -> str:
    """``2026-12-01T10:34:18Z``: UTC, whole seconds."""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def created_at(epoch: datetime | None) -> str:
    """The ``created_at`` a release stores: ``epoch`` if given, else now."""
    return iso(epoch if epoch is not None else datetime.now(UTC))
