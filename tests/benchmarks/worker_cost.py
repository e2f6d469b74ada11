"""Worker CPU per sample: h5etl's decode task against the honest limit's block, in ONE process.

    python tests/benchmarks/worker_cost.py --corpus DIR [--codec lzf --codec blosc-lz4]
        [--samples 1024] [--repeats 5] [--profile FILE]

``honest_limit.py`` is what a worker must do per sample (decode with libpng, pad, compress
each 32-sample block, SHA-256 of files and blocks, statistics as plain numpy); a build's
workers run ``h5etl.decode.task.decode_batch`` inside ``schedule.run_pooled`` (the result
into shared memory) and loky pickles what it returns. Both run here on the same samples of
the corpus (``DIR/<codec>.yaml``, the configs ``corpus.py`` writes), one after the other,
``--repeats`` times interleaved, timed with ``time.process_time`` (CPU, not wall: the
machine may be shared). The honest limit's refusal to run beside h5etl is lifted here on
purpose: both pay no start-up in the timed passes, which is the point (per-sample cost only).

Per codec it prints the median CPU microseconds per sample of each side, their ratio, and a
breakdown by step from an instrumented pass (each step's own time, its callees' excluded;
``other`` is the Python around them): read, sha256, the PNG header walk, libpng, mask check,
fit, place (pad), buffer fill, statistics, compress, shared memory, pickling the result and
unpickling the task. The instrumentation costs a few microseconds a sample (shown).
``--profile FILE`` also writes cProfile's top functions of the h5etl passes to FILE.
No figure here is asserted anywhere; ``test_benchmarks_worker_cost.py`` runs it tiny.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import cProfile
import functools
import hashlib
import importlib.util
import io
import os
import pickle
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
BATCH = 32  # honest_limit's block


def _honest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("honest_limit", BENCH / "honest_limit.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    # one process holds both sides here (see the module docstring)
    module.__dict__["no_h5etl"] = lambda where: None
    return module


# --------------------------------------------------------------------------------------------
# the instrumented steps: each wrapped call's own CPU time, its wrapped callees' excluded


class Steps:
    """CPU nanoseconds per step, exclusive of wrapped callees, while ``patched`` holds."""

    def __init__(self) -> None:
        self.own: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._children: list[int] = []

    def wrap(self, step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock, children = time.process_time_ns, self._children
        own, calls = self.own, self.calls

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            children.append(0)
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - start
                inner = children.pop()
                own[step] += spent - inner
                calls[step] += 1
                if children:
                    children[-1] += spent

        return timed

    @contextlib.contextmanager
    def patched(self, targets: Sequence[tuple[object, str, str]]) -> Iterator[None]:
        """Each ``(owner, attribute, step)`` wrapped while inside (an owner may be a class)."""
        saved = []
        for owner, name, step in targets:
            original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, self.wrap(step, getattr(owner, name)))
        try:
            yield
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)


def _shared_targets() -> list[tuple[object, str, str]]:
    """Library calls both sides make: libpng, the codecs, SHA-256."""
    import imagecodecs

    return [
        (imagecodecs, "png_decode", "libpng decode"),
        (imagecodecs, "lzf_encode", "compress"),
        (imagecodecs, "blosc_encode", "compress"),
        (hashlib, "sha256", "sha256 (files, chunks, rows)"),
    ]


# (module, attribute: a function, or Class.method, step); what a tree lacks is skipped,
# so that ``PYTHONPATH=<an older tree>`` measures that tree's worker (before and after)
H5ETL_STEPS = (
    ("h5etl.inputs.opening", "read_file", "read"),
    ("h5etl.inputs.plainpng", "shape_of", "png header walk"),
    ("h5etl.inputs.raster", "decode_field", "decode (rest)"),
    ("h5etl.kinds.mask_values", "check_mask", "mask check"),
    ("h5etl.kinds.image", "fit", "fit"),
    ("h5etl.kinds.mask", "fit", "fit"),
    ("h5etl.kinds.placement", "place", "place (pad)"),
    ("h5etl.decode.task", "_batch_buffer", "buffer fill"),
    ("h5etl.decode.rows", "_batch_buffer", "buffer fill"),
    ("h5etl.decode.rows", "TaskRows.row", "buffer fill"),
    ("h5etl.decode.gather", "_task_stats", "statistics"),
    ("h5etl.format.codec", "encode_block", "encode (rest)"),
    ("h5etl.format.digest", "block_digest", "digest (rest)"),
    ("h5etl.execute.shared_memory", "share", "shared memory"),
    ("h5etl.kinds.image", "ImageKind.decode", "kind decode (rest)"),
    ("h5etl.kinds.mask", "MaskKind.decode", "kind decode (rest)"),
)


def _h5etl_targets() -> list[tuple[object, str, str]]:
    targets = _shared_targets()
    for module_name, attribute, step in H5ETL_STEPS:
        try:
            owner: object = importlib.import_module(module_name)
        except ImportError:
            continue
        *classes, name = attribute.split(".")
        for cls in classes:
            owner = getattr(owner, cls, None)
        if owner is not None and hasattr(owner, name):
            targets.append((owner, name, step))
    return targets


def _honest_targets(honest: ModuleType) -> list[tuple[object, str, str]]:
    return [
        *_shared_targets(),
        (honest, "_read", "read"),
        (honest, "_mask_labels", "mask check"),
        (honest, "_place", "place (pad)"),
        (honest, "_image_stats", "statistics"),
        (honest, "encode", "encode (rest)"),
    ]


# --------------------------------------------------------------------------------------------
# the two sides


@dataclass
class Side:
    """One side's work: a call per task, and the samples it decodes."""

    name: str
    run: Callable[[], int]  # runs every task once; returns the samples decoded
    targets: list[tuple[object, str, str]]


def h5etl_side(config: Path, samples: int) -> tuple[Side, list[list[tuple[str, str]]]]:
    """h5etl's worker over the first tasks of ``config``'s plan holding ``samples`` samples,
    as a pool worker runs them; and those samples' (image, mask) paths, task by task."""
    from joblib.externals.loky.backend import reduction

    from h5etl import load_spec
    from h5etl.dataflow import DecodeTask
    from h5etl.decode import task as decode
    from h5etl.execute import assembly, schedule, shared_memory
    from h5etl.plan import admit, discover

    spec = load_spec(config)
    plan = admit.plan(spec, discover.find_samples(spec).samples, headers=False)
    recipe = assembly.recipe_of(plan)
    tasks: list[DecodeTask] = []
    pairs: list[list[tuple[str, str]]] = []
    for task in assembly.cutter(spec, plan, None):
        if not isinstance(task, DecodeTask):
            continue
        kept = task.samples[: task.rows] if not task.final else task.samples
        tasks.append(task)
        pairs.append([(s.paths[0], s.paths[1]) for s in kept])
        if sum(map(len, pairs)) >= samples:
            break
    owner = os.getpid()
    direct = schedule.direct_verdicts(recipe)
    slots = shared_memory.Slots(owner, most=4)
    atexit.register(slots.close)  # its files in /dev/shm go with this process
    # what loky sends a worker per task: the call and its arguments, pickled by the parent
    calls = [
        reduction.dumps((schedule.run_pooled, decode.decode_batch, t, recipe, owner, direct))
        for t in tasks
    ]

    def run() -> int:
        done = 0
        for sent in calls:
            slot = slots.take()
            fn, worker, task, got_recipe, parent, verdicts = _unpickle_task(sent)
            result = fn(worker, task, got_recipe, parent, slot, verdicts)
            reply = _pickle_result(reduction, result)
            done += result.accepted
            del result
            # the parent's side, outside the worker's cost but needed to give the slot back
            back = shared_memory.attach(pickle.loads(reply), slots, slot)
            del back
        return done

    return Side("h5etl", run, _h5etl_targets()), pairs


def _unpickle_task(sent: bytes) -> Any:
    return pickle.loads(sent)


def _pickle_result(reduction: Any, result: Any) -> bytes:
    return bytes(reduction.dumps(result))


def honest_side(honest: ModuleType, codec: str, pairs: list[list[tuple[str, str]]]) -> Side:
    """The honest limit's block over the same samples, 32 a call, as its pool runs them."""
    from joblib.externals.loky.backend import reduction

    flat = [pair for task in pairs for pair in task]
    blocks = [flat[i : i + BATCH] for i in range(0, len(flat), BATCH)]
    calls = [reduction.dumps((honest.block, block, codec)) for block in blocks]

    def run() -> int:
        done = 0
        for sent in calls:
            fn, block, name = _unpickle_task(sent)
            reply = fn(block, name)
            _pickle_result(reduction, reply)
            done += reply["samples"]
        return done

    return Side("honest", run, _honest_targets(honest))


HANDOFF = [("_unpickle_task", "unpickle task"), ("_pickle_result", "pickle result")]


def _handoff_targets() -> list[tuple[object, str, str]]:
    this = sys.modules[__name__]
    return [(this, name, step) for name, step in HANDOFF]


# --------------------------------------------------------------------------------------------
# measuring


def cpu_per_sample(side: Side) -> float:
    """Microseconds of this process's CPU per sample for one pass over the tasks."""
    start = time.process_time_ns()
    done = side.run()
    return (time.process_time_ns() - start) / 1e3 / max(done, 1)


def steps_per_sample(side: Side) -> tuple[dict[str, float], float]:
    """One instrumented pass: microseconds per sample by step (``other`` the rest), total."""
    steps = Steps()
    with steps.patched([*side.targets, *_handoff_targets()]):
        start = time.process_time_ns()
        done = max(side.run(), 1)
        total = time.process_time_ns() - start
    out = {step: ns / 1e3 / done for step, ns in steps.own.items()}
    out["other"] = total / 1e3 / done - sum(out.values())
    return out, total / 1e3 / done


@dataclass
class Figures:
    plain: dict[str, list[float]]  # side -> CPU us/sample, per pass
    ratios: list[float]  # per repeat: the honest side's CPU over h5etl's
    steps: dict[str, list[dict[str, float]]]  # side -> step breakdown per repeat
    instrumented: dict[str, list[float]]


def measure(sides: Sequence[Side], repeats: int) -> Figures:
    """Each repeat runs the sides A B B A (a load that drifts weighs on both alike) and
    notes the ratio of their sums; then one instrumented pass of each."""
    for side in sides:  # warm: page cache, buffers, lazily imported modules, codec checks
        side.run()
    names = [s.name for s in sides]
    figures = Figures({n: [] for n in names}, [], {n: [] for n in names}, {n: [] for n in names})
    for _ in range(repeats):
        spent = dict.fromkeys(names, 0.0)
        for side in [*sides, *reversed(sides)]:
            cost = cpu_per_sample(side)
            figures.plain[side.name].append(cost)
            spent[side.name] += cost
        if "honest" in spent and "h5etl" in spent:
            figures.ratios.append(spent["honest"] / spent["h5etl"])
        for side in sides:
            steps, total = steps_per_sample(side)
            figures.steps[side.name].append(steps)
            figures.instrumented[side.name].append(total)
    return figures


def table(codec: str, figures: Figures) -> str:
    names = list(figures.plain)
    median = {n: statistics.median(figures.plain[n]) for n in names}
    lines = [
        f"### {codec}: worker CPU per sample (us), medians of {len(figures.steps[names[0]])}",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    every = sorted({k for n in names for s in figures.steps[n] for k in s} - {"other"})
    for step in [*every, "other"]:
        cells = [
            f"{statistics.median(s.get(step, 0.0) for s in figures.steps[n]):.1f}" for n in names
        ]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    instrumented = [f"{statistics.median(figures.instrumented[n]):.1f}" for n in names]
    lines.append("| **total, instrumented** | " + " | ".join(instrumented) + " |")
    lines.append("| **total, plain** | " + " | ".join(f"{median[n]:.1f}" for n in names) + " |")
    if figures.ratios:
        low, high = min(figures.ratios), max(figures.ratios)
        lines.append("")
        lines.append(
            f"honest / h5etl (per-sample CPU, the limit's share): "
            f"**{statistics.median(figures.ratios):.3f}** (repeats {low:.3f}-{high:.3f})"
        )
    return "\n".join(lines)


def profile(sides: Sequence[Side], out: Path) -> None:
    """cProfile of the h5etl side (one pass), its top functions by own time."""
    profiler = cProfile.Profile()
    for side in sides:
        if side.name == "h5etl":
            profiler.runcall(side.run)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    out.write_text(text.getvalue(), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="with images/, <codec>.yaml")
    parser.add_argument("--codec", action="append", choices=["lzf", "blosc-lz4"])
    parser.add_argument("--samples", type=int, default=1024, help="about this many samples")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=Path, help="write cProfile's top functions here")
    args = parser.parse_args(argv)
    honest = _honest()
    for name, value in honest.THREAD_LIMITS.items():  # as the CLI and the pool's workers
        os.environ.setdefault(name, value)
    for codec in args.codec or ["lzf", "blosc-lz4"]:
        side, pairs = h5etl_side(args.corpus / f"{codec}.yaml", args.samples)
        sides = [side, honest_side(honest, codec, pairs)]
        print(table(codec, measure(sides, args.repeats)), flush=True)
        print(flush=True)
        if args.profile is not None:
            profile(sides, args.profile.with_name(f"{args.profile.stem}-{codec}.txt"))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
