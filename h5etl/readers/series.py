"""Read a series field: one dict of arrays per recording (or window), and a padding collate.

``SeriesReader(path, "train")[i]`` is ``{"recording_accel": (n, 3), "recording_temperature":
(m,), "recording_temperature_time": (m,), "recording_start_time": float, ...}``: keys are the
release's column names, as ``Release`` and the layout record name them (the field, ``_``, the
channel: unique however many series fields a release has); each channel read as one contiguous
slice of its values (``values[offsets[i]:offsets[i + 1]]``; the offsets are read once). It
is a picklable recipe, opened lazily once per process, so it works as a PyTorch map-style
dataset as it is: ``DataLoader(reader, batch_size=8, collate_fn=collate_torch)``.
``collate`` pads each channel of a batch to its longest and returns the lengths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5etl.errors import ReaderError
from h5etl.format import contract as fileformat
from h5etl.readers._fields import require_parts
from h5etl.readers._source import CacheDir, ReleaseFile

KIND = "series"


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """What the release says about one channel: its rate (None: read its timestamps),
    units, dtype and the shape of one of its samples."""

    rate_hz: float | None
    units: str
    dtype: np.dtype[Any]
    trailing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Column:
    key: str  # in a sample's dict
    path: str
    ragged: bool


def _series_field(record: fileformat.LayoutRecord, field: str | None, path: Path | str) -> str:
    found = [name for name, r in record.fields.items() if r.kind == KIND]
    if field is None:
        if len(found) != 1:
            raise ReaderError(
                f"name the series field to read (field=...): the release has {found or 'none'}",
                path=path,
            )
        return found[0]
    if field not in found:
        raise ReaderError(f"no series field {field!r}; its series fields: {found}", path=path)
    return field


class SeriesReader:
    """The samples of one series field of one split, as dicts of numpy arrays.

    Keys are the storage column names, as ``Release`` reads them (``<field>_<channel>``):
    each channel, ``<field>_<channel>_time`` for a channel with timestamps (seconds from
    ``<field>_start_time``), ``<field>_start_time``; with a fixed duration
    ``<field>_<channel>_length`` (the real samples before padding); with windows
    ``<field>_recording`` and ``<field>_offset`` (seconds). ``channels`` is keyed the same.

    Raises:
        ReaderError: not an HDF5 release, no such split or series field.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | ReleaseFile,
        split: str = "train",
        field: str | None = None,
        *,
        cache_dir: CacheDir = None,
    ):
        # resolved once: a local link's target, or a URL's pinned release
        self.source = ReleaseFile.of(path, cache_dir)
        self.path: Path | str = self.source.path or self.source.name
        self.split = split
        with self.source.open() as handle:
            try:
                record = fileformat.read_layout(handle)
            except ValueError as exc:
                raise ReaderError(str(exc), path=self.path) from exc
            if split not in record.splits:
                raise ReaderError(
                    f"no split {split!r}; it has {list(record.splits)}", path=self.path
                )
            self.field = _series_field(record, field, self.path)
            self.channels: dict[str, ChannelInfo] = {}
            self._columns = self._find_columns(record, handle)
            columns = [handle.get(c.path) for c in self._columns]
            require_parts(handle, self.path, [c for c in columns if isinstance(c, h5py.Dataset)])
            first = self._columns[0]
            dataset = handle[first.path]
            self.length = (
                len(handle[fileformat.offsets_path(first.path)]) - 1
                if first.ragged
                else len(dataset)
            )
        self._pid: int | None = None
        self._file: h5py.File | None = None
        self._offsets: dict[str, np.ndarray] = {}
        self._datasets: dict[str, h5py.Dataset] = {}

    def _find_columns(self, record: fileformat.LayoutRecord, handle: h5py.File) -> list[_Column]:
        columns = []
        for name, part in record.fields[self.field].columns.items():
            path = record.path(self.split, name)
            columns.append(_Column(name, path, part.column == "ragged"))
            if part.extra.get("role") == "values":
                rate = part.extra.get("rate_hz")
                self.channels[name] = ChannelInfo(
                    None if rate is None else float(rate),
                    str(part.extra.get("units", "")),
                    np.dtype(part.dtype),
                    tuple(part.shape) if part.column == "ragged" else tuple(part.shape[1:]),
                )
        if not columns:
            raise ReaderError(f"series field {self.field!r} has no columns", path=self.path)
        return columns

    def __len__(self) -> int:
        return self.length

    def _open(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            self._file = self.source.open()  # a forked worker opens its own handle
            self._pid = os.getpid()
            self._offsets = {
                c.path: self._file[fileformat.offsets_path(c.path)][()]
                for c in self._columns
                if c.ragged
            }
            self._datasets = {c.path: self._file[c.path] for c in self._columns}
        return self._file

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.length <= index < self.length:
            raise IndexError(f"sample {index} of {self.length}")
        index %= self.length
        self._open()
        out: dict[str, Any] = {}
        for column in self._columns:
            dataset = self._datasets[column.path]
            if column.ragged:
                offsets = self._offsets[column.path]
                out[column.key] = dataset[offsets[index] : offsets[index + 1]]
            else:
                value = dataset[index]
                out[column.key] = value.decode() if isinstance(value, bytes) else value
        return out

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
        self._datasets = {}

    def __enter__(self) -> SeriesReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _pid=None, _offsets={}, _datasets={})  # each opens its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def collate(
    samples: Sequence[Mapping[str, Any]], *, pad_value: float = 0.0
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A batch of samples: each array key padded at the end to the batch's longest, stacked
    to (B, L, ...); numbers stacked to (B,); strings as a list. And per array key the
    (B,) int64 lengths before padding. Timestamps (``*_time``) are padded with NaN."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    batch: dict[str, Any] = {}
    lengths: dict[str, np.ndarray] = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        if isinstance(values[0], str):
            batch[key] = list(values)
            continue
        arrays = [np.asarray(v) for v in values]
        if arrays[0].ndim == 0:
            batch[key] = np.stack(arrays)
            continue
        sizes = np.array([len(a) for a in arrays], dtype=np.int64)
        fill = np.nan if key.endswith("_time") else pad_value
        out = np.full((len(arrays), int(sizes.max()), *arrays[0].shape[1:]), fill, arrays[0].dtype)
        for row, array in zip(out, arrays, strict=True):
            row[: len(array)] = array
        batch[key], lengths[key] = out, sizes
    return batch, lengths


def collate_torch(
    samples: Sequence[Mapping[str, Any]], *, pad_value: float = 0.0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``collate`` as torch tensors (strings stay a list): a DataLoader's ``collate_fn``."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError("collate_torch needs PyTorch: pip install torch") from exc
    batch, lengths = collate(samples, pad_value=pad_value)
    tensors = {k: v if isinstance(v, list) else torch.from_numpy(v) for k, v in batch.items()}
    return tensors, {k: torch.from_numpy(v) for k, v in lengths.items()}
