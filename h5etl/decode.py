"""decode: in a worker, turn one task's files into validated, stacked, compressed chunks.

Per sample: read the bytes once (hashing them for lineage), decode, convert the mode, fit
(crop/resize/pad), validate masks. Per task: keep whole chunks of accepted samples (reserves
replace rejects; what cannot fill a chunk is deferred), compress them and hash each block, so
the single writer only writes. Scheduling the tasks is ``h5etl.schedule``'s job.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from h5etl import digest, geometry, images, inputs, validate
from h5etl.chunkcodec import ChunkLayout, encode_block
from h5etl.errors import RejectError
from h5etl.records import BatchResult, DecodeTask, Sample, sample_rejects

if TYPE_CHECKING:  # workers import this module; pydantic stays out of them
    from h5etl.spec import Spec

STAGE = "decode"


@dataclass(frozen=True, slots=True)
class FieldRecipe:
    name: str
    source_index: int
    mode: images.Mode
    values: tuple[int, ...] | None
    layout: ChunkLayout
    fill: int  # pad.fill for images; pad.mask_fill for masks, so padding is a valid label


@dataclass(frozen=True, slots=True)
class DecodeRecipe:
    """Everything a worker needs, frozen and picklable: no handles, no paths to configs."""

    image_fields: tuple[FieldRecipe, ...]
    text_fields: tuple[tuple[str, int], ...]  # (field name, source index)
    oversize: str

    @classmethod
    def from_spec(cls, spec: Spec, layouts: dict[str, ChunkLayout]) -> DecodeRecipe:
        sources = list(spec.sources)
        fields = []
        for name in spec.image_fields:
            field = spec.fields[name]
            assert field.mode is not None
            fields.append(
                FieldRecipe(
                    name,
                    sources.index(spec.source_of(name)),
                    field.mode,
                    field.values,
                    layouts[name],
                    spec.pad.fill if field.values is None else spec.pad.mask_fill,
                )
            )
        texts = tuple((name, sources.index(spec.source_of(name))) for name in spec.text_fields)
        return cls(tuple(fields), texts, spec.pad.oversize)


def _fit(array: np.ndarray, field: FieldRecipe, oversize: str) -> np.ndarray:
    target = (field.layout.shape[1], field.layout.shape[2])
    size = (array.shape[0], array.shape[1])
    if not geometry.is_oversize(size, target):
        return array
    if oversize == "resize":
        return images.resize(
            array, geometry.fit_within(size, target), is_mask=field.values is not None
        )
    if oversize == "crop":
        return geometry.center_crop(array, target)
    raise RejectError("oversize", f"{size[0]}x{size[1]} is larger than {target[0]}x{target[1]}")


def _decode_sample(
    sample: Sample, recipe: DecodeRecipe, out: dict[str, np.ndarray], row: int
) -> tuple[str, ...]:
    """Decode one sample into row ``row`` of ``out``; return each file's hex SHA-256."""
    files = sample.files
    # never a plain open(): a file swapped for a FIFO since it was listed would block it
    contents = [inputs.read_file(source_file.path) for source_file in files]
    decoded = []
    for field in recipe.image_fields:
        path = files[field.source_index].path
        labels = frozenset(field.values) if field.values is not None else None
        array = images.decode(
            contents[field.source_index], field.mode, path=path, mask_labels=labels
        )
        if field.values is not None:
            with images.rejecting_surprises(path, "check the mask"):
                array = validate.check_mask(array, field.values, path=path)
        decoded.append((field, path, array))
    sizes = {array.shape[:2] for _, _, array in decoded}
    if len(sizes) > 1:  # the header probe cannot see an orientation stored after the pixels
        shown = ", ".join(f"{f.name} {a.shape[0]}x{a.shape[1]}" for f, _, a in decoded)
        raise RejectError(
            "size_mismatch", f"sizes differ after decoding (HxW): {shown}", path=decoded[0][1]
        )
    fitted = []
    for field, path, array in decoded:
        try:
            with images.rejecting_surprises(path, recipe.oversize):  # resize runs Pillow
                fitted.append((field, _fit(array, field, recipe.oversize)))
        except RejectError as exc:
            exc.path = path
            raise
    # Only a sample that passed every check touches its row: a rejected one must not leave
    # pixels in the padding of the sample that takes the row next.
    for field, array in fitted:
        geometry.place(array, out[field.name][row])
    return tuple(hashlib.sha256(data).hexdigest() for data in contents)


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


def decode_batch(task: DecodeTask, recipe: DecodeRecipe) -> BatchResult:
    """Decode one task. Runs in a worker process; only plain data goes in and out.

    Samples are decoded in order until the task's rows are accepted; the reserves after
    that are not decoded and come back deferred (see ``DecodeTask``).
    """
    started = time.perf_counter()
    capacity = capacity_of(task)
    out = {f.name: _batch_buffer(f, capacity) for f in recipe.image_fields}
    result = BatchResult(task, 0)
    kept: list[tuple[int, Sample]] = []
    for position, sample in enumerate(task.samples):
        if done_decoding(task, len(kept), position):
            result.deferred.extend(range(position, len(task.samples)))
            break
        try:
            hashes = _decode_sample(sample, recipe, out, len(kept))
        except RejectError as exc:
            result.rejects.extend(
                sample_rejects(sample, STAGE, exc.reason, exc.message, str(exc.path or ""))
            )
            continue
        except MemoryError:
            result.rejects.extend(
                sample_rejects(sample, STAGE, "memory_error", "ran out of memory decoding")
            )
            continue
        result.lineage.append(hashes)
        kept.append((position, sample))
    keep = keep_whole_blocks(task, len(kept))
    result.deferred = sorted([*result.deferred, *(position for position, _ in kept[keep:])])
    del kept[keep:], result.lineage[keep:]
    result.accepted = keep
    result.keys = [sample.key for _, sample in kept]
    for name, index in recipe.text_fields:
        result.texts[name] = [sample.relpaths[index] for _, sample in kept]
    _finish_arrays(result, recipe, {name: rows[:keep] for name, rows in out.items()})
    if result.raw:  # the rows leave with the result: the next task needs new buffers
        drop_buffers()
    result.seconds = time.perf_counter() - started
    return result


# Per-process batch buffers, reused while tasks end as encoded bytes: a fresh multi-megabyte
# array per task costs page faults on every first touch, a reused one only the fill.
_BUFFERS: dict[str, np.ndarray] = {}


def drop_buffers() -> None:
    """Forget this process's batch buffers (their rows left with a result, or the build ended)."""
    _BUFFERS.clear()


def _batch_buffer(field: FieldRecipe, count: int) -> np.ndarray:
    shape = (count, *field.layout.shape)
    buffer = _BUFFERS.get(field.name)
    if (
        buffer is None
        or buffer.dtype != np.dtype(field.layout.dtype)
        or buffer.shape[1:] != shape[1:]
        or buffer.shape[0] < count
    ):
        buffer = np.empty(shape, dtype=field.layout.dtype)
        _BUFFERS[field.name] = buffer
    rows = buffer[:count]
    rows.fill(field.fill)
    return rows


def _finish_arrays(
    result: BatchResult, recipe: DecodeRecipe, arrays: dict[str, np.ndarray]
) -> None:
    """Compress and hash the kept rows block by block; the last block of a final task is
    zero-padded to a whole chunk, as HDF5 stores an edge chunk."""
    for field in recipe.image_fields:
        rows = arrays[field.name]
        if result.task.raw:
            result.raw[field.name] = rows
            continue
        step = field.layout.rows
        encoded, digests = [], []
        for start in range(0, len(rows), step):
            block = rows[start : start + step]
            digests.append(digest.block_digest(block))
            if len(block) < step:
                padded = np.zeros((step, *field.layout.shape), dtype=field.layout.dtype)
                padded[: len(block)] = block
                block = padded
            encoded.append(encode_block(field.layout, block))
        result.encoded[field.name] = encoded
        result.block_sha256[field.name] = digests
