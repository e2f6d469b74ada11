"""Pauses of garbage collection are counted for the whole process (``h5etl.collection``):
the CLI's start and remote reads hold them, and collection comes back with the last."""

from __future__ import annotations

import gc
import subprocess
import sys

from h5etl import collection


def test_collection_comes_back_with_the_last_pause() -> None:
    assert gc.isenabled()
    collection.hold()
    with collection.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the first pause still holds
    collection.release()
    assert gc.isenabled()


def test_a_collection_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collection.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


INTERLEAVED = """
import gc
from h5etl import collection
from h5etl.cli import early
early.pause_collection()  # the CLI's start
collection.hold()  # a remote read begins
early.resume_collection()  # the build decodes: the read still waits
print(gc.isenabled())
collection.release()  # the read ends
print(gc.isenabled())
"""


def test_a_read_that_outlives_the_clis_start_keeps_collection_off_until_it_ends() -> None:
    # in a process of its own: the CLI's resume freezes the heap
    done = subprocess.run(
        [sys.executable, "-c", INTERLEAVED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
