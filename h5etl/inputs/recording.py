"""A recording: its channel files found, read and checked together, then cut as declared.

Worker side (plain data, no pydantic). A recording is a folder holding one file per channel,
or the files sharing a stem (the source lists the first channel's files; ``r7_accel.npy``
with channel files ``_accel.npy`` and ``_volts.csv`` gives ``r7_volts.csv``). Reading checks
every channel (finite values, timestamps, trailing shape) and the channels against each other
(durations within the tolerance); a fixed duration crops or pads each channel, a window reads
only its own stretch of a ``.npy`` channel.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import channels as series
from h5etl.inputs import opening as inputs
from h5etl.inputs.channels import Channel, ChannelSpec
from h5etl.inputs.series_fit import FixedDuration, Windowing, fit_fixed, samples_in, too_short


@dataclass(frozen=True, slots=True)
class RecordingSpec:
    """How a series field finds, checks and cuts its recordings."""

    layout: str  # folder | stem
    channels: tuple[ChannelSpec, ...]
    tolerance_s: float
    fixed: FixedDuration | None = None
    window: Windowing | None = None

    @property
    def rates(self) -> dict[str, float]:
        return {c.name: c.rate_hz for c in self.channels if c.rate_hz is not None}

    def fixed_length(self, channel: ChannelSpec) -> int | None:
        """Samples per stored row of a channel cut to a fixed size (None: ragged)."""
        seconds = self.fixed.seconds if self.fixed else self.window.seconds if self.window else None
        if seconds is None:
            return None
        assert channel.rate_hz is not None  # the config checked it
        count = samples_in(seconds, channel.rate_hz)
        assert count is not None
        return count


@dataclass(slots=True)
class Recording:
    """A recording as it is stored: per channel its values (and timestamps relative to the
    start), the start time, and per channel how many samples are real (before padding)."""

    values: dict[str, np.ndarray]
    times: dict[str, np.ndarray]
    start_s: float
    lengths: dict[str, int]
    files: dict[str, str] = field(default_factory=dict)


def channel_paths(path: str, spec: RecordingSpec) -> dict[str, str]:
    """Each channel's file in the recording at ``path`` (a folder, or the first channel's file)."""
    if spec.layout == "folder":
        return {c.name: os.path.join(path, c.file) for c in spec.channels}
    anchor = spec.channels[0].file
    if not path.endswith(anchor) or len(path) == len(anchor):
        raise RejectError(
            "missing_channel",
            f"the name does not end in {anchor!r}, the first channel's file ending, so its "
            "recording's stem is unknown (the source's glob must list the first channel's files)",
            path=path,
        )
    stem = path[: -len(anchor)]
    return {c.name: stem + c.file for c in spec.channels}


def recording_name(relpath: str, spec: RecordingSpec) -> str:
    """The recording's name: its folder, or its stem (the first channel's ending removed)."""
    if spec.layout == "stem" and relpath.endswith(spec.channels[0].file):
        return relpath[: -len(spec.channels[0].file)] or relpath
    return relpath


def _read(path: str, channel: ChannelSpec) -> bytes:
    try:
        return inputs.read_file(path)
    except RejectError as exc:
        if exc.reason in {"unreadable", "dangling_symlink"} and not os.path.lexists(path):
            raise RejectError(
                "missing_channel",
                f"channel {channel.name} is missing: no {os.path.basename(path)} in its recording",
                path=path,
            ) from exc
        raise


def read_channel(path: str, channel: ChannelSpec, data: bytes | None = None) -> Channel:
    """One channel's values and timestamps, checked; ``data``: its bytes, if read already."""
    data = _read(path, channel) if data is None else data
    if channel.is_csv:
        values, times = series.read_csv(data, path, channel)
    else:
        values, times = series.read_npy(data, path, channel), None
    if len(values) == 0:
        raise RejectError("empty_channel", f"channel {channel.name} holds no samples", path=path)
    return Channel(channel, values, times, path)


def read_recording(path: str, spec: RecordingSpec) -> tuple[Recording, dict[str, bytes]]:
    """The whole recording at ``path``, checked and cut to the fixed duration if declared;
    and each channel file's bytes (for lineage)."""
    paths = channel_paths(path, spec)
    contents = {c.name: _read(paths[c.name], c) for c in spec.channels}
    channels = [read_channel(paths[c.name], c, contents[c.name]) for c in spec.channels]
    series.check_durations(channels, spec.tolerance_s)
    start = _start_of(channels)
    recording = Recording({}, {}, start, {}, paths)
    for channel in channels:
        name = channel.spec.name
        values, times = channel.values, channel.times
        count = spec.fixed_length(channel.spec)
        if spec.fixed is not None and count is not None:
            values, real = fit_fixed(values, count, spec.fixed, name=name, path=channel.path)
            if times is not None:
                nan = FixedDuration(spec.fixed.seconds, spec.fixed.shorter, math.nan)
                times, _ = fit_fixed(times, count, nan, name=name, path=channel.path)
            recording.lengths[name] = real
        else:
            recording.lengths[name] = len(values)
        recording.values[name] = values
        if times is not None:
            recording.times[name] = times - start
    return recording, contents


def _start_of(channels: Sequence[Channel]) -> float:
    """The recording's start: its earliest timestamp; NaN when no channel has timestamps."""
    firsts = [float(c.times[0]) for c in channels if c.times is not None and len(c.times)]
    return min(firsts) if firsts else math.nan


# -- windows ----------------------------------------------------------------------------------


def probe_lengths(path: str, spec: RecordingSpec) -> dict[str, int]:
    """Each channel's sample count, read cheaply at plan time (a ``.npy`` header; a CSV's
    lines are counted, not parsed), checked: files present, trailing shapes, durations."""
    lengths: dict[str, int] = {}
    durations: list[tuple[str, float, str]] = []
    for channel, file in zip(spec.channels, channel_paths(path, spec).values(), strict=True):
        if not os.path.lexists(file):
            raise RejectError(
                "missing_channel",
                f"channel {channel.name} is missing: no {os.path.basename(file)} in its recording",
                path=file,
            )
        if channel.is_csv:
            with inputs.opened(file) as handle:
                lines = handle.read().splitlines()
            lengths[channel.name] = sum(1 for line in lines[1:] if line.strip())
        else:
            shape = series.probe_npy(file)
            series.check_trailing(shape, channel, file)
            lengths[channel.name] = shape[0]
        assert channel.rate_hz is not None  # windows need every rate (the config checked)
        durations.append((file, lengths[channel.name] / channel.rate_hz, channel.name))
    spread = max(d for _, d, _ in durations) - min(d for _, d, _ in durations)
    if spread > spec.tolerance_s:
        listed = ", ".join(f"{name} {d:g} s" for _, d, name in durations)
        raise RejectError(
            "duration_mismatch",
            f"channel durations differ by {spread:g} s, more than the tolerance "
            f"{spec.tolerance_s:g} s: {listed}",
            path=min(durations, key=lambda item: item[1])[0],
        )
    return lengths


def window_count(path: str, spec: RecordingSpec, lengths: Mapping[str, int]) -> int:
    """How many windows the recording at ``path`` holds; none is a ``too_short`` reject."""
    assert spec.window is not None
    count = spec.window.count(lengths, spec.rates)
    if count == 0:
        raise RejectError("too_short", too_short(lengths, spec.rates, spec.window), path=path)
    return count


def read_window(path: str, spec: RecordingSpec, index: int) -> tuple[Recording, dict[str, bytes]]:
    """Window ``index`` of the recording at ``path``: each channel's stretch, checked (a
    ``.npy`` channel reads only its stretch; a CSV is parsed whole and checked whole)."""
    assert spec.window is not None
    paths = channel_paths(path, spec)
    read: dict[str, bytes] = {}
    channels: dict[str, Channel] = {}
    for channel in spec.channels:
        assert channel.rate_hz is not None
        span = spec.window.span(index, channel.rate_hz)
        if channel.is_csv:
            read[channel.name] = _read(paths[channel.name], channel)
            whole = read_channel(paths[channel.name], channel, read[channel.name])
            times = None if whole.times is None else whole.times[span]
            channels[channel.name] = Channel(channel, whole.values[span], times, whole.path)
        else:
            values, read[channel.name] = _npy_rows(paths[channel.name], channel, span)
            channels[channel.name] = Channel(channel, values, None, paths[channel.name])
    start = _start_of(list(channels.values()))
    recording = Recording({}, {}, start, {}, paths)
    for name, cut in channels.items():
        recording.values[name] = cut.values
        recording.lengths[name] = len(cut.values)
        if cut.times is not None:
            recording.times[name] = cut.times - start
    return recording, read


def _npy_rows(path: str, channel: ChannelSpec, span: slice) -> tuple[np.ndarray, bytes]:
    """Rows ``span`` of a ``.npy`` channel, reading only them (and the header); checked."""
    with inputs.opened(path) as handle:
        head = handle.read(series.NPY_HEADER_BYTES)
        shape, dtype, offset = series.npy_header(head, path)
        series.check_trailing(shape, channel, path)
        row = math.prod(shape[1:]) * dtype.itemsize
        handle.seek(offset + span.start * row)
        data = handle.read((span.stop - span.start) * row)
    if len(data) < (span.stop - span.start) * row or span.stop > shape[0]:
        raise RejectError(
            "unreadable",
            f"truncated .npy: rows {span.start}..{span.stop} are not all there",
            path=path,
        )
    values = np.frombuffer(data, dtype=dtype).reshape(span.stop - span.start, *shape[1:])
    return series.converted(values, channel, path, first=span.start), head[:offset] + data
