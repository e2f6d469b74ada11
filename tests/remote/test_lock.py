"""The build lock of a release on object storage (``h5etl.remote.lock``): one build at a time,
a dead holder's lock taken, a holder elsewhere respected."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from s3_server import Bucket

from h5etl.errors import LockHeld
from h5etl.remote.lock import RemoteLock


def dead_pid() -> int:
    """The pid of a process of this host that has ended."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_a_second_build_of_one_name_is_refused_while_the_first_holds_the_lock(
    s3: Bucket,
) -> None:
    output = s3.location("releases")
    with RemoteLock(output, "cells").held():
        holder = json.loads(s3.get("releases/.cells.lock"))
        assert holder["host"] == socket.gethostname()
        with (
            pytest.raises(LockHeld, match="another build of 'cells' is running") as caught,
            RemoteLock(output, "cells").held(),
        ):
            pytest.fail("a second build got the lock")
        assert str(caught.value).startswith(f"s3://{s3.name}/releases/.cells.lock: ")
        with RemoteLock(output, "nuclei").held():  # another name is another lock
            pass
    assert s3.keys() == []  # released: the next build goes ahead
    with RemoteLock(output, "cells").held():
        pass


def test_the_lock_of_a_dead_build_on_this_host_is_taken(s3: Bucket) -> None:
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00"}
    s3.put("releases/.cells.lock", json.dumps(stale).encode())
    with RemoteLock(s3.location("releases"), "cells").held():
        assert json.loads(s3.get("releases/.cells.lock"))["pid"] != stale["pid"]
    assert s3.keys() == []


def test_a_lock_held_on_another_host_counts(s3: Bucket) -> None:
    elsewhere = {"pid": dead_pid(), "host": "elsewhere.invalid", "started": "2026-01-01T00:00"}
    s3.put("releases/.cells.lock", json.dumps(elsewhere).encode())
    with (
        pytest.raises(LockHeld, match=r"on elsewhere\.invalid.*delete the lock object"),
        RemoteLock(s3.location("releases"), "cells").held(),
    ):
        pytest.fail("took a lock whose holder cannot be seen")
    assert s3.keys() == ["releases/.cells.lock"]  # left as it was


def test_a_holder_never_deletes_a_lock_it_no_longer_holds(s3: Bucket) -> None:
    with RemoteLock(s3.location("releases"), "cells").held():
        s3.put("releases/.cells.lock", b'{"pid": 1, "host": "elsewhere.invalid"}')  # broken
    assert s3.keys() == ["releases/.cells.lock"]
