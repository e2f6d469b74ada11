"""How the ``h5etl`` command ends once its work is done: without tearing the interpreter down.

After a build, the interpreter's own teardown (clearing every module and freeing the objects
the imports, the config and the plan made) took 28-30 ms between the command's return and the
process's end (3,000 pairs, 7 builds; its exit handlers took under 1 ms of it), longer than
the release's publish. The command ends as the interpreter would, up to that teardown: the
threads are done, the exit handlers run (the workers stopped, multiprocessing's and logging's
own), the output is flushed, and then ``os._exit``. Only where nothing can be lost by it: the
command succeeded, no thread other than the main one is left to join, and no HDF5 file is
open (HDF5 flushes an open one at its close, which ``os._exit`` skips). Anything else ends the
usual way. Only the console script ends so: a process that calls ``h5etl.cli.app.main`` (a
test) goes on.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: object) -> None:
    """End the process with ``code`` at once if that loses nothing (see the module's
    docstring); otherwise return, and the caller exits the usual way."""
    if code not in (0, None) or not _nothing_to_lose():
        return
    atexit._run_exitfuncs()  # the handlers, as the interpreter runs them (and clears them)
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # its descriptor was closed when the process started
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: the usual exit says so
            return
    os._exit(0)


def _nothing_to_lose() -> bool:
    """No thread but this one alive (daemon threads are dropped at exit anyway) and no HDF5
    file open, nor any of its datasets, groups or attributes (``fileinfo.files_open``)."""
    main = threading.main_thread()
    if threading.current_thread() is not main:
        return False
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main):
        return False
    if "h5py" not in sys.modules:
        return True
    from h5etl.format import fileinfo  # h5py is loaded already (hdf5plugin, if not yet)

    return fileinfo.files_open() == 0
