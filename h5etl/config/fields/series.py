"""The config of the ``series`` kind: a recording of sensor channels, each one file.

A recording is a folder (``recording: folder``, the source's entries are folders) or the
files sharing a stem (``recording: stem``: the source lists the first channel's files, the
other channels are the same stem with their own ending). Each channel declares its file, its
rate (or a CSV time column), its dtype, trailing shape and units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, model_validator

from h5etl.config.fields.base import FieldModel, key_problem
from h5etl.config.sections import Compression, Problem, SpecProblems, Strict
from h5etl.inputs.series_fit import samples_in

SeriesDtype = Literal[
    "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"
]
CHANNEL_NAME = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
SUFFIXES = (".npy", ".csv")


class ChannelModel(Strict):
    """One channel of a recording: one ``.npy`` or ``.csv`` file."""

    file: Annotated[str, Field(min_length=1)]
    rate_hz: Annotated[float, Field(gt=0)] | None = None
    time: str | None = None  # a CSV column of timestamps
    time_unit: Literal["s", "ms", "us", "ns"] = "s"
    columns: tuple[str, ...] | None = None  # the CSV's value columns (default: all but time)
    dtype: SeriesDtype = "float32"
    shape: tuple[Annotated[int, Field(gt=0)], ...] = ()  # trailing: [3] for (n, 3)
    units: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> ChannelModel:
        suffix = "." + self.file.rpartition(".")[2].lower()
        if suffix not in SUFFIXES:
            why = (
                " (.parquet is not read: convert it with pyarrow to .npy or .csv)"
                if suffix == ".parquet"
                else ""
            )
            raise key_problem(
                "file", f"a channel file ends in .npy or .csv, got {self.file!r}{why}"
            )
        if ".." in self.file.split("/") or self.file.startswith("/"):
            raise key_problem(
                "file", f"a channel file stays inside its recording, got {self.file!r}"
            )
        csv = suffix == ".csv"
        if not csv and (self.time is not None or self.columns is not None):
            key = "time" if self.time is not None else "columns"
            raise key_problem(key, f"{key} names CSV columns; {self.file} is a .npy file")
        if self.rate_hz is None and self.time is None:
            raise key_problem(
                "rate_hz",
                "a channel needs its rate (rate_hz: 100) or, in a CSV, a time column (time: t)",
            )
        if self.columns is not None and len(self.columns) != math.prod(self.shape):
            raise key_problem(
                "columns",
                f"{len(self.columns)} columns do not make the shape {list(self.shape)} "
                f"({math.prod(self.shape)} values a sample)",
            )
        return self


class FixedSpec(Strict):
    """Crop or pad every recording to ``seconds``: each channel becomes a fixed array."""

    seconds: Annotated[float, Field(gt=0)]
    shorter: Literal["pad", "reject"] = "pad"
    fill: float = 0.0


class WindowSpec(Strict):
    """Cut each recording into windows of ``seconds`` every ``stride`` seconds."""

    seconds: Annotated[float, Field(gt=0)]
    stride: Annotated[float, Field(gt=0)] | None = None  # default: back to back

    @property
    def step(self) -> float:
        return self.stride if self.stride is not None else self.seconds


class SeriesField(FieldModel):
    """A recording of channels, each stored as its own column (ragged, or fixed when cut)."""

    kind: Literal["series"]
    source: str | None = None
    recording: Literal["folder", "stem"] = "folder"
    channels: Annotated[
        dict[Annotated[str, Field(pattern=CHANNEL_NAME)], ChannelModel], Field(min_length=1)
    ]
    tolerance_s: Annotated[float, Field(ge=0)] | None = None  # default: the slowest period
    fixed: FixedSpec | None = None
    window: WindowSpec | None = None
    chunk_rows: Annotated[int, Field(gt=0)] | None = None  # ragged values rows per chunk
    compression: Compression | None = None
    shuffle: bool | None = None
    stats: bool = True

    def source_name(self, field_name: str, sources: Sequence[str]) -> str | None:
        return self.source if self.source is not None else field_name

    @property
    def reads_files(self) -> bool:
        return True

    def dataset_names(self, field_name: str) -> tuple[str, ...]:
        """Every dataset it stores per split (see ``h5etl.kinds.series``), offsets too."""
        ragged = self.fixed is None and self.window is None
        names: list[str] = []
        for name, channel in self.channels.items():
            columns = [f"{field_name}_{name}"]
            if channel.time is not None:
                columns.append(f"{field_name}_{name}_time")
            for column in columns:
                names += [column, f"{column}_offsets"] if ragged else [column]
        names.append(f"{field_name}_start_time")
        if self.fixed is not None:
            names += [f"{field_name}_{name}_length" for name in self.channels]
        if self.window is not None:
            names += [f"{field_name}_recording", f"{field_name}_offset"]
        return tuple(names)

    @property
    def tolerance(self) -> float:
        """The declared tolerance, else one sample of the slowest declared rate (else 0)."""
        if self.tolerance_s is not None:
            return self.tolerance_s
        rates = [c.rate_hz for c in self.channels.values() if c.rate_hz is not None]
        return 1.0 / min(rates) if rates else 0.0

    @model_validator(mode="after")
    def _cuts(self) -> SeriesField:
        if self.fixed is not None and self.window is not None:
            raise key_problem("window", "choose fixed (crop/pad) or window, not both")
        cut: list[tuple[str, float]] = []
        if self.fixed is not None:
            cut.append(("fixed.seconds", self.fixed.seconds))
        if self.window is not None:
            cut += [("window.seconds", self.window.seconds), ("window.stride", self.window.step)]
        problems = [
            problem
            for name, channel in self.channels.items()
            for key, seconds in cut
            if (problem := _whole_samples(name, channel, key, seconds)) is not None
        ]
        if problems:
            raise SpecProblems(problems)
        return self


def _whole_samples(name: str, channel: ChannelModel, key: str, seconds: float) -> Problem | None:
    """A fixed length or a window needs a rate, and a whole number of samples at it."""
    where = (tuple(key.split(".")),)
    if channel.rate_hz is None:
        return Problem(
            where,
            f"channels.{name} has no rate_hz: cutting to a fixed length needs every channel's "
            "rate (a CSV with a time column may declare it too)",
        )
    if (
        samples_in(seconds, channel.rate_hz) is None
        or (samples_in(seconds, channel.rate_hz) or 0) < 1
    ):
        return Problem(
            where,
            f"{seconds:g} s is not a whole number of samples of channels.{name} at "
            f"{channel.rate_hz:g} Hz ({seconds * channel.rate_hz:g})",
        )
    return None
