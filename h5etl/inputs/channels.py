"""Sensor channels: reading one channel file (``.npy``, ``.csv``) and the rejects of a recording.

A channel is one file of a recording: its samples along the first axis, a declared trailing
shape (``(3,)`` for a 3-axis accelerometer) and dtype, and either a declared rate or a time
column. Everything here is plain numpy on plain data (worker side); every reject names the
file and the position (sample index, CSV line, timestamp) of the first offence.
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
_LOADTXT_ROW = re.compile(r"at row (\d+), column (\d+)")
_LOADTXT_SHORT = re.compile(r"at row (\d+) with (\d+) columns")
NPY_HEADER_BYTES = 4096  # enough for any header np.save writes for a plain array


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """What a recording's channel is declared to be (plain data: workers receive it)."""

    name: str
    file: str  # in the recording folder, or appended to the recording's stem
    dtype: str
    trailing: tuple[int, ...]
    rate_hz: float | None
    time_column: str | None = None  # CSV: timestamps, in ``time_unit``
    columns: tuple[str, ...] = ()  # CSV: the value columns; () = every column but the time
    time_unit: str = "s"
    units: str = ""

    @property
    def is_csv(self) -> bool:
        return self.file.lower().endswith(".csv")

    @property
    def reads_times(self) -> bool:
        return self.time_column is not None


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel as read: values (n, *trailing) in the declared dtype, timestamps (n,) in
    seconds as the file wrote them (None: the channel has a rate), and the file."""

    spec: ChannelSpec
    values: np.ndarray
    times: np.ndarray | None
    path: str

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def duration_s(self) -> float:
        """How long it lasts: n / rate, or last - first timestamp plus one sample period (the
        declared rate's, else the median step)."""
        n = len(self)
        if self.times is None:
            assert self.spec.rate_hz is not None
            return n / self.spec.rate_hz
        if n == 0:
            return 0.0
        span = float(self.times[-1] - self.times[0])
        if self.spec.rate_hz is not None:
            return span + 1.0 / self.spec.rate_hz
        return span + (float(np.median(np.diff(self.times))) if n > 1 else 0.0)


def _shape_text(trailing: Sequence[int]) -> str:
    return "(" + ", ".join(["n", *map(str, trailing)]) + ")"


# -- .npy -------------------------------------------------------------------------------------

# numpy reads a .npy header with ast.literal_eval, and CPython 3.11 may raise SystemError ("AST
# constructor recursion depth mismatch", cpython#106905) when two threads parse at once: the
# plan probes headers in threads, and a small increment decodes in threads (a series build
# failed so). Every .npy header is parsed under this lock.
NPY_HEADER_LOCK = threading.Lock()


def npy_header(data: bytes, path: str) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, offset of the first value) from the start of a ``.npy`` file."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        with NPY_HEADER_LOCK:
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except (ValueError, OSError, SyntaxError) as exc:
        raise RejectError("unreadable", f"not a .npy file: {exc}", path=path) from exc
    if dtype.hasobject or dtype.fields is not None:
        raise RejectError(
            "unreadable",
            f"a .npy of {dtype} holds no plain numbers; save a numeric array",
            path=path,
        )
    if fortran and len(shape) > 1:
        raise RejectError(
            "unreadable",
            "a Fortran-ordered .npy; save it with np.save(np.ascontiguousarray(a))",
            path=path,
        )
    return tuple(shape), dtype, stream.tell()


def probe_npy(path: str) -> tuple[int, ...]:
    """A ``.npy`` file's shape from its header alone (plan time: cheap, no values read)."""
    with inputs.opened(path) as handle:
        head = handle.read(NPY_HEADER_BYTES)
    return npy_header(head, path)[0]


def read_npy(data: bytes, path: str, spec: ChannelSpec) -> np.ndarray:
    """The channel's values from a ``.npy`` file's bytes, checked and in the declared dtype."""
    shape, dtype, offset = npy_header(data, path)
    check_trailing(shape, spec, path)
    count = math.prod(shape)
    if len(data) - offset < count * dtype.itemsize:
        raise RejectError(
            "unreadable",
            f"truncated .npy: {len(data) - offset} bytes of values, "
            f"expected {count * dtype.itemsize}",
            path=path,
        )
    values = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
    return converted(values, spec, path)


def check_trailing(shape: Sequence[int], spec: ChannelSpec, path: str) -> None:
    """Reject a channel whose shape is not (n, *declared trailing shape)."""
    if len(shape) != 1 + len(spec.trailing) or tuple(shape[1:]) != spec.trailing:
        raise RejectError(
            "trailing_shape",
            f"channel {spec.name} has shape {tuple(shape)}, expected {_shape_text(spec.trailing)} "
            f"(its declared shape {list(spec.trailing)})",
            path=path,
        )


# -- .csv -------------------------------------------------------------------------------------


def _delimiter(header: str) -> str:
    for candidate in (",", ";", "\t"):
        if candidate in header:
            return candidate
    return ","


def csv_columns(header: str, spec: ChannelSpec, path: str) -> tuple[list[int], int | None]:
    """The positions of the value columns and of the time column in a CSV header."""
    names = [name.strip().strip('"') for name in header.split(_delimiter(header))]
    position = {name: i for i, name in enumerate(names)}
    wanted = [*spec.columns, *([spec.time_column] if spec.time_column else [])]
    missing = [name for name in wanted if name not in position]
    if missing:
        raise RejectError(
            "missing_column",
            f"channel {spec.name}: no column {', '.join(map(repr, missing))} in the header "
            f"(it has {', '.join(names)})",
            path=path,
        )
    time = position[spec.time_column] if spec.time_column else None
    if spec.columns:
        return [position[name] for name in spec.columns], time
    return [i for i in range(len(names)) if i != time], time


def _csv_problem(exc: ValueError, path: str) -> RejectError:
    text = str(exc)
    if (found := _LOADTXT_ROW.search(text)) is not None:
        line = int(found.group(1)) + 2  # loadtxt counts data rows from 0; line 1 is the header
        bad = text.split(" at row")[0].replace("could not convert string", "cannot read")
        return RejectError("bad_value", f"line {line}, column {found.group(2)}: {bad}", path=path)
    if (found := _LOADTXT_SHORT.search(text)) is not None:
        line = int(found.group(1)) + 1  # these messages count rows from 1
        return RejectError(
            "bad_value",
            f"line {line} has {found.group(2)} columns, fewer than the header",
            path=path,
        )
    return RejectError("bad_value", f"cannot read the CSV: {text}", path=path)


def read_csv(data: bytes, path: str, spec: ChannelSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """The channel's values (and timestamps in seconds) from a CSV file with a header line."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RejectError("unreadable", f"not UTF-8 text: {exc}", path=path) from exc
    header, _, body = text.partition("\n")
    value_columns, time_column = csv_columns(header.rstrip("\r"), spec, path)
    used = [*value_columns, *([time_column] if time_column is not None else [])]
    try:
        table = np.loadtxt(
            io.StringIO(body), delimiter=_delimiter(header), usecols=used, ndmin=2, dtype=np.float64
        )
    except ValueError as exc:
        raise _csv_problem(exc, path) from exc
    table = table.reshape(-1, len(used))
    values = table[:, : len(value_columns)]
    if values.shape[1] != math.prod(spec.trailing):
        raise RejectError(
            "trailing_shape",
            f"channel {spec.name} has {values.shape[1]} value columns, its declared shape "
            f"{list(spec.trailing)} needs {math.prod(spec.trailing)}",
            path=path,
        )
    values = values.reshape(len(values), *spec.trailing)
    times = None
    if time_column is not None:
        times = table[:, -1] * TIME_UNITS[spec.time_unit]
        check_finite(times, spec, path, what="timestamp", csv=True)
        check_times(times, path)
    return converted(values, spec, path, csv=True), times


# -- checks -----------------------------------------------------------------------------------


def position_text(index: int, spec: ChannelSpec, *, csv: bool, first: int = 0) -> str:
    """Where sample ``index`` is, in the words of its file (CSV line or sample and time);
    ``first``: the file's sample the values start at (a window of it)."""
    index += first
    if csv:
        return f"line {index + 2}"
    if spec.rate_hz is not None:
        return f"sample {index} ({index / spec.rate_hz:g} s)"
    return f"sample {index}"


def check_finite(
    values: np.ndarray,
    spec: ChannelSpec,
    path: str,
    *,
    what: str = "value",
    csv: bool = False,
    first: int = 0,
) -> None:
    """Reject NaN and infinities, naming the first one's position and how many there are."""
    if values.dtype.kind != "f":
        return
    finite = np.isfinite(values)
    if finite.all():
        return
    bad = np.argwhere(~finite)
    value = values[tuple(bad[0])]
    axis = f", component {tuple(int(i) for i in bad[0][1:])}" if len(bad[0]) > 1 else ""
    where = position_text(int(bad[0][0]), spec, csv=csv, first=first)
    raise RejectError(
        "non_finite",
        f"channel {spec.name}: {what} {value} at {where}{axis} ({len(bad)} non-finite in all)",
        path=path,
    )


def check_times(times: np.ndarray, path: str) -> None:
    """Reject timestamps that repeat or go back, naming the first offending CSV line."""
    if len(times) < 2:
        return
    steps = np.diff(times)
    bad = np.flatnonzero(steps <= 0)
    if not len(bad):
        return
    i = int(bad[0])
    line, earlier = i + 3, i + 2
    if steps[i] == 0:
        raise RejectError(
            "duplicate_timestamp",
            f"timestamp {times[i]:g} s on line {line} repeats line {earlier}",
            path=path,
        )
    raise RejectError(
        "non_monotonic_timestamps",
        f"timestamp {times[i + 1]:g} s on line {line} comes before {times[i]:g} s on line "
        f"{earlier}; timestamps must increase",
        path=path,
    )


def converted(
    values: np.ndarray, spec: ChannelSpec, path: str, *, csv: bool = False, first: int = 0
) -> np.ndarray:
    """``values`` in the channel's dtype, checked finite; a change of value is a reject."""
    check_finite(values, spec, path, csv=csv, first=first)
    target = np.dtype(spec.dtype)
    if values.dtype == target:
        return values
    if target.kind == "f":
        out = values.astype(target)
        if not np.isfinite(out).all():
            index = int(np.argwhere(~np.isfinite(out))[0][0])
            where = position_text(index, spec, csv=csv, first=first)
            raise RejectError(
                "lossy_conversion",
                f"channel {spec.name}: a value at {where} is "
                f"beyond {spec.dtype}; declare dtype: float64",
                path=path,
            )
        return out
    return _as_integers(values, target, spec, path, csv=csv, first=first)


def _as_integers(
    values: np.ndarray,
    target: np.dtype[Any],
    spec: ChannelSpec,
    path: str,
    *,
    csv: bool,
    first: int,
) -> np.ndarray:
    info = np.iinfo(target)
    flat = values.reshape(len(values), -1) if len(values) else values.reshape(0, 1)
    outside = (flat < info.min) | (flat > info.max)
    if values.dtype.kind == "f":
        outside |= flat != np.round(flat)
    rows = np.flatnonzero(outside.any(axis=1))
    if len(rows):
        row = int(rows[0])
        bad = flat[row][outside[row]][0]
        where = position_text(row, spec, csv=csv, first=first)
        raise RejectError(
            "lossy_conversion",
            f"channel {spec.name}: {bad} at {where} is not an "
            f"integer in {info.min}..{info.max}, so {spec.dtype} cannot hold it",
            path=path,
        )
    return values.astype(target)


def check_durations(channels: Sequence[Channel], tolerance_s: float) -> None:
    """Reject a recording whose channels' durations differ by more than ``tolerance_s``."""
    if len(channels) < 2:
        return
    durations = [channel.duration_s for channel in channels]
    spread = max(durations) - min(durations)
    if spread <= tolerance_s:
        return
    longest = channels[durations.index(max(durations))]
    shortest = channels[durations.index(min(durations))]
    listed = ", ".join(
        f"{c.spec.name} {d:g} s ({len(c)} samples)"
        for c, d in zip(channels, durations, strict=True)
    )
    raise RejectError(
        "duration_mismatch",
        f"channel durations differ by {spread:g} s, more than the tolerance {tolerance_s:g} s: "
        f"{listed} (shortest {shortest.path}, longest {longest.path})",
        path=shortest.path,
    )
