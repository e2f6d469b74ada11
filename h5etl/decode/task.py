"""task: in a worker, turn one task's files into validated, stacked, compressed columns.

Per sample: read the bytes once (hashing them for lineage), then each field's kind decodes,
fits and validates its value (``h5etl.kinds``); a sample is kept only when every field
accepts it. Per task: keep whole chunks of accepted samples (reserves replace rejects; what
cannot fill a chunk is deferred), placed a block of rows at a time (``h5etl.decode.rows``:
each block compressed, hashed and counted as soon as it is full), then
``h5etl.decode.gather`` gathers the other columns and the statistics, so the single writer
only writes. Scheduling the tasks is ``h5etl.execute.schedule``'s job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from h5etl.dataflow import (
    BatchResult,
    DecodeTask,
    Reject,
    Sample,
    sample_rejects,
)
from h5etl.decode import probes
from h5etl.decode.gather import gather
from h5etl.decode.recipe import DecodedSample, DecodeRecipe
from h5etl.decode.rows import TaskRows
from h5etl.decode.worker_memory import trim_when_gone
from h5etl.errors import H5EtlError, RejectError
from h5etl.inputs import opening as inputs
from h5etl.kinds.base import (
    Kind,
    SampleContext,
)

if TYPE_CHECKING:  # workers import apply only for a build that runs transforms
    from h5etl.transforms.apply import Transforms

STAGE = "decode"


def _decode_sample(
    sample: Sample, recipe: DecodeRecipe, position: int, *, raw: bool = False
) -> DecodedSample:
    """Decode one sample through every field's kind; rejects raise ``RejectError``."""
    files = sample.paths
    # never a plain open(): a file swapped for a FIFO since it was listed would block it;
    # a source its kind reads itself (a case folder, a volume streamed) is not read here
    contents = [
        b"" if index in recipe.self_read else inputs.read_file(path)
        for index, path in enumerate(files)
    ]
    extras = dict(zip(recipe.plan_fields, sample.extras, strict=True))
    context = SampleContext(sample, contents, extras, files, raw=raw, whole=recipe.whole)
    values: dict[str, Any] = {}
    transforms = recipe.transforms
    for index in recipe.order:
        kind = recipe.kinds[index]
        try:
            found = kind.decode(context)
        except H5EtlError:
            raise
        except Exception as exc:  # a kind's bug (a plugin's, say): its traceback names no input
            exc.add_note(f"h5etl: in {kind.kind} field {kind.name!r} of sample {sample.key!r}")
            exc.add_note(f"h5etl: its files: {', '.join(files)}")
            raise
        if kind.name in recipe.multi:
            values.update(_column_values(kind, found))
        else:
            values[kind.name] = found
        if transforms is not None:  # a build without transforms pays this test only
            _run_chain(transforms, kind.name, sample.key, values, context)
    if transforms is not None:
        _run_sample_calls(transforms, sample.key, values)
    decoded = DecodedSample(
        position,
        sample,
        values,
        tuple(
            context.digests.get(index) or hashlib.sha256(data).hexdigest()
            for index, data in enumerate(contents)
        ),
        context.conversions,
    )
    return decoded


def _run_chain(
    transforms: Transforms, name: str, key: str, values: dict[str, Any], context: SampleContext
) -> None:
    """Field ``name``'s chain, right after its decode and fit (before padding): a field
    derived from it (``depends_on``, ``context.fitted``) then sees its transformed value."""
    chain = transforms.chain_of.get(name)
    if chain is not None:
        from h5etl.transforms.apply import run_chain  # imported by builds with transforms only

        values[name] = run_chain(transforms, chain, key, values[name])
    if name in values:  # what a derive call reads: the value as stored, after the chain
        context.fitted[name] = values[name]


def _run_sample_calls(transforms: Transforms, key: str, values: dict[str, Any]) -> None:
    """The sample-level calls, after every field; then each touched field's result checked."""
    from h5etl.transforms.apply import check_results, run_sample_calls

    if transforms.sample_calls:
        values.update(run_sample_calls(transforms, key, values))
    check_results(transforms, values)


def _rejects_of(sample: Sample, exc: RejectError, recipe: DecodeRecipe) -> list[Reject]:
    """A rejected sample's rejects, named as a dry run's header probe names them when the
    headers show a defect: they come first (``h5etl.inputs.reasons``), so one damage gets one
    reason whichever stage finds it. Only rejected samples pay for the probe."""
    if recipe.probes is not None:
        found = probes.probe_samples([sample], recipe.probes)[0]
        if isinstance(found, list):
            return [dataclasses.replace(reject, stage=STAGE) for reject in found]
    found = sample_rejects(sample, STAGE, exc.reason, exc.message, str(exc.path or ""))
    frame = getattr(exc, "frame", "")  # a transform_error's: where user code raised
    return [dataclasses.replace(r, frame=frame) for r in found] if frame else found


def _column_values(kind: Kind, found: Any) -> dict[str, Any]:
    """A multi-column kind's value per column (its contract: a dict of exactly them)."""
    if not isinstance(found, dict) or set(found) != set(kind.columns):
        got = sorted(found) if isinstance(found, dict) else type(found).__name__
        raise TypeError(
            f"{kind.kind} field {kind.name}: decode must return a dict of its "
            f"columns {sorted(kind.columns)}, got {got}"
        )
    return found


def capacity_of(task: DecodeTask) -> int:
    """How many accepted samples a task keeps at most: its rows, or all for a final task."""
    return len(task.samples) if task.final else task.rows


def done_decoding(task: DecodeTask, accepted: int, position: int) -> bool:
    """Whether a task stops before ``task.samples[position]``, deferring the rest undecoded.

    It stops once it holds its rows, and (unless final) before starting a block that the
    samples left cannot fill even if none is rejected: decoding them would only be redone.
    """
    if accepted == capacity_of(task):
        return True
    left = len(task.samples) - position
    return not task.final and accepted % task.block == 0 and left < task.block


def keep_whole_blocks(task: DecodeTask, accepted: int) -> int:
    """How many of ``accepted`` samples a task stores: all in a final task, else whole blocks.

    A task that met more rejects than it had reserves keeps only whole chunks of every
    field, so the writer never re-cuts chunks; the rest of its samples are queued again.
    """
    if task.final or accepted >= task.rows:
        return min(accepted, capacity_of(task))
    return accepted // task.block * task.block


def _decode_all(
    task: DecodeTask,
    recipe: DecodeRecipe,
    result: BatchResult,
    kept: list[DecodedSample],
    rows: TaskRows,
) -> None:
    """Decode ``task``'s samples in order into ``kept`` and their ``rows`` until it holds
    its rows; rejects and the deferred reserves go to ``result``."""
    for position, sample in enumerate(task.samples):
        if done_decoding(task, len(kept), position):
            result.deferred.extend(range(position, len(task.samples)))
            break
        try:
            decoded = _decode_sample(sample, recipe, position, raw=task.raw)
        except RejectError as exc:
            result.rejects.extend(_rejects_of(sample, exc, recipe))
            continue
        except MemoryError:
            result.rejects.extend(
                sample_rejects(sample, STAGE, "memory_error", "ran out of memory decoding")
            )
            continue
        # Only a sample that passed every check touches its row: a rejected one must not
        # leave pixels in the padding of the sample that takes the row next.
        values = decoded.values
        for kind, name, _ in recipe.arrays:
            row = rows.row(name, len(kept))
            # placed, the value is its row's: freed now, the next sample's decode reuses
            # the memory while it is still in the caches
            value = values.pop(name)
            window = (
                kind.place(value, row) if name == kind.name else _copy_into(kind, name, value, row)
            )
            decoded.windows[name] = window  # statistics once per block, over these
        kept.append(decoded)
        rows.added(kept)


def _fetched_ahead(task: DecodeTask) -> contextlib.AbstractContextManager[None]:
    """Objects on object storage (a task with stamps): read together, ahead, as listed."""
    if not task.stamps:
        return contextlib.nullcontext()
    from h5etl.inputs import remote_files  # only a build from object storage loads it

    return remote_files.fetched(zip((s.paths for s in task.samples), task.stamps, strict=True))


def decode_batch(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """Decode one task. Runs in a worker process; only plain data goes in and out.

    Samples are decoded in order until the task's rows are accepted; the reserves after
    that are not decoded and come back deferred (see ``DecodeTask``).
    """
    started = time.perf_counter()
    rows = TaskRows(task, recipe, capacity_of(task))
    result = BatchResult(task, 0)
    kept: list[DecodedSample] = []
    with _fetched_ahead(task):
        _decode_all(task, recipe, result, kept, rows)
    keep = keep_whole_blocks(task, len(kept))
    result.deferred = sorted([*result.deferred, *(d.position for d in kept[keep:])])
    del kept[keep:]
    gather(result, recipe, kept, rows.finish(kept, keep))
    # A CT case's thousands of compressed chunks are small heap blocks: freed once the
    # result is sent, the heap would keep them and an idle worker its peak (4 workers held
    # 4 cases' worth at a window of 2). Trim when the result is gone and the worker idles.
    trim_when_gone(result)
    result.seconds = time.perf_counter() - started
    return result


def _copy_into(kind: Kind, name: str, value: Any, row: np.ndarray) -> np.ndarray:
    """A fixed column other than a kind's main one takes its value as is, or shorter along
    its first axis (a recording padded to a fixed duration): copied to the start of the
    row, whose rest keeps the column's fill. Returns the window it fills (its statistics)."""
    array = np.asarray(value)
    if array.shape[1:] != row.shape[1:] or not 0 <= len(array) <= len(row):
        raise TypeError(
            f"{kind.kind} field {kind.name}: column {name} takes {row.shape} values (or "
            f"fewer rows), got {array.shape}"
        )
    window = row[: len(array)]
    window[...] = array
    return window
