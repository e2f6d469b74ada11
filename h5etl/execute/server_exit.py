"""Imported by the workers' fork server only (``pool.fork_server``): it ends without tearing
its interpreter down.

The server exits when the CLI that started it closes its end of the liveness pipe, and the
CLI waits for it (``pool.stop_fork_server``) so that nothing of a build outlives the command.
A normal exit freed every object of the decode stack it had imported (numpy, imagecodecs,
h5etl's kinds): 40 ms of every build's end, spent after the release was published. The server
holds no file, buffer or temporary resource of its own (its forks, the workers, exit through
``os._exit`` anyway), so it skips that teardown. Registered at import, this exit handler runs
before those registered earlier (atexit runs them last-in, first-out); the server imports it
last.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
