"""What the ``h5etl`` command starts before it imports its command line (typer, click).

A build's decode workers are forks of a fork server that imports the decode stack (numpy,
imagecodecs, the kinds: about 0.25 s). Started once the command line had parsed ``build``,
they were ready 0.45 s into a build; started from the bare arguments, before those imports,
they are ready about 0.1 s sooner, while the parent still loads the config.

The arguments are read loosely, and only to decide whether to start: anything unexpected says
"not now", and ``h5etl.cli.build`` starts the workers itself as before. A build also collects
no garbage until it decodes (``pause_collection``). This module imports nothing heavy: it runs
before everything else.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path

from h5etl import collection
from h5etl.execute import pool as workers

_GLOBAL_FLAGS = ("-v", "--verbose")
# build's options that take a value (``--jobs 2`` or ``--jobs=2``)
_VALUED = ("-j", "--jobs", "--scheduler", "--shards", "--notes")


def start(args: Sequence[str]) -> None:
    """Before the command line loads: limit the native threads (numpy is not imported yet)
    and choose forked workers, as ``h5etl.cli.app.main`` does; then, if ``args`` (the
    command's, without the program) surely build on this machine's workers, start their
    fork server now. A build collects no garbage until it decodes (``pause_collection``)."""
    workers.limit_native_threads()
    workers.serve_forks()
    if builds_on_local_workers(args):
        workers.start_fork_server()
    if _command(args) == "build":
        pause_collection()


_paused = False  # the CLI holds a pause of collection until ``resume_collection``


def pause_collection() -> None:
    """No automatic garbage collection while a build starts. Its imports, config and plan
    make objects that live as long as the command, and the collector walked them again and
    again as they grew: 35 ms of the 0.38 s of a build's imports, 20-30 ms of a plan of
    30,000 pairs, all before the first task."""
    global _paused
    if not _paused:
        collection.hold()
        _paused = True


def resume_collection() -> None:
    """Freeze what the start made (no collection walks it again; it is freed as the process
    ends) and end the start's pause: collection resumes unless a remote read holds one too.
    Does nothing unless ``pause_collection`` paused it."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        collection.release()


def _command(args: Sequence[str]) -> str:
    index = 0
    while index < len(args) and args[index] in _GLOBAL_FLAGS:
        index += 1
    return args[index] if index < len(args) else ""


def builds_on_local_workers(args: Sequence[str], cores: int | None = None) -> bool:
    """Whether ``args`` run ``h5etl build`` with a pool of two or more local workers, as
    ``h5etl.cli.build.build`` would start it (a sharded build adds the shard writers to the
    server's imports, so it starts its own); ``-j`` defaults to ``cores`` (this machine's)."""
    found = _build_arguments(args)
    if found is None:
        return False
    jobs, full, configs = found
    if (jobs or cores or os.cpu_count() or 1) < 2 or not configs:
        return False
    if len(configs) == 1 and not configs[0].is_dir() and not full:
        from h5etl.release.naming import has_link

        # an incremental build may publish nothing: it starts its workers once it decodes
        return not has_link(configs[0])
    return True


def _build_arguments(args: Sequence[str]) -> tuple[int | None, bool, list[Path]] | None:
    """``build``'s jobs (None: not given), ``--full`` and configs in ``args``; None if they
    are not a build's, or one whose workers its command starts (help, a cluster, shards)."""
    if _command(args) != "build":
        return None
    jobs, full, configs = None, False, list[Path]()
    rest = list(args[args.index("build") + 1 :])
    while rest:
        arg = rest.pop(0)
        name, equals, value = arg.partition("=")
        if name in _VALUED:
            value = value if equals else (rest.pop(0) if rest else "")
            if not _usable(name, value):
                return None
            if name in ("-j", "--jobs"):
                jobs = int(value)
        elif arg.startswith("-j") and arg[2:].isdigit():  # -j2
            jobs = int(arg[2:])
        elif arg in ("--help", "-h"):
            return None
        elif arg == "--":
            configs += [Path(a) for a in rest]
            break
        elif arg == "--full":
            full = True
        elif not arg.startswith("-"):
            configs.append(Path(arg))
        # any other option is a flag (--quiet, --dry-run, --resume, ...)
    return jobs, full, configs


def _usable(option: str, value: str) -> bool:
    if option in ("-j", "--jobs"):
        return value.isdigit()
    return option != "--shards" and (option != "--scheduler" or value == "local")
