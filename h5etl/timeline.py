"""timeline: when each step of a build happened, in every process (a debugging aid).

Off unless the environment variable ``H5ETL_TIMELINE`` names a file; then every process of a
build (the CLI and its workers, which inherit the variable) appends one line per ``mark``:
``<seconds> <pid> <event>``, on the boot-time clock, which all processes share and the
kernel's process start times use too; each process's first line is its own start
(``process start``). ``tests/benchmarks/timeline.py`` runs a build this way and prints the
timeline. Marks cost one ``open``/``write`` each when on, one dictionary lookup when off.
"""

from __future__ import annotations

import os
import time

ENV = "H5ETL_TIMELINE"
START = "process start"

# CLOCK_BOOTTIME counts from the boot as /proc/<pid>/stat's start times do; elsewhere the
# monotonic clock still orders one machine's processes.
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_seen: set[str] = set()


def now() -> float:
    """The timeline's clock, in seconds."""
    return time.clock_gettime(_CLOCK)


def process_start(pid: int | str = "self") -> float | None:
    """When process ``pid`` started on the timeline's clock (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def mark(event: str, *, once: bool = False) -> None:
    """Note ``event`` now, if the timeline is on; ``once``: only its first time here."""
    path = os.environ.get(ENV)
    if not path or (once and event in _seen):
        return
    lines = ""
    if not _seen:
        started = process_start()
        if started is not None:
            lines = f"{started:.6f} {os.getpid()} {START}\n"
    _seen.add(event)
    lines += f"{now():.6f} {os.getpid()} {event}\n"
    # O_APPEND: the lines of all processes interleave whole
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)
