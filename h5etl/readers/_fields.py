"""Which datasets a reader reads: the fields of one split, found through the layout record.

A release records its layout (``h5etl.format.contract.read_layout``; older releases have one
inferred), so a field's dataset is ``record.path(split, field)`` whatever the template:
``/train/image`` or ``/x_train``. Resolved once, when a reader is made; no file stays open.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5etl.errors import ReaderError
from h5etl.format import contract as fileformat
from h5etl.format import partfiles
from h5etl.format.contract import FieldRecord, LayoutRecord
from h5etl.format.reader_hints import KerasRole, hints_of
from h5etl.readers._layout import FieldInfo, field_info

INT64 = np.dtype(np.int64)
# What a reader may assume of each kind (class indices read as int64, channels first: the
# axis a channels-last batch moves) is ``h5etl.format.reader_hints``: built-in kinds' from its
# table, a plugin kind's from its layout record.


@dataclass(frozen=True, slots=True)
class Fields:
    """The fields of one split a reader reads, with what the release says about them."""

    layout: LayoutRecord
    paths: dict[str, str]  # field -> dataset path, in the order asked
    info: dict[str, FieldInfo]
    length: int
    classes: dict[str, tuple[str, ...]]  # label field -> class names its values index
    stats: dict[str, dict[str, Any]]  # field -> statistics attributes (empty when none)
    widen: frozenset[str]  # label fields stored narrower than int64: widened when read
    ragged: dict[str, str]  # ragged column -> its offsets' dataset path (values at ``paths``)


def read_record(handle: h5py.File, path: Path | str) -> LayoutRecord:
    """The release's layout record, or a ReaderError naming the file."""
    try:
        return fileformat.read_layout(handle)
    except ValueError as exc:
        raise ReaderError(
            f"cannot read the root attr {fileformat.LAYOUT_ATTR!r}: {exc}", path=path
        ) from exc


def require_parts(handle: h5py.File, path: Path | str, datasets: Iterable[h5py.Dataset]) -> None:
    """A virtual release (``build --vds``) whose part is missing or of another size would
    read that part's rows as zeros, silently: a ReaderError naming the part ``datasets``
    map instead (a ``stat`` per part; ``h5etl check`` looks closer)."""
    try:
        problems = partfiles.part_problems(handle, datasets=datasets)
    except ValueError as exc:
        raise ReaderError(str(exc), path=path) from exc
    if problems:
        more = f" (and {len(problems) - 1} more; h5etl check lists them)" * (len(problems) > 1)
        raise ReaderError(f"{problems[0]}{more}", path=path)


def resolve(
    handle: h5py.File,
    path: Path | str,
    split: str,
    fields: Sequence[str] | None,
) -> Fields:
    """The datasets of ``fields`` (default: every field of the record) in ``split``.

    Raises:
        ReaderError: the record is unreadable, the split or a field is not in it, a dataset
            it lists is missing, or the fields differ in length.
    """
    record = read_record(handle, path)
    if split not in record.splits:
        raise ReaderError(
            f"no split {split!r}; the release has: {', '.join(record.splits)}", path=path
        )
    names = _wanted(record, fields)
    columns = record.storage
    beside = {fileformat.LINEAGE: record.lineage_path(split), **record.sample_paths(split)}
    unknown = [n for n in names if n not in columns and n not in beside]
    if unknown or not names:
        raise ReaderError(
            f"split {split!r} has no field {', '.join(unknown) or '(none asked)'}; "
            f"it has: {', '.join(columns)}",
            path=path,
        )
    paths = {n: beside.get(n) or record.path(split, n) for n in names}
    ragged = {
        n: fileformat.offsets_path(p)
        for n, p in paths.items()
        if n in columns and columns[n].column == "ragged"
    }
    wanted = [*paths.values(), *ragged.values()]
    missing = [p for p in wanted if not isinstance(handle.get(p), h5py.Dataset)]
    if missing:
        raise ReaderError(
            f"{', '.join(missing)}: in the layout record of split {split!r}, missing from "
            "the file; read the other fields with fields=[...]",
            path=path,
        )
    found = {n: handle[p] for n, p in paths.items()}
    require_parts(handle, path, found.values())
    lengths = {n: len(d) for n, d in found.items() if n not in ragged}
    lengths.update((n, len(handle[p]) - 1) for n, p in ragged.items())
    if len(set(lengths.values())) > 1:
        raise ReaderError(f"fields of split {split!r} differ in length: {lengths}", path=path)
    info = {n: field_info(d, n) for n, d in found.items()}
    labels = {n for n in found if n in columns and hints_of(columns[n]).class_indices}
    return Fields(
        layout=record,
        paths=paths,
        info=info,
        length=next(iter(lengths.values())),
        classes={n: fileformat.class_names(columns[n], d) for n, d in found.items() if n in labels},
        stats={n: fileformat.dataset_stats(d) for n, d in found.items()},
        widen=frozenset(n for n in labels if info[n].dtype != INT64),
        ragged=ragged,
    )


def _wanted(record: LayoutRecord, fields: Sequence[str] | None) -> list[str]:
    """The storage columns asked for (default: all); a field without a column of its own
    name (a recording of channels) stands for all its columns."""
    if fields is None:
        return list(record.storage)
    out: list[str] = []
    for name in fields:
        field = record.fields.get(name)
        if field is not None and field.column == "none":
            out.extend(field.columns)
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def keras_fields(fields: Mapping[str, FieldRecord], role: KerasRole) -> list[str]:
    """The fields of Keras ``role`` (input: ``x``, target: ``y``), best first: their kinds'
    ``keras_rank``, then the layout's order."""
    hints = {name: hints_of(record) for name, record in fields.items()}
    found = [name for name, hint in hints.items() if hint.keras == role]
    return sorted(found, key=lambda name: hints[name].keras_rank)


def channel_fields(record: LayoutRecord, names: Sequence[str]) -> frozenset[str]:
    """Which of ``names`` are fixed arrays stored channels first (images, masks: their
    kinds' reader hints)."""
    columns = record.storage
    return frozenset(
        n
        for n in names
        if n in columns
        and hints_of(columns[n]).channels_first
        and columns[n].column == "fixed"
        and len(columns[n].shape) >= 2
    )


def channels_last(batch: dict[str, np.ndarray], names: frozenset[str]) -> dict[str, np.ndarray]:
    """``batch`` with the fields in ``names`` as (N, H, W, C): a transposed view of the
    channels-first rows (no copy; a framework that needs contiguous rows copies once)."""
    for name in names:
        if name in batch:
            batch[name] = np.moveaxis(batch[name], 1, -1)
    return batch


def as_int64(batch: dict[str, np.ndarray], names: frozenset[str]) -> dict[str, np.ndarray]:
    """``batch`` with the label fields in ``names`` as int64."""
    for name in names:
        if name in batch:
            batch[name] = batch[name].astype(INT64)
    return batch
