"""The ``series`` kind: a sensor recording, each channel its own storage column.

Columns of a field ``rec`` with channels ``accel`` and ``temp`` (a CSV with a time column):
``rec_accel`` and ``rec_temp`` (ragged: (n, *trailing) per recording; fixed when cut to a
duration or into windows), ``rec_temp_time`` (its timestamps, seconds from the start),
``rec_start_time`` (float64: the earliest timestamp, NaN when no channel has any); cut to a
duration, ``rec_<channel>_length`` (the real samples before padding); windows,
``rec_recording`` (the recording's name) and ``rec_offset`` (seconds into it). Each channel's
dataset carries ``rate_hz``, ``units`` and ``channel``. Windows are expanded at plan time
(``prepare`` probes each recording's lengths: ``.npy`` headers, CSV line counts).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from h5etl.dataflow import Sample
from h5etl.errors import RejectError
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.inputs import recording
from h5etl.inputs.channels import ChannelSpec
from h5etl.inputs.recording import Recording, RecordingSpec
from h5etl.kinds.base import Kind, SampleContext
from h5etl.kinds.columns import ArrayColumn, Column, RaggedColumn, ScalarColumn, TextColumn
from h5etl.kinds.tabular import Prepared

# Rows of a ragged chunk: about ten seconds of the channel, at least 4096 rows and at most
# about 1 MiB. Small chunks cost a compression call each (a 48 KiB chunk compresses at a
# fifth of the speed of a 768 KiB one); large chunks of a slow channel would make reading one
# recording decompress thousands of others.
CHUNK_SECONDS, MIN_CHUNK_ROWS, MAX_CHUNK_BYTES = 10, 4096, 1 << 20
PROBE_THREADS = 8  # plan-time length probes wait on the disk, not the CPU


@dataclass(frozen=True, slots=True)
class SeriesKind(Kind):
    kind: ClassVar[str] = "series"
    spec: RecordingSpec | None = None
    stored: tuple[tuple[str, Column], ...] = ()  # every column, by dataset name

    @property
    def recording_spec(self) -> RecordingSpec:
        assert self.spec is not None
        return self.spec

    @property
    def columns(self) -> Mapping[str, Column]:
        return dict(self.stored)

    @property
    def reads_own_files(self) -> bool:
        return True  # its channel files, for any number of them

    @property
    def plan_side(self) -> bool:
        return self.recording_spec.window is not None

    def companion_paths(self, path: str) -> tuple[str, ...]:
        spec = self.recording_spec
        if spec.layout != "stem":
            return ()  # a folder: stamped whole
        try:
            found = recording.channel_paths(path, spec)
        except RejectError:
            return ()  # decoding rejects it, naming why
        return tuple(found[c.name] for c in spec.channels[1:])

    @property
    def expands(self) -> bool:
        return self.recording_spec.window is not None

    @property
    def sample_nbytes(self) -> int:
        fixed = sum(
            c.layout.block_nbytes // c.layout.rows
            for _, c in self.stored
            if isinstance(c, ArrayColumn)
        )
        return fixed or 8 << 20  # a ragged recording: a guess (8 MiB), so tasks of a few pipeline

    def prepare(self, samples: Sequence[Sample]) -> Prepared:
        """Each recording's window count, from cheap length probes (in threads)."""
        assert self.source_index is not None
        index = self.source_index
        paths = [sample.paths[index] for sample in samples]
        with ThreadPoolExecutor(PROBE_THREADS) as pool:
            found = dict(zip(paths, pool.map(self._windows_or_reject, paths), strict=True))

        def value(sample: Sample) -> Any:
            outcome = found[sample.paths[index]]
            if isinstance(outcome, RejectError):
                raise outcome
            return outcome

        return Prepared(self, value)

    def _windows_or_reject(self, path: str) -> int | RejectError:
        spec = self.recording_spec
        try:
            return recording.window_count(path, spec, recording.probe_lengths(path, spec))
        except RejectError as exc:
            return exc

    def expand(self, sample: Sample, value: Any) -> list[tuple[str, Any]]:
        """The samples one recording becomes: (key, value) per window (its index)."""
        window = self.recording_spec.window
        assert window is not None
        return [(f"{sample.key}@{_seconds(window.offset_s(k))}s", k) for k in range(int(value))]

    def decode(self, context: SampleContext) -> dict[str, Any]:
        assert self.source_index is not None
        path = context.path(self.source_index)
        spec = self.recording_spec
        if spec.window is not None:
            index = int(context.extras[self.name])
            found, read = recording.read_window(path, spec, index)
            self._note(context, found, read)
            out = self._values(found)
            relpath = context.sample.relpaths[self.source_index]
            out[f"{self.name}_recording"] = recording.recording_name(relpath, spec)
            out[f"{self.name}_offset"] = spec.window.offset_s(index)
            return out
        found, read = recording.read_recording(path, spec)
        self._note(context, found, read)
        if spec.fixed is not None:  # the real samples: the row's rest keeps the fill
            for channel in spec.channels:
                real = found.lengths[channel.name]
                found.values[channel.name] = found.values[channel.name][:real]
                if channel.name in found.times:
                    found.times[channel.name] = found.times[channel.name][:real]
        out = self._values(found)
        if spec.fixed is not None:
            for channel in spec.channels:
                out[f"{self.name}_{channel.name}_length"] = found.lengths[channel.name]
        return out

    def _note(self, context: SampleContext, found: Recording, read: Mapping[str, bytes]) -> None:
        """The lineage digest of the recording: SHA-256 over each channel file's name (in
        its folder, or its own name beside the first) and the SHA-256 of what was read of
        it (a window: its own rows), sorted by name."""
        assert self.source_index is not None
        root = context.path(self.source_index)
        parts = []
        for channel, data in read.items():
            path = found.files[channel]
            name = os.path.relpath(path, root) if path.startswith(root + os.sep) else path
            parts.append(f"{os.path.basename(name) if name == path else name}\0")
            parts[-1] += f"{hashlib.sha256(data).hexdigest()}\n"
        listing = "".join(sorted(parts)).encode("utf-8", "surrogatepass")
        context.digests[self.source_index] = hashlib.sha256(listing).hexdigest()

    def _values(self, found: Recording) -> dict[str, Any]:
        out: dict[str, Any] = {f"{self.name}_start_time": found.start_s}
        for channel in self.recording_spec.channels:
            out[f"{self.name}_{channel.name}"] = found.values[channel.name]
            if channel.reads_times:
                out[f"{self.name}_{channel.name}_time"] = found.times[channel.name]
        return out


def _seconds(value: float) -> str:
    """A window's offset in a key: microseconds at most, never an exponent (1.2e+06 would
    name two windows of a long recording alike)."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


@dataclass(frozen=True, slots=True)
class Storage:
    """How the field's columns are chunked and compressed."""

    compression: Codec
    shuffle: bool
    chunk_samples: int  # rows (recordings or windows) per chunk of a fixed column
    chunk_rows: int | None  # values per chunk of a ragged column (None: about 64 KiB)


def _channel_column(
    channel: ChannelSpec, spec: RecordingSpec, storage: Storage, *, stats: bool
) -> tuple[Column, Column | None]:
    """A channel's values column and, if it reads timestamps, its time column."""
    attrs: dict[str, Any] = {"role": "values", "channel": channel.name, "units": channel.units}
    attrs["source_file"] = channel.file
    if channel.rate_hz is not None:
        attrs["rate_hz"] = float(channel.rate_hz)
    axis = -1 if channel.trailing else None
    time_attrs = {
        "role": "time",
        "channel": channel.name,
        "units": "s",
        "relative_to": "start_time",
    }
    count = spec.fixed_length(channel)
    if count is None:
        values, times = _ragged(channel, storage, attrs, time_attrs, stats=stats, axis=axis)
    else:
        fill = spec.fixed.fill if spec.fixed is not None else 0.0
        values, times = _fixed(channel, storage, count, fill, attrs, time_attrs, stats=stats)
    return values, times if channel.reads_times else None


def _ragged(
    channel: ChannelSpec,
    storage: Storage,
    attrs: Mapping[str, Any],
    time_attrs: Mapping[str, Any],
    *,
    stats: bool,
    axis: int | None,
) -> tuple[Column, Column]:
    """A channel's values and timestamps as ragged columns of about 64 KiB a chunk."""
    item = np.dtype(channel.dtype).itemsize * int(np.prod(channel.trailing, dtype=np.int64))
    values = RaggedColumn.of(
        channel.dtype,
        channel.trailing,
        storage.chunk_rows or chunk_rows(channel.rate_hz, item),
        compression=storage.compression,
        shuffle=storage.shuffle,
        attrs=attrs,
        stats="channels" if stats else None,
        channel_axis=axis,
    )
    times = RaggedColumn.of(
        "float64",
        (),
        storage.chunk_rows or chunk_rows(channel.rate_hz, 8),
        compression=storage.compression,
        attrs=time_attrs,
    )
    return values, times


def _fixed(
    channel: ChannelSpec,
    storage: Storage,
    count: int,
    fill: float,
    attrs: Mapping[str, Any],
    time_attrs: Mapping[str, Any],
    *,
    stats: bool,
) -> tuple[Column, Column]:
    """A channel cut to ``count`` samples: fixed (N, count, *trailing) arrays."""
    shape = (count, *channel.trailing)
    rows = storage.chunk_samples
    layout = ChunkLayout(shape, channel.dtype, (rows, *shape), storage.compression, storage.shuffle)
    axis = -1 if channel.trailing else None
    values = ArrayColumn(layout, fill, dict(attrs), "channels" if stats else None, axis)
    time_layout = ChunkLayout((count,), "float64", (rows, count), storage.compression, True)
    return values, ArrayColumn(time_layout, float("nan"), dict(time_attrs))


def chunk_rows(rate_hz: float | None, row_bytes: int) -> int:
    """Value rows per chunk of a ragged channel column (a power of two)."""
    by_time = int(rate_hz * CHUNK_SECONDS) if rate_hz else MIN_CHUNK_ROWS
    rows = max(MIN_CHUNK_ROWS, min(MAX_CHUNK_BYTES // row_bytes, by_time))
    return 1 << max(0, int(rows).bit_length() - 1)


def series_columns(
    name: str, spec: RecordingSpec, storage: Storage, *, stats: bool
) -> tuple[tuple[str, Column], ...]:
    """Every column of the field, by dataset name (the order the file lists them)."""
    out: list[tuple[str, Column]] = []
    for channel in spec.channels:
        values, times = _channel_column(channel, spec, storage, stats=stats)
        out.append((f"{name}_{channel.name}", values))
        if times is not None:
            out.append((f"{name}_{channel.name}_time", times))
    start_attrs = {"role": "start_time", "units": "s (as the time columns)"}
    out.append((f"{name}_start_time", ScalarColumn("float64", attrs=start_attrs)))
    if spec.fixed is not None:
        out += [
            (
                f"{name}_{c.name}_length",
                ScalarColumn("int64", attrs={"role": "length", "channel": c.name}),
            )
            for c in spec.channels
        ]
    if spec.window is not None:
        out.append((f"{name}_recording", TextColumn(attrs={"role": "recording"})))
        offset_attrs = {
            "role": "offset",
            "units": "s",
            "window_s": spec.window.seconds,
            "stride_s": spec.window.stride,
        }
        out.append((f"{name}_offset", ScalarColumn("float64", attrs=offset_attrs)))
    return tuple(out)
