"""buckets: what a build asks of an S3 bucket before it lists it, asked once.

A build checks each source's bucket when it loads its config (``objects.reachable``: a config
error, exit 2, before any work), and again before listing each source, where it also asks
whether the bucket may hold versions (``objects.list_objects``). Two sources in one bucket
made four HeadBucket and two GetBucketVersioning requests before the two listings; the three
and the one asked again took about 0.35 s of a single-threaded local server (s3rver: 0.09 and
0.08 s a request), and are round trips before the first task on S3.

The answers are kept per bucket and credentials for ``FRESH_SECONDS``: long enough for one
build's start, short enough that a later build in the same process (a notebook's) asks again.
A failed request keeps nothing: the next caller asks, and words its own error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from h5etl.remote.filesystem import environment_key

FRESH_SECONDS = 30.0

T = TypeVar("T")

_LOCK = threading.Lock()
_ASKED: dict[tuple[str, str, str], tuple[float, Future[object]]] = {}


def check_exists(bucket: str, ask: Callable[[], object]) -> None:
    """``ask()`` whether ``bucket`` exists and the credentials may list it (raising if not),
    unless it answered yes in the last ``FRESH_SECONDS``."""
    _once("exists", bucket, ask)


def may_hold_versions(bucket: str, ask: Callable[[], bool]) -> bool:
    """``ask()``'s answer whether ``bucket``'s versioning is, or was, on, kept as above."""
    return bool(_once("versions", bucket, ask))


def forget() -> None:
    """Keep no answer (a test that changes a bucket between two builds)."""
    with _LOCK:
        _ASKED.clear()


def _once(question: str, bucket: str, ask: Callable[[], T]) -> T:
    """``ask()``'s answer, shared with the callers asking the same of the same bucket under
    the same credentials within ``FRESH_SECONDS`` (those asking meanwhile wait for it)."""
    key = (question, bucket, environment_key())
    now = time.monotonic()
    with _LOCK:
        kept = _ASKED.get(key)
        mine = kept is None or now - kept[0] > FRESH_SECONDS
        if mine:
            answer: Future[object] = Future()
            _ASKED[key] = (now, answer)
        else:
            assert kept is not None
            answer = kept[1]
    if mine:
        try:
            answer.set_result(ask())
        except BaseException as exc:
            with _LOCK:
                if _ASKED.get(key, (0.0, None))[1] is answer:
                    del _ASKED[key]
            answer.set_exception(exc)
    return answer.result()  # type: ignore[return-value]
