"""Build benchmark: h5etl against the plain serial loop and the machine's limits, one corpus.

Every contender runs as a child process, interleaved (all contenders once, then again, ...),
and the table shows medians over ``--repeats``. Per run: images/s (samples / wall of the
process), wall, CPU (user+sys of the whole process tree: this runner is a child subreaper, so
orphaned workers are reaped here and counted in ``RUSAGE_CHILDREN``), peak RSS of the parent
and of the largest other process (``VmHWM`` sampled from /proc every 20 ms; 100 ms in a smoke
run) and bytes on disk.

    python tests/benchmarks/build.py                 # the default run (about 6 minutes)
    python tests/benchmarks/build.py --messy         # only clean vs messy corpus (3% rejects)
    python tests/benchmarks/build.py --sweep         # only chunk_samples 1, 8, 32, 64
    python tests/benchmarks/build.py --gap           # -j2 lzf, blosc-lz4 against the limits
    python tests/benchmarks/build.py --memory        # peak RSS: 1x against the 10x corpus
    python tests/benchmarks/build.py --profile       # pyinstrument: parent (-j2), worker work (-j1)

``--messy``, ``--sweep`` and ``--gap`` combine (their contenders, interleaved in each repeat);
without any of them the run holds every contender.

Child modes (``--run serial|limit|disk|api|read|profile``) are what the runner launches.

``H5ETL_BENCH_SMOKE=1`` (the test suite's smoke run, no figure meant): every table and code
path, with the fewest builds that show them: of the codec builds only lzf and blosc-lz4 (the
one with its own work limit; gzip and zstd are the same contender with another config), of
the chunk sweep only 1 and 32 (the reference) samples a chunk. The child modes of this script
(serial loops, h5etl's work limits, the disk limit, the API build, the reads) run in the runner's
own process, and so do the ``h5etl build`` runs of this tree: they pay the imports once, and
the child modes share one worker pool (``measure_child``); the honest limit and every variant
tree still run as child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpus import (
    CHUNK_SWEEP,
    CODECS,
    DEFAULT_DIR,
    DEFAULT_SAMPLES,
    MESSY_VALUE,
    Corpus,
    CorpusParams,
    ensure_corpus,
    ensure_messy,
    messy_indices,
    sweep_config,
)
from installed import byte_compile, h5etl_here, warm

try:
    from h5etl.execute.pool import NATIVE_THREAD_LIMITS
except ModuleNotFoundError:  # a --variant tree from before the concept folders (issue 26)
    NATIVE_THREAD_LIMITS = importlib.import_module("h5etl.workers").NATIVE_THREAD_LIMITS

MIB = 2**20
SMOKE = os.environ.get("H5ETL_BENCH_SMOKE") == "1"
BUILD_CODECS = ("lzf", "blosc-lz4") if SMOKE else tuple(CODECS)
BUILD_SWEEP = (1, 32) if SMOKE else CHUNK_SWEEP
SAMPLE_EVERY = 0.1 if SMOKE else 0.02  # seconds between the /proc samples of peak RSS
BATCH = 32
SIZE = 224
HERE = Path(__file__).resolve()


# --------------------------------------------------------------------------------------------
# measuring a child process tree


@dataclass(slots=True)
class Run:
    """One run of one contender."""

    wall: float
    cpu: float
    rss_parent: int  # bytes, VmHWM of the process the runner started
    rss_workers: int  # bytes, largest VmHWM among its descendants (0: none)
    disk: int = 0
    samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.samples / self.wall if self.wall else 0.0


def become_subreaper() -> bool:
    """Adopt orphaned descendants, so their CPU time lands in our RUSAGE_CHILDREN."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        out[int(entry.name)] = int(stat[stat.rfind(b")") + 2 :].split()[1])
    return out


def _descendants(root: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == pid]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Sampler(threading.Thread):
    """Peak RSS per process of the runner's descendants, sampled until stopped."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = root
        self.peaks: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in [self.root, *_descendants(os.getpid())]:
                self.peaks[pid] = max(self.peaks.get(pid, 0), _hwm(pid))
            self.done.wait(SAMPLE_EVERY)


def _children() -> set[int]:
    me = os.getpid()
    return {pid for pid, parent in _parents().items() if parent == me}


def _reap_orphans(keep: set[int], deadline: float = 30.0) -> None:
    """Wait for the children of a run (orphaned workers adopted here) to exit and reap them;
    ``keep``: this runner's own children from before the run (smoke mode: the worker pools of
    the child modes it ran in-process), which live on."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if keep and _children() <= keep:
                return
            time.sleep(0.02)


def measure(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[Run, str]:
    """Run ``cmd`` to completion; its wall, tree CPU and peak RSS, and its stdout."""
    keep = _children() if SMOKE else set()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = _Sampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    _reap_orphans(keep)
    sampler.done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    # Helpers of a few hundred KiB (ldconfig run by ctypes.util, say) are not workers.
    workers = [peak for pid, peak in sampler.peaks.items() if pid != proc.pid and peak > 8 * MIB]
    run = Run(wall, cpu, sampler.peaks.get(proc.pid, 0), max(workers, default=0))
    return run, out


def measure_child(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[Run, str]:
    """``measure`` a child: ``h5etl ...``, ``python -m h5etl ...`` or a child mode of a
    benchmark script (python, the script, its arguments). The smoke run (no figure meant)
    runs ``h5etl`` and the child modes of the scripts in ``IN_PROCESS`` in this process
    instead, the same code from their arguments to their output, when they run this tree (no
    variant's ``PYTHONPATH``): the imports paid once, and one worker pool for all the child
    modes, not a process and a pool each."""
    here = _in_process(cmd) if SMOKE and env in (None, LIMIT_ENV) else None
    if here is None:
        return measure(cmd, env)
    child, args = here
    text = io.StringIO()
    before = _cpu(resource.getrusage(resource.RUSAGE_SELF))
    started = time.perf_counter()
    with contextlib.redirect_stdout(text):
        child(args)
    wall = time.perf_counter() - started
    cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) - before
    return Run(wall, cpu, _hwm(os.getpid()), 0), text.getvalue()


def _in_process(cmd: Sequence[str]) -> tuple[Callable[[Sequence[str]], None], list[str]] | None:
    """The function that runs ``cmd`` here, and its arguments; None: it runs as a child."""
    if cmd[0] == "h5etl":
        return h5etl_here, list(cmd[1:])
    if list(cmd[1:3]) == ["-m", "h5etl"]:
        return h5etl_here, list(cmd[3:])
    child = IN_PROCESS.get(cmd[1]) if len(cmd) > 1 else None
    return None if child is None else (child, list(cmd[2:]))


def _child_json(out: str) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def _child(mode: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE), "--run", mode, *args]


# --------------------------------------------------------------------------------------------
# child modes: the serial loop, the limits, the in-process build, reads, profiles


def _pad(array: Any, size: int) -> Any:
    import numpy as np

    height, width = array.shape[:2]
    top, left = (size - height) // 2, (size - width) // 2
    pads = [(top, size - height - top), (left, size - width - left)]
    return np.pad(array, pads + [(0, 0)] * (array.ndim - 2))


SERIAL_CHUNKS = ("auto", "batch")


def run_serial(root: Path, out: Path, chunks: str = "auto") -> dict[str, Any]:
    """The loop most tutorials show: glob, PIL, np.pad, stack 32, h5py lzf+shuffle, gc.

    ``chunks="auto"`` leaves the chunk shape to h5py, as tutorials do: it picks (128, 1, 28, 28)
    here, so each batch of 32 rewrites part of every chunk it touches and HDF5 decompresses and
    recompresses them. ``"batch"`` sets one chunk per batch, the careful version of the loop.
    """
    import gc

    import h5py
    import numpy as np
    from PIL import Image

    images = sorted((root / "images").glob("*.png"))
    with h5py.File(out, "w") as f:
        common = {"compression": "lzf", "shuffle": True, "dtype": "uint8"}
        img_ds = f.create_dataset(
            "image",
            (0, 3, SIZE, SIZE),
            maxshape=(None, 3, SIZE, SIZE),
            chunks=(BATCH, 3, SIZE, SIZE) if chunks == "batch" else True,
            **common,
        )
        mask_ds = f.create_dataset(
            "mask",
            (0, 1, SIZE, SIZE),
            maxshape=(None, 1, SIZE, SIZE),
            chunks=(BATCH, 1, SIZE, SIZE) if chunks == "batch" else True,
            **common,
        )
        name_ds = f.create_dataset(
            "filename", (0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8")
        )
        for start in range(0, len(images), BATCH):
            batch = images[start : start + BATCH]
            imgs, masks = [], []
            for path in batch:
                img = np.array(Image.open(path).convert("RGB"))
                imgs.append(_pad(img, SIZE).transpose(2, 0, 1))
                mask = np.array(Image.open(root / "masks" / path.name).convert("L")) // 255
                masks.append(_pad(mask, SIZE)[None])
            end = start + len(batch)
            for dataset, rows in ((img_ds, imgs), (mask_ds, masks)):
                dataset.resize(end, axis=0)
                dataset[start:end] = np.stack(rows)
            name_ds.resize(end, axis=0)
            name_ds[start:end] = [p.name for p in batch]
            gc.collect()
        chunk_shape = img_ds.chunks
    return {"samples": len(images), "chunks": list(chunk_shape or ())}


_LIMIT_BUFFERS: dict[str, Any] = {}


def _limit_block(
    paths: list[tuple[str, str]],
    layouts: dict[str, Any],
    kinds: dict[str, Any],
    encode: bool,
    hashes: bool,
) -> int:
    import hashlib

    import numpy as np

    from h5etl.format.codec import encode_block
    from h5etl.format.digest import block_digest
    from h5etl.inputs.pixels import Mode
    from h5etl.inputs.raster import decode

    # Reused like h5etl's own batch buffers: fresh arrays would add a page fault per 4 KiB.
    image = _LIMIT_BUFFERS.setdefault("image", np.empty((BATCH, 3, SIZE, SIZE), np.uint8))
    mask = _LIMIT_BUFFERS.setdefault("mask", np.empty((BATCH, 1, SIZE, SIZE), np.uint8))
    image.fill(0)
    mask.fill(0)
    windows: dict[str, list[Any]] = {"RGB": [], "L": []}
    for row, (image_path, mask_path) in enumerate(paths):
        fields: list[tuple[Any, str, Mode]] = [(image, image_path, "RGB"), (mask, mask_path, "L")]
        for out, path, mode in fields:
            with open(path, "rb") as handle:
                data = handle.read()
            pixels = decode(data, mode, path=path)  # h5etl's own decoder
            if hashes:
                hashlib.sha256(data).hexdigest()
            height, width = pixels.shape[:2]
            top, left = (SIZE - height) // 2, (SIZE - width) // 2
            window = out[row, :, top : top + height, left : left + width]
            if mode == "RGB":
                window[...] = pixels.transpose(2, 0, 1)
            else:
                window[0] = pixels // 255
            windows[mode].append(window)
    if hashes:  # the statistics a release carries too, as its kinds compute them
        kinds["image"].task_stats(windows["RGB"])
        kinds["mask"].task_stats(windows["L"])
    if encode:
        encode_block(layouts["image"], image)
        encode_block(layouts["mask"], mask)
    if hashes:
        block_digest(image)
        block_digest(mask)
    return len(paths)


def run_limit(config: Path, encode: bool, hashes: bool = False) -> dict[str, Any]:
    """Decode + pad (+ compress whole chunks with the release's codec) on all cores; discard.

    The decode is h5etl's own (``h5etl.inputs.raster.decode``: libpng for plain PNGs), so the limit
    is the same work h5etl must do, without its pipeline, checks, hashes and file. ``hashes`` adds
    what a release must carry beyond the pixels: the SHA-256 digests (each source file, each
    block of raw rows) and the normalisation statistics (per-channel sums of the image, the
    mask's value histogram, computed as the kinds compute them).
    """
    from joblib import Parallel, delayed

    from h5etl import load_spec
    from h5etl.execute.assembly import layouts_of
    from h5etl.plan.kind_registry import kinds_of

    spec = load_spec(config)
    layouts = layouts_of(spec)
    kinds = {kind.name: kind for kind in kinds_of(spec)}
    root = config.parent
    names = sorted(p.name for p in (root / "images").glob("*.png"))
    pairs = [(str(root / "images" / n), str(root / "masks" / n)) for n in names]
    blocks = [pairs[i : i + BATCH] for i in range(0, len(pairs), BATCH)]
    done = Parallel(n_jobs=os.cpu_count() or 1)(
        delayed(_limit_block)(block, layouts, kinds, encode, hashes) for block in blocks
    )
    return {"samples": sum(done)}


def run_disk(nbytes: int, out: Path) -> dict[str, Any]:
    """Write ``nbytes`` sequentially in 4 MiB blocks, fsync, remove."""
    block = os.urandom(4 * MIB)
    with open(out, "wb") as handle:
        left = nbytes
        while left > 0:
            handle.write(block[: min(left, len(block))])
            left -= len(block)
        handle.flush()
        os.fsync(handle.fileno())
    out.unlink()
    return {"bytes": nbytes}


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def run_api(config: Path, jobs: int) -> dict[str, Any]:
    """The build in this process, so RUSAGE_SELF is the writer's (parent's) own CPU time."""
    from h5etl import build, load_spec

    marks: dict[str, tuple[float, float]] = {}

    def hook(stage: str, advance: int, total: int | None) -> None:
        if stage == "decode+write" and advance == 0 and "write" not in marks:
            marks["write"] = (time.perf_counter(), _cpu(resource.getrusage(resource.RUSAGE_SELF)))

    shutil.rmtree(config.parent / "releases" / "api", ignore_errors=True)
    spec = load_spec(config)
    spec = spec.model_copy(update={"output": config.parent / "releases" / "api"})
    cpu0, wall0 = _cpu(resource.getrusage(resource.RUSAGE_SELF)), time.perf_counter()
    report = build(spec, jobs=jobs, progress=hook)
    wall1, cpu1 = time.perf_counter(), _cpu(resource.getrusage(resource.RUSAGE_SELF))
    write_wall0, write_cpu0 = marks.get("write", (wall0, cpu0))
    assert report.path is not None
    pairs = {(r.key, r.reason) for r in report.rejects}  # reason per rejected sample
    diagnostics = _build_seconds(report.path)
    return {
        "samples": sum(report.samples.values()),
        "rejects": len(report.rejects),  # one per file: both files of a rejected pair
        "rejected_pairs": dict(sorted(Counter(reason for _, reason in pairs).items())),
        "chunk_paths": report.chunk_paths,  # per dataset, blocks stored :direct and :rechunked
        "parent_cpu_process": cpu1,
        "parent_cpu_build": cpu1 - cpu0,
        "parent_cpu_write": cpu1 - write_cpu0,
        "wall_build": wall1 - wall0,
        "wall_write": wall1 - write_wall0,
        **diagnostics,
    }


def run_read(path: Path, dataset: str) -> dict[str, Any]:
    """Full sequential read of one dataset, chunk row by chunk row, through plain h5py."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers Blosc and Zstd for h5py)
    import numpy as np

    with h5py.File(path, "r") as f:
        data = f[dataset]
        rows = data.chunks[0] if data.chunks else BATCH
        buffer = np.empty((rows, *data.shape[1:]), dtype=data.dtype)
        started = time.perf_counter()
        for start in range(0, data.shape[0], rows):
            stop = min(start + rows, data.shape[0])
            data.read_direct(buffer, np.s_[start:stop], np.s_[0 : stop - start])
        seconds = time.perf_counter() - started
        return {"samples": int(data.shape[0]), "bytes": int(data.nbytes), "seconds": seconds}


def run_profile(config: Path, jobs: int, out: Path) -> dict[str, Any]:
    """pyinstrument over an in-process build; the text report goes to ``out``."""
    from pyinstrument import Profiler

    from h5etl import build, load_spec

    shutil.rmtree(config.parent / "releases" / "profile", ignore_errors=True)
    spec = load_spec(config)
    spec = spec.model_copy(update={"output": config.parent / "releases" / "profile"})
    profiler = Profiler(interval=0.001)
    with profiler:
        build(spec, jobs=jobs)
    out.write_text(profiler.output_text(unicode=False, color=False), encoding="utf-8")
    return {"profile": str(out)}


# --------------------------------------------------------------------------------------------
# contenders and the interleaved runner


# Groups of contenders: the command line picks some (--messy, --sweep, --gap), or all.
MAIN, MESSY, SWEEP, GAP = "main", "messy", "sweep", "gap"
Variant = tuple[str, str]  # (name, PYTHONPATH) of another h5etl source tree


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    run: Callable[[], Run]
    groups: frozenset[str] = frozenset({MAIN})
    # How another source tree runs the same thing (its runs follow this one's), if it can.
    variant: Callable[[Variant], Callable[[], Run]] | None = None


def _build_seconds(release: Path) -> dict[str, float]:
    """The stage timings of a build (``seconds_<stage>``): from the build facts beside it,
    or (a release of an h5etl before them, a variant) from its ``/diagnostics``."""
    import h5py

    facts = release.with_suffix(".build.json")
    if facts.is_file():
        seconds = json.loads(facts.read_text("utf-8"))["seconds"]
        return {f"seconds_{k}": float(v) for k, v in seconds.items() if k != "total"}
    with h5py.File(release, "r") as f:
        attrs = f["diagnostics"].attrs
        return {k: float(v) for k, v in attrs.items() if k.startswith("seconds_")}


def _release_file(folder: Path) -> Path:
    files = sorted(p for p in folder.glob("*.h5") if not p.is_symlink())
    return files[-1]


def _variant_env(variant: Variant | None) -> dict[str, str] | None:
    return None if variant is None else {**os.environ, "PYTHONPATH": variant[1]}


def _h5etl_cli(
    corpus: Corpus,
    config: str,
    jobs: int,
    reads: dict[str, list[Run]] | None = None,
    variant: Variant | None = None,
) -> Run:
    """``h5etl build`` of ``corpus.config(config)``; a ``variant`` runs another source tree.

    With ``reads``, the release's ``/train/image`` is then read back in full, into
    ``reads[config]``.
    """
    import h5py

    folder = corpus.releases(config)
    shutil.rmtree(folder, ignore_errors=True)
    cmd = ["h5etl", "build", str(corpus.config(config)), "--jobs", str(jobs), "--quiet"]
    run, _ = measure_child(cmd, _variant_env(variant))
    release = _release_file(folder)
    run.disk = release.stat().st_size
    with h5py.File(release, "r") as f:
        attrs = f["diagnostics"].attrs
        run.samples = int(sum(v for k, v in attrs.items() if k.startswith("samples_")))
        run.extra = _build_seconds(release)
        run.extra["rejects"] = float(attrs.get("rejects_total", 0))
    if reads is not None:
        read, out = measure_child(
            _child("read", "--file", str(release), "--dataset", "/train/image")
        )
        info = _child_json(out)
        read.samples, read.wall, read.disk = info["samples"], info["seconds"], info["bytes"]
        reads.setdefault(config, []).append(read)
    return run


def _child_run(
    cmd: list[str], samples: int, disk: Path | None = None, env: dict[str, str] | None = None
) -> Run:
    run, out = measure_child(cmd, env)
    info = _child_json(out)
    run.samples = int(info.get("samples", samples))
    run.extra = info
    if disk is not None:
        run.disk = disk.stat().st_size
        disk.unlink()
    return run


WORK_LIMIT_HASHED = (
    "work limit with what a release carries (SHA-256, statistics): decode+pad+lzf+hashes+stats"
)
WORK_LIMIT_HASHED_BLOSC = (
    "work limit with what a release carries (SHA-256, statistics): decode+pad+blosc-lz4+hashes"
    "+stats"
)
HONEST_CODECS = ("lzf", "blosc-lz4")


def honest_name(codec: str) -> str:
    """The work limit that imports nothing of h5etl (``honest_limit.py``), for ``codec``."""
    return f"honest work limit, no h5etl imported: decode+pad+{codec}+hashes+stats"


def honest_written_name(codec: str) -> str:
    """The same limit storing its chunks too (``honest_limit.py --write``), for ``codec``."""
    return f"honest work limit that also writes its chunks to disk ({codec})"


SERIAL = "serial loop (lzf, h5py's automatic chunks)"
SERIAL_BATCH_CHUNKS = "serial loop (lzf, one chunk per batch of 32)"
CLI_J2 = "h5etl build -j2 (lzf)"
MESSY_CLI = "h5etl build -j2 (lzf, messy corpus)"
API = "h5etl API -j2 (lzf, writer CPU)"
MESSY_API = "h5etl API -j2 (lzf, messy corpus, writer CPU)"


def sweep_name(chunks: int) -> str:
    return f"h5etl build -j2 (lzf, chunks of {chunks})"


# The limits run with the native thread limits h5etl's CLI sets for itself (joblib's Parallel
# sets them in its workers anyway): an idle BLAS thread spinning in their parent is not work.
LIMIT_ENV = {**os.environ, **NATIVE_THREAD_LIMITS}


def contenders(
    corpus: Corpus,
    work: Path,
    reads: dict[str, list[Run]],
    state: dict[str, int],
    variants: Sequence[Variant] = (),
    groups: frozenset[str] = frozenset({MAIN, MESSY, SWEEP}),
    messy: Corpus | None = None,
) -> list[Contender]:
    """The contenders of ``groups``, each followed by its runs of every variant tree."""
    samples = corpus.params.samples

    def h5etl(codec: str, jobs: int) -> Callable[[], Run]:
        def go() -> Run:
            run = _h5etl_cli(corpus, codec, jobs, reads if jobs == 2 else None)
            if codec == "lzf":
                state["release_bytes"] = run.disk
            return run

        return go

    def cli(where: Corpus, config: str, jobs: int) -> Callable[[Variant | None], Callable[[], Run]]:
        return lambda variant: lambda: _h5etl_cli(where, config, jobs, None, variant)

    def api(where: Corpus) -> Callable[[Variant | None], Callable[[], Run]]:
        cmd = _child("api", "--config", str(where.config("lzf")), "--jobs", "2")
        return lambda variant: lambda: _child_run(cmd, samples, env=_variant_env(variant))

    def disk() -> Run:
        nbytes = state.get("release_bytes", 0)
        run = _child_run(
            _child("disk", "--bytes", str(nbytes), "--out", str(work / "disk.bin")), samples
        )
        run.samples, run.disk = samples, nbytes
        return run

    serial_out = work / "serial.h5"

    def serial(chunks: str) -> Callable[[], Run]:
        args = ("--corpus", str(corpus.root), "--out", str(serial_out), "--chunks", chunks)
        return lambda: _child_run(_child("serial", *args), samples, serial_out)

    def limit(config: str, *flags: str) -> Callable[[], Run]:
        cmd = _child("limit", "--config", str(corpus.config(config)), *flags)
        return lambda: _child_run(cmd, samples, env=LIMIT_ENV)

    def honest(codec: str, *flags: str) -> Callable[[], Run]:
        script = str(HERE.parent / "honest_limit.py")
        cmd = [sys.executable, script, "--corpus", str(corpus.root), "--codec", codec, *flags]
        return lambda: _child_run(cmd, samples, env=LIMIT_ENV)

    written = work / "honest-written"
    written.mkdir(exist_ok=True)

    everywhere = frozenset({MAIN, MESSY, GAP})
    gap = frozenset({MAIN, GAP})
    only_gap = frozenset({GAP})
    out = [
        Contender("h5etl build -j1 (lzf)", h5etl("lzf", 1), variant=cli(corpus, "lzf", 1)),
        Contender(CLI_J2, h5etl("lzf", 2), everywhere, cli(corpus, "lzf", 2)),
    ]
    if messy is not None:
        messy_cli = cli(messy, "lzf", 2)
        out.append(Contender(MESSY_CLI, messy_cli(None), frozenset({MESSY}), messy_cli))
    out += [
        Contender(SERIAL, serial("auto")),
        Contender(SERIAL_BATCH_CHUNKS, serial("batch")),
        Contender("work limit: decode+pad+lzf, all cores", limit("lzf", "--encode")),
        Contender("work limit: decode+pad+blosc-lz4, all cores", limit("blosc-lz4", "--encode")),
        Contender(WORK_LIMIT_HASHED, limit("lzf", "--encode", "--hashes"), gap),
        Contender(WORK_LIMIT_HASHED_BLOSC, limit("blosc-lz4", "--encode", "--hashes"), gap),
        *(Contender(honest_name(codec), honest(codec), gap) for codec in HONEST_CODECS),
        *(  # only with --gap; a smoke run shows the default codec's (each is a child process)
            Contender(honest_written_name(c), honest(c, "--write", str(written)), only_gap)
            for c in (HONEST_CODECS[1:] if SMOKE else HONEST_CODECS)
        ),
        Contender("decode limit: decode+pad, all cores", limit("lzf")),
        Contender("disk limit: same bytes, sequential+fsync", disk),
        Contender(API, api(corpus)(None), everywhere, api(corpus)),
    ]
    if messy is not None:
        out.append(Contender(MESSY_API, api(messy)(None), frozenset({MESSY}), api(messy)))
    out += [
        Contender(
            f"h5etl build -j2 ({codec})",
            h5etl(codec, 2),
            gap if codec == "blosc-lz4" else frozenset({MAIN}),  # --gap: the default codec too
            variant=cli(corpus, codec, 2) if codec == "blosc-lz4" else None,
        )
        for codec in BUILD_CODECS
        if codec != "lzf"
    ]
    out += [
        Contender(
            sweep_name(n),
            cli(corpus, sweep_config(n), 2)(None),
            frozenset({SWEEP}),
            cli(corpus, sweep_config(n), 2),
        )
        for n in BUILD_SWEEP
    ]
    return _with_variants([c for c in out if c.groups & groups], variants)


def _with_variants(cands: list[Contender], variants: Sequence[Variant]) -> list[Contender]:
    """Each variant runs right after the contender it changes, so A and B see the same load."""
    ordered = []
    for cand in cands:
        ordered.append(cand)
        if cand.variant is not None:
            ordered += [
                Contender(f"{cand.name} [{v[0]}]", cand.variant(v), cand.groups) for v in variants
            ]
    return ordered


def run_all(cands: list[Contender], repeats: int) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {c.name: [] for c in cands}
    for repeat in range(repeats):
        for cand in cands:
            run = cand.run()
            runs[cand.name].append(run)
            print(
                f"  [{repeat + 1}/{repeats}] {cand.name}: {run.rate:.0f} images/s, "
                f"{run.wall:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    return runs


# --------------------------------------------------------------------------------------------
# tables


def _median(values: Iterator[float] | list[float]) -> float:
    items = list(values)
    return statistics.median(items) if items else 0.0


def _mib(value: float) -> str:
    return f"{value / MIB:.1f}" if value else "-"


def main_table(runs: dict[str, list[Run]]) -> str:
    lines = [
        "| contender | images/s | (best) | wall s | CPU s (user+sys) | cores busy "
        "| images per CPU-s | parent peak RSS MiB | worker peak RSS MiB | on disk MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, items in runs.items():
        wall = _median(r.wall for r in items)
        cpu = _median(r.cpu for r in items)
        lines.append(
            f"| {name} | {_median(r.rate for r in items):.0f} "
            f"| {max(r.rate for r in items):.0f} | {wall:.2f} | {cpu:.2f} "
            f"| {cpu / wall if wall else 0:.2f} "
            f"| {_median(r.samples / r.cpu for r in items if r.cpu):.0f} "
            f"| {_mib(_median(r.rss_parent for r in items))} "
            f"| {_mib(_median(r.rss_workers for r in items))} "
            f"| {_mib(_median(r.disk for r in items))} |"
        )
    return "\n".join(lines)


RATIOS = [
    # (label, numerator, denominator, target or None)
    (
        "h5etl -j2 lzf / work limit",
        "h5etl build -j2 (lzf)",
        "work limit: decode+pad+lzf, all cores",
        0.9,
    ),
    (  # issue 11 item 15: at 3,000 and at 30,000 pairs
        "h5etl -j2 lzf / work limit with the SHA-256 and statistics a release carries",
        "h5etl build -j2 (lzf)",
        WORK_LIMIT_HASHED,
        0.9,
    ),
    # issue 30: against the limit that imports nothing of h5etl, per codec; and how much the
    # limit above, which runs h5etl's own modules, overstates h5etl's share of the machine
    ("h5etl -j2 lzf / honest limit (lzf)", CLI_J2, honest_name("lzf"), 0.9),
    (
        "h5etl -j2 blosc-lz4 / honest limit (blosc-lz4)",
        "h5etl build -j2 (blosc-lz4)",
        honest_name("blosc-lz4"),
        0.9,
    ),
    # what the limit leaves out that a release cannot: its bytes written (no target: the
    # issue's targets are against the limit above)
    ("h5etl -j2 lzf / honest limit that writes (lzf)", CLI_J2, honest_written_name("lzf"), None),
    (
        "h5etl -j2 blosc-lz4 / honest limit that writes (blosc-lz4)",
        "h5etl build -j2 (blosc-lz4)",
        honest_written_name("blosc-lz4"),
        None,
    ),
    (
        "work limit with SHA-256 and statistics (h5etl's modules) / honest limit, lzf",
        WORK_LIMIT_HASHED,
        honest_name("lzf"),
        None,
    ),
    (
        "work limit with SHA-256 and statistics (h5etl's modules) / honest limit, blosc-lz4",
        WORK_LIMIT_HASHED_BLOSC,
        honest_name("blosc-lz4"),
        None,
    ),
    (
        "work limit with SHA-256 and statistics / work limit",
        WORK_LIMIT_HASHED,
        "work limit: decode+pad+lzf, all cores",
        None,
    ),
    (
        "h5etl -j2 lzf / decode limit",
        "h5etl build -j2 (lzf)",
        "decode limit: decode+pad, all cores",
        None,
    ),
    ("h5etl -j2 lzf / serial loop", "h5etl build -j2 (lzf)", SERIAL, 3.0),
    ("h5etl -j2 blosc-lz4 / serial loop", "h5etl build -j2 (blosc-lz4)", SERIAL, 3.8),
    ("h5etl -j1 lzf / serial loop", "h5etl build -j1 (lzf)", SERIAL, 1.5),
    (
        "h5etl -j2 blosc-lz4 / its work limit",
        "h5etl build -j2 (blosc-lz4)",
        "work limit: decode+pad+blosc-lz4, all cores",
        None,
    ),
    # The same targets against the loop with hand-set chunks, which a tutorial rarely shows.
    (
        "h5etl -j2 lzf / serial loop, one chunk per batch",
        "h5etl build -j2 (lzf)",
        SERIAL_BATCH_CHUNKS,
        None,
    ),
    (
        "h5etl -j2 blosc-lz4 / serial loop, one chunk per batch",
        "h5etl build -j2 (blosc-lz4)",
        SERIAL_BATCH_CHUNKS,
        None,
    ),
    (
        "h5etl -j1 lzf / serial loop, one chunk per batch",
        "h5etl build -j1 (lzf)",
        SERIAL_BATCH_CHUNKS,
        None,
    ),
    (
        "work limit lzf / serial loop, one chunk per batch (the most -j2 lzf could reach)",
        "work limit: decode+pad+lzf, all cores",
        SERIAL_BATCH_CHUNKS,
        None,
    ),
    (
        "work limit blosc-lz4 / serial loop, one chunk per batch",
        "work limit: decode+pad+blosc-lz4, all cores",
        SERIAL_BATCH_CHUNKS,
        None,
    ),
    ("serial loop, one chunk per batch / serial loop", SERIAL_BATCH_CHUNKS, SERIAL, None),
    (
        "h5etl -j2 lzf / disk limit",
        "h5etl build -j2 (lzf)",
        "disk limit: same bytes, sequential+fsync",
        None,
    ),
    (
        "work limit / decode limit",
        "work limit: decode+pad+lzf, all cores",
        "decode limit: decode+pad, all cores",
        None,
    ),
]


def _variant_ratios(runs: dict[str, list[Run]]) -> list[tuple[str, str, str, float | None]]:
    out = []
    for name in runs:
        if not name.endswith("]"):
            continue
        tag = name[name.rindex("[") :]
        base = name[: name.rindex("[")].strip()
        short = base.removeprefix("h5etl build ").replace("(", "").replace(")", "")
        for label, top, bottom, target in RATIOS:
            if top == base:
                out.append((f"{short} {tag} / {label.split(' / ')[1]}", name, bottom, target))
        out.append((f"{short} {tag} / {short} (tree as is)", name, base, None))
    return out


def ratio_table(runs: dict[str, list[Run]]) -> str:
    """Ratios of images/s, and beside them of images per CPU-s: on a machine others load, the
    wall of each run depends on what else ran then; the CPU a run needed much less."""
    lines = [
        "| ratio of images/s (median of per-repeat ratios) | value | per repeat | target | met "
        "| images per CPU-s, same ratio |",
        "|---|---:|---|---:|---|---:|",
    ]
    for label, top, bottom, target in [*RATIOS, *_variant_ratios(runs)]:
        if top not in runs or bottom not in runs:
            continue
        pairs = list(zip(runs[top], runs[bottom], strict=True))
        values = [a.rate / b.rate for a, b in pairs if b.rate]
        value = _median(values)
        per_cpu = _median(
            (a.samples / a.cpu) / (b.samples / b.cpu) for a, b in pairs if a.cpu and b.cpu
        )
        shown = ", ".join(f"{v:.2f}" for v in values)
        goal = f">= {target}" if target else "-"
        met = ("yes" if value >= target else "**no**") if target else "-"
        lines.append(f"| {label} | {value:.2f} | {shown} | {goal} | {met} | {per_cpu:.2f} |")
    return "\n".join(lines)


def codec_table(runs: dict[str, list[Run]], reads: dict[str, list[Run]]) -> str:
    lines = [
        "| codec | file MiB | raw/stored | build images/s (-j2) | read /train/image MB/s (raw) "
        "| read images/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for codec in BUILD_CODECS:
        builds = runs.get(f"h5etl build -j2 ({codec})", [])
        got = reads.get(codec, [])
        if not builds or not got:
            continue
        size = _median(r.disk for r in builds)
        raw = builds[0].samples * (3 + 1) * SIZE * SIZE
        mbps = _median(r.disk / r.wall / 1e6 for r in got)
        lines.append(
            f"| {codec} | {size / MIB:.1f} | {raw / size:.2f} | "
            f"{_median(r.rate for r in builds):.0f} | {mbps:.0f} | "
            f"{_median(r.rate for r in got):.0f} |"
        )
    return "\n".join(lines)


WRITER_ROWS = [
    ("parent CPU, whole process (imports included), s", "parent_cpu_process"),
    ("parent CPU inside build(), s", "parent_cpu_build"),
    ("parent CPU from the first decode task to the end, s", "parent_cpu_write"),
    ("wall from the first decode task to the end, s", "wall_write"),
    ("sink.write seconds (diagnostics seconds_writer), s", "seconds_writer"),
    ("worker decode seconds, summed (seconds_workers_decode), s", "seconds_workers_decode"),
]


def _writer_column(api: list[Run], cli: list[Run], stages: list[str]) -> list[str]:
    def med(key: str, items: list[Run]) -> str:
        values = [float(r.extra[key]) for r in items if key in r.extra]
        return f"{_median(values):.3f}" if values else "-"

    share = _median(
        r.extra["parent_cpu_write"] / r.extra["wall_write"] for r in api if r.extra["wall_write"]
    )
    met = "yes" if share < 0.2 else "**no**"
    return [
        *(med(key, api) for _, key in WRITER_ROWS),
        *(med(key, cli) for key in stages),
        _blocks(api, "direct"),
        _blocks(api, "rechunked"),
        f"**{100 * share:.0f}%** (met: {met})",
    ]


def writer_table(runs: dict[str, list[Run]]) -> str:
    """The writer's (parent's) CPU and the sink's block paths, one column per source tree."""
    if not runs.get(API):
        return ""
    trees = _trees(runs, API)
    skip = {key for _, key in WRITER_ROWS}
    stages = sorted(
        {
            key
            for _, tag in trees
            for run in runs.get(CLI_J2 + tag, [])
            for key in run.extra
            if key.startswith("seconds_") and key not in skip
        }
    )
    labels = [label for label, _ in WRITER_ROWS]
    labels += [f"stage {key[8:]} (CLI -j2 diagnostics), s" for key in stages]
    labels += [
        "blocks stored as the workers compressed them (chunk_paths :direct)",
        "blocks the writer re-cut and compressed (chunk_paths :rechunked, target 0)",
        "**parent busy during decode+write (target < 20% of a core)**",
    ]
    columns = [
        _writer_column(runs[API + tag], runs.get(CLI_J2 + tag, []), stages) for _, tag in trees
    ]
    lines = [
        "| writer (parent) process, h5etl -j2 lzf, medians | "
        + " | ".join(title for title, _ in trees)
        + " |",
        "|---|" + "---:|" * len(trees),
    ]
    for index, label in enumerate(labels):
        lines.append(f"| {label} | " + " | ".join(c[index] for c in columns) + " |")
    return "\n".join(lines)


def _trees(runs: dict[str, list[Run]], base: str) -> list[tuple[str, str]]:
    """(column title, name suffix) of the tree as is and of every variant that ran ``base``."""
    tags = [name[len(base) :] for name in runs if name.startswith(f"{base} [")]
    return [("tree as is", ""), *((tag.strip(" []"), tag) for tag in tags)]


def _per_repeat(values: list[float], digits: int = 2) -> str:
    """The median, then every repeat's value in brackets."""
    shown = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{_median(values):.{digits}f} ({shown})" if values else "-"


def _met(value: float, limit: float) -> str:
    return "met" if value <= limit else f"**missed by {100 * (value / limit - 1):.0f}%**"


def _blocks(items: list[Run], kind: str) -> str:
    """Median blocks stored ``:direct`` or ``:rechunked`` (all datasets) by an API child."""
    counts = [
        sum(v for k, v in r.extra.get("chunk_paths", {}).items() if k.endswith(f":{kind}"))
        for r in items
    ]
    return f"{_median(counts):.0f}" if counts else "-"


def _messy_column(runs: dict[str, list[Run]], tag: str) -> list[str]:
    clean, messy = runs.get(CLI_J2 + tag, []), runs.get(MESSY_CLI + tag, [])
    api_clean, api_messy = runs.get(API + tag, []), runs.get(MESSY_API + tag, [])
    pairs = list(zip(clean, messy, strict=True))
    per_sample = [(m.wall / m.samples) / (c.wall / c.samples) for c, m in pairs]
    rss = [m.rss_parent / c.rss_parent for c, m in pairs if c.rss_parent]
    reasons = api_messy[-1].extra.get("rejected_pairs", {}) if api_messy else {}

    def cpu(items: list[Run]) -> str:
        return f"{_median(float(r.extra['parent_cpu_write']) for r in items):.2f}" if items else "-"

    return [
        f"{_median(c.samples for c in clean):.0f} / {_median(m.samples for m in messy):.0f}",
        ", ".join(f"{v} {k}" for k, v in reasons.items()) or "-",
        f"{_median(c.wall for c in clean):.2f} / {_median(m.wall for m in messy):.2f}",
        _per_repeat([m.wall / c.wall for c, m in pairs]),
        f"**{_per_repeat(per_sample)}** ({_met(_median(per_sample), 1.05)})",
        f"{_mib(_median(c.rss_parent for c in clean))} / "
        f"{_mib(_median(m.rss_parent for m in messy))}",
        f"**{_per_repeat(rss)}** ({_met(_median(rss), 1.1)})",
        f"{_mib(_median(c.rss_workers for c in clean))} / "
        f"{_mib(_median(m.rss_workers for m in messy))}",
        f"{_blocks(api_clean, 'rechunked')} / {_blocks(api_messy, 'rechunked')}",
        f"{_blocks(api_clean, 'direct')} / {_blocks(api_messy, 'direct')}",
        f"{cpu(api_clean)} / {cpu(api_messy)}",
    ]


MESSY_ROWS = [
    ("stored samples, clean / messy", "-"),
    ("rejected pairs in the messy build (API), by reason", "all mask_values"),
    ("wall clean / messy, s", "-"),
    ("wall messy / clean (per repeat)", "-"),
    ("**per stored sample: messy / clean**", "<= 1.05"),
    ("parent peak RSS clean / messy, MiB", "-"),
    ("**parent peak RSS messy / clean**", "<= 1.1"),
    ("worker peak RSS clean / messy, MiB", "-"),
    ("blocks the writer re-cut and compressed, clean / messy (API)", "0"),
    ("blocks stored as the workers compressed them, clean / messy (API)", "-"),
    ("writer CPU from the first decode task to the end, clean / messy, s (API)", "-"),
]


def messy_table(runs: dict[str, list[Run]], messy: Corpus | None) -> str:
    """Clean against messy corpus, h5etl -j2 lzf, one column per source tree."""
    if messy is None or not runs.get(MESSY_CLI) or not runs.get(CLI_J2):
        return ""
    trees = [(t, tag) for t, tag in _trees(runs, MESSY_CLI) if runs.get(CLI_J2 + tag)]
    columns = [_messy_column(runs, tag) for _, tag in trees]
    spoiled = len(messy_indices(messy.params))
    lines = [
        f"Messy corpus: {messy.root}, the same pairs with {spoiled} masks given one pixel of "
        f"{MESSY_VALUE} (decode-time `mask_values` rejects). Ratios are medians of per-repeat "
        "ratios (both builds in the same repeat), each repeat's value in brackets.\n",
        "| h5etl build -j2 (lzf), messy / clean | "
        + " | ".join(t for t, _ in trees)
        + " | target |",
        "|---|" + "---:|" * len(trees) + "---|",
    ]
    for index, (label, target) in enumerate(MESSY_ROWS):
        cells = " | ".join(column[index] for column in columns)
        lines.append(f"| {label} | {cells} | {target} |")
    return "\n".join(lines)


def sweep_table(runs: dict[str, list[Run]]) -> str:
    """Build wall per chunk_samples against chunks of 32, per source tree."""
    base = sweep_name(32)
    if not runs.get(base):
        return ""
    lines = [
        "| tree | chunk_samples | wall s | images/s | on disk MiB | wall / wall at 32 (per repeat) "
        "| target | met |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for title, tag in _trees(runs, base):
        reference = runs[base + tag]
        for chunks in BUILD_SWEEP:
            items = runs.get(sweep_name(chunks) + tag, [])
            if not items:
                continue
            ratios = [a.wall / b.wall for a, b in zip(items, reference, strict=True)]
            value = _median(ratios)
            met = "yes" if 1 / 1.1 <= value <= 1.1 else "**no**"
            lines.append(
                f"| {title} | {chunks} | {_median(r.wall for r in items):.2f} "
                f"| {_median(r.rate for r in items):.0f} | {_mib(_median(r.disk for r in items))} "
                f"| {_per_repeat(ratios)} | within 1.1 | {met} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# entry points


def _h5etl_origin() -> str:
    """Which h5etl the children import (PYTHONPATH applies to them as to us), and its commit."""
    import h5etl

    package = Path(h5etl.__file__).resolve().parent
    stamp = package.parent / "COMMIT"
    if stamp.exists():
        commit = stamp.read_text().strip()
    else:  # a source tree; an installed copy may sit inside some other repository

        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(package), *args], capture_output=True, text=True, check=False
            )
            return done.stdout.strip()

        top = git("rev-parse", "--show-toplevel")
        inside = bool(top) and Path(top).resolve() == package.parent
        commit = git("describe", "--always", "--dirty") if inside else "installed copy"
    return f"h5etl {h5etl.__version__} from {package} ({commit})"


def _corpus(base: Path, samples: int) -> Corpus:
    """The corpus, written by a child ``corpus.py`` if missing.

    Not in this process: the pool and its resource trackers would stay our children, and
    ``measure`` waits for every child of the runner (orphaned workers) to exit.
    """
    params = CorpusParams(samples=samples)
    if not (base / params.folder_name / "corpus.json").exists():
        script = HERE.parent / "corpus.py"
        cmd = [sys.executable, str(script), "--dir", str(base), "--samples", str(samples)]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    return ensure_corpus(base, params)


def _groups(args: argparse.Namespace) -> frozenset[str]:
    """The contender groups the flags pick; none picked: the default run (all but --gap only)."""
    picked = frozenset(g for g in (MESSY, SWEEP, GAP) if getattr(args, g))
    return picked or frozenset({MAIN, MESSY, SWEEP})


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def benchmark(args: argparse.Namespace) -> str:
    corpus = _corpus(args.dir, args.samples)
    groups = _groups(args)
    messy = ensure_messy(corpus) if MESSY in groups else None
    warm(corpus.root, *([messy.root] if messy is not None else []))
    work = args.dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    reads: dict[str, list[Run]] = {}
    state: dict[str, int] = {}
    load_before = _load()
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    pairs = [(v[0], v[1]) for v in variants]
    cands = contenders(corpus, work, reads, state, pairs, groups, messy)
    runs = run_all(cands, args.repeats)
    header = (
        f"## h5etl build benchmark\n\n{corpus.params.samples} image/mask PNG pairs "
        f"({corpus.root}), {os.cpu_count()} cores, medians of {args.repeats} interleaved "
        f"repeats ({', '.join(sorted(groups))}); {_h5etl_origin()}; "
        f"load average (1/5/15 min) {load_before} before, {_load()} after.\n"
    )
    sections = [
        ("", main_table(runs)),
        ("", ratio_table(runs)),
        ("### Messy corpus (3% decode-time rejects)", messy_table(runs, messy)),
        ("### Chunk sweep (lzf, -j2)", sweep_table(runs)),
        ("### Codecs", codec_table(runs, reads)),
        ("### Writer process", writer_table(runs)),
    ]
    parts = [header]
    for title, table in sections:
        if table:
            parts += [title, "", table, ""] if title else [table, ""]
    return "\n".join(parts)


def memory(args: argparse.Namespace) -> str:
    sizes = {"1x": args.samples, f"{args.scale}x": args.samples * args.scale}
    corpora = {k: _corpus(args.dir, n) for k, n in sizes.items()}
    runs: dict[str, list[Run]] = {k: [] for k in corpora}
    for repeat in range(args.repeats):
        for label, corpus in corpora.items():
            run = _h5etl_cli(corpus, "lzf", 2, {})
            runs[label].append(run)
            print(
                f"  [{repeat + 1}/{args.repeats}] {label}: parent {_mib(run.rss_parent)} MiB, "
                f"workers {_mib(run.rss_workers)} MiB, {run.rate:.0f} images/s",
                file=sys.stderr,
                flush=True,
            )
    lines = [
        f"## Peak RSS of `h5etl build --jobs 2` (lzf), medians of {args.repeats}\n",
        "| corpus | samples | images/s | parent peak RSS MiB | worker peak RSS MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, items in runs.items():
        lines.append(
            f"| {label} | {items[0].samples} | {_median(r.rate for r in items):.0f} "
            f"| {_mib(_median(r.rss_parent for r in items))} "
            f"| {_mib(_median(r.rss_workers for r in items))} |"
        )
    small, big = runs["1x"], runs[f"{args.scale}x"]
    for label, attr in (("parent", "rss_parent"), ("largest worker", "rss_workers")):
        ratio = _median(getattr(r, attr) for r in big) / _median(getattr(r, attr) for r in small)
        met = "yes" if ratio <= 1.2 else "**no**"
        lines.append(f"\n{label}: {args.scale}x / 1x = **{ratio:.2f}** (target <= 1.2: {met})")
    return "\n".join(lines) + "\n"


def profile(args: argparse.Namespace) -> str:
    corpus = _corpus(args.dir, args.samples)
    if args.messy:  # --profile --messy: the messy copy
        corpus = ensure_messy(corpus)
    kind = "-messy" if args.messy else ""
    parts = [f"## Profiles (pyinstrument), {corpus.root}\n"]
    for jobs, what in ((2, "parent (writer) of a -j2 build"), (1, "worker work, inline (-j1)")):
        out = args.dir / f"profile{kind}-j{jobs}.txt"
        measure(
            _child(
                "profile",
                "--config",
                str(corpus.config("lzf")),
                "--jobs",
                str(jobs),
                "--out",
                str(out),
            )
        )
        parts += [f"### {what}: {out}\n", "```", out.read_text()[:6000], "```", ""]
    return "\n".join(parts)


def child_main(args: argparse.Namespace) -> None:
    if args.run == "serial":
        info = run_serial(args.corpus, args.out, args.chunks)
    elif args.run == "limit":
        info = run_limit(args.config, args.encode, args.hashes)
    elif args.run == "disk":
        info = run_disk(args.bytes, args.out)
    elif args.run == "api":
        info = run_api(args.config, args.jobs)
    elif args.run == "read":
        info = run_read(args.file, args.dataset)
    else:
        info = run_profile(args.config, args.jobs, args.out)
    print(json.dumps(info))


def _child_here(argv: Sequence[str]) -> None:
    child_main(parse(argv))


# script -> its child modes' entry point, for ``measure_child`` (smoke runs only)
IN_PROCESS: dict[str, Callable[[Sequence[str]], None]] = {str(HERE): _child_here}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="corpus and scratch folder")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="peak RSS: 1x vs --scale x corpus")
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="pyinstrument profiles")
    parser.add_argument(
        "--messy", action="store_true", help="only (with --sweep, --gap) clean vs messy corpus"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="only (with --messy, --gap) chunk_samples 1-64"
    )
    parser.add_argument(
        "--gap",
        action="store_true",
        help="only (with --messy, --sweep) -j2 lzf and blosc-lz4, the work limits with "
        "SHA-256 (h5etl's modules and the honest one), the writer",
    )
    parser.add_argument("--output", type=Path, help="also write the tables here")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="also build with the h5etl found on PYTHONPATH (A/B a change); repeatable",
    )
    # child modes
    parser.add_argument("--run", choices=["serial", "limit", "disk", "api", "read", "profile"])
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--file", type=Path)
    parser.add_argument("--dataset", default="/train/image")
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--encode", action="store_true")
    parser.add_argument(
        "--hashes",
        action="store_true",
        help="limit: add the SHA-256 and statistics a release carries",
    )
    parser.add_argument("--chunks", choices=SERIAL_CHUNKS, default="auto")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    if args.run:
        child_main(args)
        return
    byte_compile(v.split("=", 1)[1] for v in args.variant if "=" in v)
    if not become_subreaper():
        print("warning: not a subreaper; CPU of orphaned workers may be missed", file=sys.stderr)
    if args.memory:
        text = memory(args)
    elif args.profile:
        text = profile(args)
    else:
        text = benchmark(args)
    print(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
