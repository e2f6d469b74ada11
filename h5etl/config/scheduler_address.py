"""scheduler_address: whether a Dask scheduler address can work, decided without connecting.

Standard library only: the config (``sections``), the CLI and the cluster connection
(``h5etl.execute.dask_cluster``, which workers import too) all check with it.
"""

from __future__ import annotations

import re

LOCAL = "local"
# The schemes dask.distributed knows without a plugin, whose addresses are host:port (inproc
# addresses name a process and a number: only its own process can reach one).
HOST_PORT_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def scheduler_problem(address: str) -> str | None:
    """What is wrong with ``address`` as a Dask scheduler's (None: nothing), found without
    connecting: a scheme distributed does not know (a typo such as ``tpc://`` made the client
    wait 20 s before it failed with a traceback), or no ``host:port`` after it."""
    if address == LOCAL:
        return None
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address  # distributed's default scheme
    builtin = (*HOST_PORT_SCHEMES, "inproc")
    if scheme not in builtin and scheme not in (plugins := _plugin_schemes()):
        known = (*builtin, *plugins)
        return (
            f"unknown scheme {scheme!r} in {address!r} (Dask knows {', '.join(known)}); "
            f"give tcp://host:8786 (what `dask scheduler` prints) or local"
        )
    if scheme not in HOST_PORT_SCHEMES:
        return None if rest.strip() and not any(c.isspace() for c in rest) else _no_address(address)
    shape = _HOST_PORT.match(rest)
    if shape is None or not 0 < int(shape[2]) < 65536:
        return _no_address(address)
    return None


def _no_address(address: str) -> str:
    return (
        f"not a scheduler address: {address!r}; give tcp://host:8786 (what `dask scheduler` "
        f"prints, a port in 1-65535) or local"
    )


def _plugin_schemes() -> tuple[str, ...]:
    """Schemes a package adds to distributed (its ``distributed.comm.backends`` entry
    points), read from the installed packages' metadata without importing distributed."""
    from importlib.metadata import entry_points

    return tuple(sorted(point.name for point in entry_points(group="distributed.comm.backends")))
