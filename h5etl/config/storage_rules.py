"""The storage rules of a config: dataset paths of their own, chunks HDF5 can store, tasks
of bounded size. Part of ``h5etl.config.rules`` (``spec_problems`` calls them), over the
same ``SpecView``.
"""

from __future__ import annotations

import math

import numpy as np

from h5etl.config.fields import ArrayField
from h5etl.config.sections import Problem
from h5etl.config.spec_view import SpecView
from h5etl.format import contract as fileformat

__all__ = [
    "MAX_BATCH_SAMPLES",
    "MAX_CHUNK_BYTES",
    "batch_problems",
    "chunk_problems",
    "path_problems",
]

MAX_CHUNK_BYTES = 2**32 - 1  # HDF5 refuses chunks of 4 GiB or more
# A decode task holds a whole chunk of every image field: the lcm of their chunk rows. Fields
# that agree make that one chunk, the user's own choice; fields that disagree may grow it to
# this many samples (32 chunks of the default 32) before memory stops being "a few batches".
MAX_BATCH_SAMPLES = 1024


def path_problems(spec: SpecView) -> list[Problem]:
    """Every dataset of the file, and its /diagnostics entry, must have a path of its own."""
    seen: dict[str, tuple[str, str]] = {}
    nodes: dict[str, str] = {}
    names = [(n, d) for n, f in spec.fields.items() for d in f.dataset_names(n)]
    for split in spec.splits:
        for field_name, name in [
            *names,
            *((n, n) for n in (fileformat.LINEAGE, *fileformat.SAMPLE_KEYS)),
        ]:
            path = _dataset_path(spec, split, field_name, name)
            node = fileformat.diagnostics_node(path)
            label = name if name == field_name else f"{field_name}'s column {name}"
            clash = seen.get(path)
            if clash is not None:
                return [_clash(spec, path, clash, (split, label))]
            if node in nodes and nodes[node] != path:
                return [
                    Problem(
                        (("layout",),),
                        f"datasets {nodes[node]} and {path} would share the /diagnostics "
                        f"entry {node!r} ('/' is written '.'): rename a field or split",
                    )
                ]
            seen[path], nodes[node] = (split, label), path
    return []


def _dataset_path(spec: SpecView, split: str, field_name: str, name: str) -> str:
    """Where a dataset a field lists goes: ``<column>_offsets`` beside a ragged ``<column>``
    the same field lists (``fileformat.offsets_path``), anything else by the template."""
    column = name.removesuffix(fileformat.OFFSETS_SUFFIX)
    field = spec.fields.get(field_name)
    if column != name and field is not None and column in field.dataset_names(field_name):
        return fileformat.offsets_path(fileformat.dataset_path(spec.layout, split, column))
    return fileformat.dataset_path(spec.layout, split, name)


def _clash(spec: SpecView, path: str, first: tuple[str, str], second: tuple[str, str]) -> Problem:
    shown = [f"field {n} of split {s}" for s, n in (first, second)]
    return Problem(
        (("layout",),),
        f"{spec.layout!r} puts {shown[0]} and {shown[1]} both at {path}: rename one",
    )


def chunk_problems(spec: SpecView, field_name: str) -> list[Problem]:
    field = spec.fields[field_name]
    assert isinstance(field, ArrayField)
    assert field.shape is not None
    key = (("fields", field_name, "chunks"),)
    chunks = spec.chunks_of(field_name)
    expected_rank = len(field.shape) + 1
    if len(chunks) != expected_rank:
        return [
            Problem(
                key,
                f"needs {expected_rank} numbers (samples, then one per axis of shape "
                f"{list(field.shape)}), got {list(chunks)}",
            )
        ]
    too_big = [c for c, s in zip(chunks[1:], field.shape, strict=True) if c > s]
    if too_big:
        return [
            Problem(key, f"each axis must fit the shape {list(field.shape)}, got {list(chunks)}")
        ]
    if math.prod(chunks) * np.dtype(field.dtype).itemsize > MAX_CHUNK_BYTES:
        return [Problem(key, f"a chunk must be under 4 GiB, got {list(chunks)}")]
    return []


def batch_problems(spec: SpecView) -> list[Problem]:
    rows = {name: spec.chunks_of(name)[0] for name in spec.image_fields}
    batch = math.lcm(*rows.values())
    if batch <= max([MAX_BATCH_SAMPLES, *rows.values()]):
        return []
    keys = dict.fromkeys(
        ("fields", name, "chunks")
        if spec.array_spec(name).chunks is not None
        else ("storage", "chunk_samples")
        for name in rows
    )
    shown = ", ".join(f"{name} {count}" for name, count in rows.items())
    return [
        Problem(
            tuple(keys),
            f"chunk rows {shown} make decode tasks of {batch} samples (a task holds a whole "
            f"chunk of every array field: their least common multiple); at most "
            f"{MAX_BATCH_SAMPLES} or the largest chunk rows keeps memory bounded: use chunk "
            f"rows that divide one another, e.g. the same for every field",
        )
    ]
