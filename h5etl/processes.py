"""processes: whether a process of this host is alive (locks, status files, shared memory and
orphaned workers all ask the same question)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists and has not ended (another user's counts
    as alive). A zombie has ended: a process killed under ``subprocess.run(...,
    capture_output=True)`` stays one until its children close the output pipes it shares with
    them, and they waited for it to end."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]  # after the command's name
    except (OSError, IndexError):  # no /proc (not Linux), or it ended meanwhile
        return False
    return state in (b"Z", b"X")
