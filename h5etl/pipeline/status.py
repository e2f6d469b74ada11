"""status: a build's progress in a small JSON file beside its releases, for ``h5etl status``.

A real build (not a dry run) keeps ``<output>/<name>.status.json`` up to date once it holds
the lock: its stage, samples stored per split, the rate, an ETA and the rejects so far, at
most ``WRITES_PER_SECOND`` times a second (and at every stage change), then its outcome. The
file is replaced atomically (``release.OutputFolder.write_status``), so a reader in another
terminal, or on another machine sharing the folder, needs neither HDF5 nor the lock. Writing
it never fails a build: a status that cannot be written is logged (``-v``) and skipped, and
if the outcome cannot be written the stale status is removed. The pipeline
feeds it (progress hook, plan, stored batches, outcome); the sink knows nothing of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5etl.errors import H5EtlError, UsageError
from h5etl.history import clock as build_clock
from h5etl.pipeline import interrupts
from h5etl.processes import pid_alive
from h5etl.release.folder import OutputFolder

if TYPE_CHECKING:  # records only: numpy loads with the build, not with `h5etl status`
    from h5etl.dataflow import BatchResult, Reject

__all__ = ["FORMAT", "BuildStatus", "StatusView", "read_statuses"]

FORMAT = 1
WRITES_PER_SECOND = 4
HEARTBEAT_SECONDS = 2.0  # a live build rewrites its status this often, progress or not
RATE_WINDOW_SECONDS = 10.0  # the rate is over the last ten seconds: it follows slow stretches
RUNNING, SUCCEEDED, FAILED, INTERRUPTED = "running", "succeeded", "failed", "interrupted"
logger = logging.getLogger(__name__)


def _now() -> str:
    return build_clock.iso(datetime.now(UTC))


class BuildStatus:
    """Feeds one build's status file; it is the pipeline's progress hook too.

    A thread beside the build writes the file when something changed, at most
    ``WRITES_PER_SECOND`` times a second, and every ``HEARTBEAT_SECONDS`` regardless, so a
    build stalled on a slow sample still shows its last progress and a fresh ``updated_at``
    (a reader on another host tells a live build from a dead one by that). Stage changes and
    the outcome are written at once. Use it as a context manager: the exit stops the thread.
    """

    def __init__(
        self,
        output: OutputFolder,
        *,
        config: Path | None,
        jobs: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.output = output
        self.clock = clock
        self._lock = threading.Lock()
        self._dirty = False
        self._last_write = clock()
        self._warned = False
        self._points: deque[tuple[float, int]] = deque()  # (time, steps settled)
        self._rejects: Counter[str] = Counter()
        # stored batches not yet counted: they count with the progress advance that follows
        self._stored: list[tuple[str, int, list[str]]] = []  # split, samples, reject reasons
        self._copied: dict[str, int] = {}  # samples per split copied, not yet counted
        self.data: dict[str, Any] = {
            "format": FORMAT,
            "name": output.name,
            "config": str(config) if config is not None else None,
            "state": RUNNING,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "jobs": jobs,
            "started_at": _now(),
            "updated_at": _now(),
            "stage": "start",
            "done": 0,  # steps of the stage (files, samples) settled so far
            "total": None,
            "samples": {},  # split -> {"stored": n, "planned": n}
            "rate": None,  # steps settled per second, over the last ten seconds
            "eta_seconds": None,
            "rejects": {"total": 0, "reasons": {}},
            "result": None,
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="h5etl-status", daemon=True)

    def __enter__(self) -> BuildStatus:
        self.write_now()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def __call__(self, stage: str, advance: int, total: int | None) -> None:
        """The progress hook (``pipeline.ProgressHook``): a stage opens or advances."""
        if advance == 0 and stage != self.data["stage"]:
            with self._lock:
                self.data.update(stage=stage, done=0, total=total, rate=None, eta_seconds=None)
                self._points.clear()
                self._points.append((self.clock(), 0))
            self.write_now()
            return
        with self._lock:
            self.data["done"] += advance
            self._count_stored()
            self._dirty = True

    def planned(self, samples: dict[str, int], rejects: Iterable[Reject]) -> None:
        """The plan: samples per split, and the rejects found before decoding."""
        with self._lock:
            self.data["samples"] = {s: {"stored": 0, "planned": n} for s, n in samples.items()}
            self._add_rejects(rejects)
        self.write_now()

    def resumed(self, counts: dict[str, int]) -> None:
        """Samples per split copied from a killed build (or carried from the parent): they
        count from the progress advance that follows, as stored batches do."""
        with self._lock:
            self._copied = dict(counts)

    def stored(self, result: BatchResult) -> None:
        """A batch went to the file: its samples and rejects count from the progress advance
        that follows (the pipeline reports each stored batch as settled right after). Counted
        at once, a status written in between showed samples stored that the stage's progress
        did not have yet (stored 8, done 4)."""
        reasons = [reject.reason for reject in result.rejects]
        with self._lock:
            self._stored.append((result.task.split, result.accepted, reasons))

    def _count_stored(self) -> None:
        """Count the copied samples and the stored batches (under the lock)."""
        for split, count in self._copied.items():
            self._split(split)["stored"] = count
        self._copied.clear()
        for split, accepted, reasons in self._stored:
            self._split(split)["stored"] += accepted
            self._count_rejects(reasons)
        self._stored.clear()

    def succeeded(
        self,
        *,
        version: int | None,
        path: Path | None,
        samples: dict[str, int],
        seconds: float,
        up_to_date: bool = False,
        rejects: Iterable[Reject] | None = None,
    ) -> None:
        """The release is published (or, ``up_to_date``, the linked one is: nothing changed,
        and ``rejects`` are all of its rejects, decode-time ones too): the outcome, while the
        build still holds the lock."""
        with self._lock:
            self._count_stored()  # before the counts that replace them
            for split, count in samples.items():
                self._split(split)["stored"] = count
            if rejects is not None:
                self._rejects.clear()
                self._add_rejects(rejects)
        done = {"version": version, "release": str(path), "link": str(self.output.link)}
        self._finish(SUCCEEDED, {**done, "seconds": seconds, "up_to_date": up_to_date})

    def failed(self, exc: BaseException) -> None:
        """The build stopped on ``exc`` (the caller re-raises it)."""
        # Ctrl-C (KeyboardInterrupt, or another error it came out as), SystemExit
        if not isinstance(exc, Exception) or interrupts.requested():
            stopped = {"error": "interrupted; nothing was published", "exit_code": 130}
            self._finish(INTERRUPTED, stopped)
            return
        if isinstance(exc, H5EtlError):
            # an error without words (none is raised so today) still gets a status
            message, code = (str(exc).splitlines() or [type(exc).__name__])[0], exc.exit_code
        else:  # our bug: the traceback goes to the terminal, the status names it
            message, code = f"internal error: {type(exc).__name__}: {exc}", 1
        self._finish(FAILED, {"error": message, "exit_code": code})

    def _split(self, split: str) -> dict[str, int]:
        samples: dict[str, dict[str, int]] = self.data["samples"]
        return samples.setdefault(split, {"stored": 0, "planned": 0})

    def _finish(self, state: str, result: dict[str, Any]) -> None:
        with self._lock:
            self._count_stored()  # a batch stored just before the build stopped
            self.data.update(state=state, result=result, rate=None, eta_seconds=None)
        if not self.write_now():
            # A status left saying "running" would read as a killed build: none is better.
            with contextlib.suppress(OSError):
                self.output.status_path.unlink()

    def _add_rejects(self, rejects: Iterable[Reject]) -> None:
        self._count_rejects(reject.reason for reject in rejects)

    def _count_rejects(self, reasons: Iterable[str]) -> None:
        self._rejects.update(reasons)
        self.data["rejects"] = {
            "total": sum(self._rejects.values()),
            "reasons": dict(sorted(self._rejects.items())),
        }

    def _rate(self, now: float) -> None:
        done = int(self.data["done"])
        self._points.append((now, done))
        while len(self._points) > 2 and now - self._points[1][0] >= RATE_WINDOW_SECONDS:
            self._points.popleft()
        then, before = self._points[0]
        if now - then <= 0 or done <= before:
            return
        rate = (done - before) / (now - then)
        self.data["rate"] = round(rate, 2)
        total = self.data["total"]
        self.data["eta_seconds"] = round(max(total - done, 0) / rate, 1) if total else None

    def _run(self) -> None:
        while not self._stop.wait(1.0 / WRITES_PER_SECOND):
            if self._dirty or self.clock() - self._last_write >= HEARTBEAT_SECONDS:
                self.write_now()

    def write_now(self) -> bool:
        """Write the file now (the thread does when something changed); False if it failed."""
        with self._lock:
            now = self.clock()
            if self.data["state"] == RUNNING and self.data["done"]:
                self._rate(now)
            self.data["updated_at"] = _now()
            self._dirty, self._last_write = False, now
            try:
                self.output.write_status(self.data)
            except OSError as exc:  # a full disk, most likely: the build says so itself
                if not self._warned:
                    self._warned = True
                    where = self.output.status_path
                    logger.info("%s: cannot write the build status: %s", where, exc)
                return False
            return True


@dataclass(frozen=True, slots=True)
class StatusView:
    """One status file as read: its data and whether its build still runs."""

    path: Path
    data: dict[str, Any]
    alive: bool | None  # None: another host's build, which this one cannot see

    @property
    def state(self) -> str:
        state = str(self.data.get("state"))
        return "killed" if state == RUNNING and self.alive is False else state


def _alive(data: dict[str, Any], lock: Path) -> bool | None:
    """Whether the build a status names still runs; None: another host's, which may.

    A running build holds its lock file from before its first status to after its last, so
    no lock file means no build (on any host); a killed one leaves it, and its pid tells.
    """
    if not lock.exists():
        return False
    if data.get("host") != socket.gethostname():
        return None
    pid = data.get("pid")
    return isinstance(pid, int) and pid_alive(pid)


def read_statuses(target: Path) -> list[StatusView]:
    """The status files of an output folder (each release name's), or of one release link.

    Raises:
        UsageError: ``target`` is neither, or no build wrote a status there (exit code 2).
    """
    if target.is_dir():
        paths = sorted(target.glob(f"*{OutputFolder.STATUS_SUFFIX}"))
    elif target.suffix == ".h5":
        paths = [OutputFolder(target.parent, target.name.removesuffix(".h5")).status_path]
    else:
        why = "" if target.exists() else " (nothing is there)"
        raise UsageError(f"not an output folder{why}; give one, such as releases", path=target)
    views = []
    for path in paths:
        try:
            data = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read this build status: {exc}", path=path) from exc
        if isinstance(data, dict) and data.get("format") == FORMAT:
            name = path.name.removesuffix(OutputFolder.STATUS_SUFFIX)
            lock = OutputFolder(path.parent, name).lock_path
            views.append(StatusView(path, data, _alive(data, lock)))
    if not views:
        raise UsageError("no build status here: no build has run in this folder yet", path=target)
    return views


def _count(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def _ago(stamp: object) -> str:
    try:
        then = datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "at an unknown time"
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    return f"{seconds // 60} min ago" if seconds < 7200 else f"{seconds // 3600} h ago"


def _splits(data: dict[str, Any]) -> str:
    samples = data.get("samples") or {}
    return ", ".join(
        f"{split} {_count(entry.get('stored'))}/{_count(entry.get('planned'))}"
        for split, entry in samples.items()
    )


def _rejects(data: dict[str, Any]) -> str:
    rejects = data.get("rejects") or {}
    reasons = ", ".join(f"{r} {n}" for r, n in (rejects.get("reasons") or {}).items())
    total = rejects.get("total", 0)
    return f"{_count(total)} files ({reasons})" if total else "none"


def describe(view: StatusView) -> list[str]:
    """The lines ``h5etl status`` prints for one build."""
    data, state = view.data, view.state
    who = f"pid {data.get('pid')} on {data.get('host')}"
    head = f"{data.get('name')}: {state}"
    if state == RUNNING:
        updated = _ago(data.get("updated_at"))
        seen = "" if view.alive else f"; on another host: last update {updated}"
        lines = [f"{head} ({who}, started {data.get('started_at')}{seen})"]
        done, total = data.get("done"), data.get("total")
        share = f" ({100 * done // total}%)" if isinstance(done, int) and total else ""
        of = f" of {_count(total)}" if total else ""
        lines.append(f"  stage: {data.get('stage')}, {_count(done)}{of}{share}")
        if data.get("rate"):
            eta = data.get("eta_seconds")
            lines.append(
                f"  rate: {data['rate']:,.1f} samples/s"
                + (f", about {eta:,.0f} s to go" if eta is not None else "")
            )
    elif state == "killed":
        lines = [
            f"{head} ({who} is gone; last seen {_ago(data.get('updated_at'))} in stage "
            f"{data.get('stage')}): nothing was published; build again, or --resume"
        ]
    else:
        result = data.get("result") or {}
        if state == SUCCEEDED and result.get("up_to_date"):
            outcome = (
                f"up to date: nothing changed since v{int(result.get('version', 0)):04d} "
                f"{result.get('release')}, no new release"
            )
        elif state == SUCCEEDED:
            outcome = (
                f"v{int(result.get('version', 0)):04d} {result.get('release')} in "
                f"{float(result.get('seconds', 0.0)):.1f} s"
            )
        else:
            outcome = f"{result.get('error')} (exit code {result.get('exit_code')})"
        when = f"{data.get('updated_at')} ({_ago(data.get('updated_at'))})"
        lines = [f"{head} at {when}: {outcome}"]
    if data.get("samples"):
        lines.append(f"  samples stored/planned: {_splits(data)}")
    lines.append(f"  rejects: {_rejects(data)}")
    return lines
