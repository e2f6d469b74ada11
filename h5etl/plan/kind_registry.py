"""The one place that knows every kind: config model -> behaviour, for a whole spec.

Parent side only (it reads the pydantic config); workers receive the built kinds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from h5etl.config.fields import (
    ImageField,
    LabelField,
    MaskField,
    SeriesField,
    TextField,
    ValueField,
    VolumeField,
)
from h5etl.config.spec import Spec
from h5etl.errors import ConfigError
from h5etl.format.codec import ChunkLayout, Codec
from h5etl.format.contract import FieldRecord
from h5etl.inputs import extras
from h5etl.kinds import image, label, mask, series, text, value, volume
from h5etl.kinds.base import Kind

Builder = Callable[[Spec, str], Kind]

# kind -> "module:function" that draws one stored sample as a preview tile (a volume's middle
# slice, a series' channels; see h5etl.preview.drawn), imported only when a preview draws it.
# Image and mask fields need none: the preview draws them itself.
PREVIEW_DRAWERS: dict[str, str] = {
    "volume": "h5etl.preview.volumes:draw_middle_slice",
    "series": "h5etl.preview.series:draw",
}


def layout_of(spec: Spec, name: str) -> ChunkLayout:
    """How an array field is stored: shape, dtype, chunks and filters."""
    field = spec.fields[name]
    assert isinstance(field, ImageField | MaskField)
    assert field.shape is not None
    return ChunkLayout(
        field.shape,
        field.dtype,
        spec.chunks_of(name),
        spec.compression_of(name),
        spec.shuffle_of(name),
    )


def _index(spec: Spec, source: str | None) -> int | None:
    return list(spec.sources).index(source) if source is not None else None


def _lookup_index(spec: Spec, source: str | None) -> int:
    """The source whose relative paths key a table (its own ``source``, else the first)."""
    return list(spec.sources).index(source) if source is not None else 0


def _grid(spec: Spec, name: str) -> int:
    """How much finer than its partner a paired image field is (1: unpaired): it pads and
    crops on multiples of that, so the pair lines up pixel for pixel."""
    field = spec.fields[name]
    factors = [field.scale.factor] if isinstance(field, ImageField) and field.scale else []
    factors.extend(
        other.derive.factor
        for other in spec.fields.values()
        if isinstance(other, ImageField)
        and other.derive is not None
        and other.derive.from_field == name
        and other.derive.factor
    )
    return math.lcm(*factors) if factors else 1


def _image(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, ImageField)
    return image.from_config(
        name,
        field,
        layout=layout_of(spec, name),
        source_index=_index(spec, spec.source_of(name)),
        fill=spec.pad.fill,
        oversize=spec.pad.oversize,
        grid=_grid(spec, name),
    )


def _mask(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, MaskField)
    plain = [n for n, f in spec.fields.items() if isinstance(f, ImageField) and f.derive is None]
    return mask.from_config(
        name,
        field,
        layout=layout_of(spec, name),
        source_index=_index(spec, spec.source_of(name)),
        fill=spec.pad.mask_fill,
        oversize=spec.pad.oversize,
        of=field.of if field.of is not None else (plain[0] if plain else None),
    )


def _label(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, LabelField)
    source = field.source or next(iter(spec.sources))
    return label.from_config(
        name,
        field,
        source_index=_lookup_index(spec, source),
        source_root=str(spec.sources[source].dir),
        pattern=spec.sources[source].glob,
    )


def _text(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, TextField)
    source = spec.source_of(name)
    index = _index(spec, source) if source is not None else _lookup_index(spec, field.source)
    return text.from_config(name, field, source_index=index)


def _value(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, ValueField)
    source = spec.source_of(name)
    index = _index(spec, source) if source is not None else 0
    return value.from_config(name, field, source_index=index)


def _volume(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, VolumeField)
    images = [n for n, f in spec.fields.items() if isinstance(f, VolumeField) and not f.is_label]
    of = (field.of or images[0]) if field.is_label else None
    owner = spec.fields[of] if of is not None else field  # a label volume resamples as it
    assert isinstance(owner, VolumeField)
    layout = ChunkLayout(
        field.plane,
        field.stored_dtype,
        field.chunk_shape(),
        field.compression or spec.storage.compression,
        spec.storage.shuffle if field.shuffle is None else field.shuffle,
    )
    return volume.from_config(
        name,
        field,
        layout=layout,
        source_index=_index(spec, spec.source_of(name)),
        of=of,
        resample=owner.resample,
    )


def _series(spec: Spec, name: str) -> Kind:
    field = spec.fields[name]
    assert isinstance(field, SeriesField)
    storage = series.Storage(
        Codec.of(field.compression or spec.storage.compression),
        spec.storage.shuffle if field.shuffle is None else field.shuffle,
        spec.storage.chunk_samples,
        field.chunk_rows,
    )
    return series.from_config(
        name, field, source_index=_index(spec, spec.source_of(name)), storage=storage
    )


BUILDERS: dict[type[Any], Builder] = {
    ImageField: _image,
    MaskField: _mask,
    LabelField: _label,
    TextField: _text,
    ValueField: _value,
    VolumeField: _volume,
    SeriesField: _series,
}


def kinds_of(spec: Spec) -> tuple[Kind, ...]:
    """Every field's behaviour, in config order."""
    return tuple(BUILDERS[type(field)](spec, name) for name, field in spec.fields.items())


def worker_modules(spec: Spec) -> tuple[str, ...]:
    """What a worker imports to decode ``spec``'s fields, each module once."""
    return tuple(dict.fromkeys(m for kind in kinds_of(spec) for m in kind.worker_modules))


def check_installed(spec: Spec) -> None:
    """Every optional library ``spec``'s fields are read with is installed (``h5etl
    validate``, every build and dry run, ``demo``): found before any work, not as a reject
    per sample.

    Raises:
        ConfigError: one line naming the fields, the libraries and the extra to install.
    """
    missing: dict[str, list[str]] = {}  # module -> the fields that need it
    for kind in kinds_of(spec):
        for module in kind.optional_modules:
            if not extras.installed(module):
                missing.setdefault(module, []).append(kind.name)
    if not missing:
        return
    fields = dict.fromkeys(name for names in missing.values() for name in names)
    kinds = dict.fromkeys(spec.kind_of(name) for name in fields)
    raise ConfigError(
        f"fields {', '.join(fields)} ({', '.join(kinds)}) are read with "
        f"{' and '.join(missing)}, not installed here: {extras.install_hint(missing)}",
        path=spec.config_file,
    )


def decode_order(kinds: Sequence[Kind]) -> tuple[int, ...]:
    """Positions of ``kinds`` in an order where each comes after the fields it depends on."""
    by_name = {kind.name: i for i, kind in enumerate(kinds)}
    order: list[int] = []
    placed: set[int] = set()

    def visit(i: int) -> None:
        if i in placed:
            return
        placed.add(i)
        for dependency in kinds[i].depends_on:
            visit(by_name[dependency])
        order.append(i)

    for i in range(len(kinds)):
        visit(i)
    return tuple(order)


def layout_records(kinds: Sequence[Kind]) -> dict[str, FieldRecord]:
    return {kind.name: kind.record() for kind in kinds}
