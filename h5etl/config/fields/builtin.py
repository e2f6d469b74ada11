"""The seven built-in kinds' registry entries: each config model, its behaviour and the builder
from the one to the other (parent side; workers receive the built kinds)."""

from __future__ import annotations

import math
from typing import Any

from h5etl.config.fields.arrays import ImageField, MaskField
from h5etl.config.fields.base import TableRef
from h5etl.config.fields.entry import BuildContext, KindEntry
from h5etl.config.fields.series import SeriesField
from h5etl.config.fields.values import LabelField, TextField, ValueField
from h5etl.config.fields.volume import VolumeField
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.format.reader_hints import BUILTIN_HINTS
from h5etl.inputs.channels import ChannelSpec
from h5etl.inputs.recording import RecordingSpec
from h5etl.inputs.series_fit import FixedDuration, Windowing
from h5etl.kinds.image import ImageKind
from h5etl.kinds.label import LabelKind
from h5etl.kinds.mask import MaskKind
from h5etl.kinds.series import SeriesKind, Storage, series_columns
from h5etl.kinds.tabular import TableSource
from h5etl.kinds.text import TextKind
from h5etl.kinds.value import ValueKind
from h5etl.kinds.volume import VolumeKind

__all__ = ["BUILTIN_ENTRIES", "array_layout", "recording_spec"]


def array_layout(field: ImageField | MaskField, context: BuildContext) -> ChunkLayout:
    """How an image or mask field is stored: shape, dtype, chunks and filters."""
    assert field.shape is not None
    chunks = tuple(field.chunks) if field.chunks is not None else None
    return context.layout(
        field.shape,
        field.dtype,
        chunks=chunks,
        compression=field.compression,
        shuffle=field.shuffle,
    )


def _grid(name: str, field: ImageField, context: BuildContext) -> int:
    """How much finer than its partner a paired image field is (1: unpaired): it pads and
    crops on multiples of that, so the pair lines up pixel for pixel."""
    factors = [field.scale.factor] if field.scale else []
    factors.extend(
        other.derive.factor
        for other in context.fields.values()
        if isinstance(other, ImageField)
        and other.derive is not None
        and other.derive.from_field == name
        and other.derive.factor
    )
    return math.lcm(*factors) if factors else 1


def _image(name: str, field: ImageField, context: BuildContext) -> ImageKind:
    assert field.mode is not None
    derive, scale = field.derive, field.scale
    computed = derive is not None and derive.call is not None  # by user code (issue 28)
    if derive is not None and computed:
        derive_sources, derive = derive.sources, None  # its call is attached once resolved
    else:
        derive_sources = ()
    return ImageKind(
        name,
        context.source_index,
        array_layout(field, context),
        field.mode,
        context.pad.fill,
        context.pad.oversize,
        derive_from=derive.sources[0] if derive else None,
        derive_filter=derive.resize if derive else "bicubic",
        derive_factor=derive.factor if derive else None,
        scale_of=scale.of if scale else None,
        scale_factor=scale.factor if scale else 1,
        with_stats=field.stats,
        grid=_grid(name, field, context),
        derive_sources=derive_sources,
    )


def _mask(name: str, field: MaskField, context: BuildContext) -> MaskKind:
    plain = [n for n, f in context.fields.items() if isinstance(f, ImageField) and f.derive is None]
    of = field.of if field.of is not None else (plain[0] if plain else None)
    colors = tuple(field.colors.items()) if field.colors is not None else None
    return MaskKind(
        name,
        context.source_index,
        array_layout(field, context),
        context.pad.mask_fill,
        context.pad.oversize,
        field.values,
        colors,
        of,
        field.stats,
    )


def _table(origin: TableRef) -> TableSource:
    return TableSource(origin.table, origin.key, origin.column)


def _label(name: str, field: LabelField, context: BuildContext) -> LabelKind:
    source = field.source or context.sources[0]  # a table's keys: the first source's paths
    origin = field.from_
    return LabelKind(
        name,
        context.sources.index(source),
        str(context.source_dirs[source]),
        None if isinstance(origin, str) else _table(origin),
        field.classes or (),
        declared=field.classes is not None,
        pattern=context.source_globs[source],
    )


def _text(name: str, field: TextField, context: BuildContext) -> TextKind:
    index = context.source_index
    if index is None:  # a table's keys: its own source's paths, else the first's
        index = context.sources.index(field.source) if field.source is not None else 0
    origin = field.from_
    if isinstance(origin, str):
        return TextKind(name, index)
    if isinstance(origin, TableRef):
        return TextKind(name, index, _table(origin))
    return TextKind(name, index, json_key=origin.key)


def _value(name: str, field: ValueField, context: BuildContext) -> ValueKind:
    index = context.source_index if context.source is not None else 0
    origin = field.from_
    if isinstance(origin, TableRef):
        return ValueKind(name, index, field.dtype, _table(origin), default=field.default)
    return ValueKind(name, index, field.dtype, json_key=origin.key, default=field.default)


def _volume(name: str, field: VolumeField, context: BuildContext) -> VolumeKind:
    images = [n for n, f in context.fields.items() if isinstance(f, VolumeField) and not f.is_label]
    of = (field.of or images[0]) if field.is_label else None
    owner = context.fields[of] if of is not None else field  # a label volume resamples as it
    assert isinstance(owner, VolumeField)
    layout = context.layout(
        field.plane,
        field.stored_dtype,
        chunks=field.chunk_shape(),
        compression=field.compression,
        shuffle=field.shuffle,
    )
    resample = owner.resample
    return VolumeKind(
        name,
        context.source_index,
        layout,
        field.form,
        field.values,
        of,
        resample.spacing if resample is not None else None,
        resample.shape if resample is not None else None,
        field.fill,
        field.stats,
    )


def _channel_spec(name: str, field: SeriesField) -> ChannelSpec:
    model = field.channels[name]
    return ChannelSpec(
        name,
        model.file,
        model.dtype,
        tuple(model.shape),
        model.rate_hz,
        model.time,
        tuple(model.columns or ()),
        model.time_unit,
        model.units,
    )


def recording_spec(field: SeriesField) -> RecordingSpec:
    """What a series field reads of each recording: its channels, their cut and windows."""
    fixed = window = None
    if field.fixed is not None:
        fixed = FixedDuration(field.fixed.seconds, field.fixed.shorter, field.fixed.fill)
    if field.window is not None:
        window = Windowing(field.window.seconds, field.window.step)
    channels = tuple(_channel_spec(name, field) for name in field.channels)
    return RecordingSpec(field.recording, channels, field.tolerance, fixed, window)


def _series(name: str, field: SeriesField, context: BuildContext) -> SeriesKind:
    storage = Storage(
        Codec.of(field.compression or context.storage.compression),
        context.storage.shuffle if field.shuffle is None else field.shuffle,
        context.storage.chunk_samples,
        field.chunk_rows,
    )
    spec = recording_spec(field)
    columns = series_columns(name, spec, storage, stats=field.stats)
    return SeriesKind(name, context.source_index, spec, columns)


BUILTIN_ENTRIES: tuple[KindEntry[Any], ...] = (
    KindEntry("image", ImageField, ImageKind, _image, reader_hints=BUILTIN_HINTS["image"]),
    KindEntry("mask", MaskField, MaskKind, _mask, reader_hints=BUILTIN_HINTS["mask"]),
    KindEntry("label", LabelField, LabelKind, _label, reader_hints=BUILTIN_HINTS["label"]),
    KindEntry("text", TextField, TextKind, _text, reader_hints=BUILTIN_HINTS["text"]),
    KindEntry("value", ValueField, ValueKind, _value, reader_hints=BUILTIN_HINTS["value"]),
    KindEntry(
        "volume",
        VolumeField,
        VolumeKind,
        _volume,
        preview="h5etl.preview.volumes:draw_middle_slice",
        reader_hints=BUILTIN_HINTS["volume"],
    ),
    KindEntry(
        "series",
        SeriesField,
        SeriesKind,
        _series,
        preview="h5etl.preview.series:draw",
        reader_hints=BUILTIN_HINTS["series"],
    ),
)
