"""Keras 3 integration: a ``keras.utils.PyDataset`` that reads one chunk-aligned batch per step.

Import this module only when you use Keras (``h5etl.readers`` imports it lazily). Choose the
Keras backend as usual (``KERAS_BACKEND``) before importing it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from h5etl.errors import ReaderError
from h5etl.readers._core import CacheBytes, Release
from h5etl.readers._fields import channel_fields, channels_last, keras_fields
from h5etl.readers._source import CacheDir, ReleaseFile

Fields = str | Sequence[str]


AUTO = "auto"  # x or y taken from the release's layout record


def _from_record(
    path: ReleaseFile, split: str, x: Fields, y: Fields | None
) -> tuple[Fields, Fields | None]:
    """``x`` and ``y`` where they are ``AUTO``, from the kinds' reader hints: the first input
    field (an image); the first target, a mask before a label (``keras_rank``)."""
    fields = Release(path, split).layout.fields
    if x == AUTO:
        inputs = keras_fields(fields, "input")
        if not inputs:
            raise ReaderError(f"split {split!r} has no image field: pass x=", path=path.name)
        x = inputs[0]
    if y == AUTO:
        targets = keras_fields(fields, "target")
        y = targets[0] if targets else None
    return x, y


class KerasDataset(keras.utils.PyDataset):  # type: ignore[misc]
    """One split of a release as batches for ``model.fit``: ``(x, y)`` or ``x`` alone.

    Batch ``k`` is a block of ``batch_size`` consecutive rows of the file (one read per field;
    with ``batch_size`` equal to the chunk rows, exactly one chunk). With ``shuffle`` the order
    of the blocks and of the rows inside each block change every epoch (seeded); the release's
    write-time shuffle decides which samples share a block. While a batch is read, the
    compressed chunks of the next one start decoding in the background. Safe with ``workers``
    and ``use_multiprocessing``: it pickles as a recipe and opens the file once per process.

    Parameters:
        path: the release or its link; the link is resolved once, here.
        split: the group to read.
        x: the input field, or several (then ``x`` is a dict of arrays); by default
            (``"auto"``) the release's first image field, as its layout record says.
        y: the target field(s), or ``None`` to yield ``x`` only; by default (``"auto"``) the
            first mask field, else the first label field (a classification release), else
            none.
        batch_size: rows per step; default one chunk of the first field.
        shuffle: reshuffle block and row order every epoch.
        seed: the seed of the per-epoch orders.
        channels_last: images and masks as (batch, H, W, C), Keras's default
            ``image_data_format``, instead of as stored, (batch, C, H, W): a transposed
            view of the rows read (no copy here; none at all without it). The ``transform``
            sees the batch so.
        transform: applied to each batch dict (field name -> array) before it is split.
        cache_bytes: decoded chunks kept per process (see :class:`Release`); with
            ``"split"`` each chunk is decoded once and later epochs read at memory speed.
            Keras starts new worker processes every epoch, so with ``use_multiprocessing``
            the cache lasts one epoch; thread workers (the default) keep it.
        cache_dir: for a release on object storage, a directory that keeps the blocks read
            (see :class:`Release`).
        **kwargs: ``workers``, ``use_multiprocessing``, ``max_queue_size`` for ``PyDataset``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | ReleaseFile,
        split: str,
        *,
        x: Fields = AUTO,
        y: Fields | None = AUTO,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
        cache_bytes: CacheBytes = None,
        channels_last: bool = False,
        cache_dir: CacheDir = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        source = ReleaseFile.of(path, cache_dir)  # resolved (and pinned) once, here
        if AUTO in (x, y):
            x, y = _from_record(source, split, x, y)
        self.x, self.y = x, y
        names = [*_names(x), *(_names(y) if y is not None else [])]
        probe = Release(source, split, fields=names, batch_size=batch_size or 1)
        self.batch_size = batch_size or probe.chunk_rows
        # The probe's resolved file, not ``path`` again: a link swapped meanwhile would give
        # a batch size taken from one release and rows read from another.
        self.release = Release(
            source, split, fields=names, batch_size=self.batch_size, cache_bytes=cache_bytes
        )
        if self.use_multiprocessing:  # the workers and this process share the memory cap
            self.release.processes = self.workers + 1
        self.shuffle = shuffle
        self.seed = seed
        self.transform = transform
        self.epoch = 0
        self.channels_last = (
            channel_fields(self.release.layout, names) if channels_last else frozenset()
        )

    def __len__(self) -> int:
        return math.ceil(len(self.release) / self.batch_size)

    def rows(self, index: int) -> np.ndarray:
        """The file rows of batch ``index`` in the current epoch, in the order yielded."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} out of range for {len(self)} batches")
        if not self.shuffle:
            start = index * self.batch_size
            return np.arange(start, min(start + self.batch_size, len(self.release)))
        block = int(np.random.default_rng([self.seed, self.epoch]).permutation(len(self))[index])
        start = block * self.batch_size
        rows = np.arange(start, min(start + self.batch_size, len(self.release)))
        return np.random.default_rng([self.seed, self.epoch, block]).permutation(rows)

    def __getitem__(self, index: int) -> Any:
        rows = self.rows(index)
        if index + 1 < len(self):  # the next block's chunks decode while this one is used
            self.release.prefetch(self.rows(index + 1))
        batch = self.release.read(rows)  # one block of rows, gathered in the order yielded
        batch = channels_last(batch, self.channels_last)
        if self.transform is not None:
            batch = self.transform(batch)
        ragged = [n for n in self.release.ragged if _per_sample(batch.get(n))]
        if ragged:
            raise ReaderError(
                f"{', '.join(ragged)}: a ragged column (one array per sample, lengths differ) "
                "cannot be one Keras tensor; pass transform= that pads or crops it to one "
                "shape, or read fields of one shape",
                path=self.release.path,
            )
        inputs = _pick(batch, self.x)
        return inputs if self.y is None else (inputs, _pick(batch, self.y))

    def on_epoch_end(self) -> None:
        """Advance to the next epoch's order."""
        self.epoch += 1

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next batches follow."""
        self.epoch = epoch

    def close(self) -> None:
        """Close this process's file handle (the next read reopens it)."""
        self.release.close()


def _per_sample(value: Any) -> bool:
    """Whether a batch entry is still one array per sample (a ragged column's object array)."""
    return isinstance(value, np.ndarray) and value.dtype.kind == "O"


def _names(fields: Fields) -> list[str]:
    return [fields] if isinstance(fields, str) else list(fields)


def _pick(batch: dict[str, np.ndarray], fields: Fields) -> Any:
    if isinstance(fields, str):
        return batch[fields]
    return {name: batch[name] for name in fields}
