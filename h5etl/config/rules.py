"""The cross-field rules of a config: fields against sources, chunks against shapes.

``spec_problems(spec)`` returns every ``Problem`` a ``Spec`` breaks, each naming its own keys;
``Spec``'s model validator raises them as one ``SpecProblems``. Plain functions over the
spec's fields and derived views: no YAML, no pydantic errors, no import of ``h5etl.config.spec``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from h5etl.config.fields import (
    ArrayField,
    FieldSpec,
    ImageField,
    LabelField,
    MaskField,
    SeriesField,
)
from h5etl.config.fields.volume import volume_problems
from h5etl.config.sections import Problem
from h5etl.config.spec_view import SpecView
from h5etl.config.storage_rules import batch_problems, chunk_problems, path_problems
from h5etl.format import contract as fileformat

__all__ = [
    "NAME_PATTERN",
    "RESERVED_NAMES",
    "check_name",
    "name_problem",
    "source_for",
    "spec_problems",
    "unknown_source",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
RESERVED_NAMES = frozenset({fileformat.LINEAGE, *fileformat.SAMPLE_KEYS, fileformat.DIAGNOSTICS})


def source_for(
    field_name: str, *, source: str | None, reads_own_name: bool, sources: Sequence[str]
) -> str:
    """The source a field reads: ``source``, else (an image or mask) the same-named source,
    else the first source."""
    if source is not None:
        return source
    if field_name in sources or reads_own_name or not sources:
        return field_name
    return sources[0]


def unknown_source(source: str, sources: Iterable[str], *, implicit: bool) -> str:
    """The message for a field reading a source that does not exist, with a likely fix."""
    known = sorted(sources)
    text = f"no source named {source!r}"
    if implicit:
        text += " (an image or mask field reads the source of its own name unless it sets source)"
    text += f"; sources: {', '.join(known)}"
    close = difflib.get_close_matches(source, known, n=1)
    return f"{text}; did you mean {close[0]!r}?" if close else f"{text}; set source: to one of them"


def name_problem(name: str, what: str) -> str | None:
    if not re.match(NAME_PATTERN, name) or name in RESERVED_NAMES:
        return (
            f"{what} name {name!r} must match {NAME_PATTERN} and not be one of "
            f"{sorted(RESERVED_NAMES)}"
        )
    return None


def check_name(name: str, what: str) -> None:
    problem = name_problem(name, what)
    if problem is not None:
        raise ValueError(problem)


def spec_problems(spec: SpecView) -> list[Problem]:
    """Every cross-field rule ``spec`` breaks, each with the keys to blame; empty if none.

    Chunk rows are weighed against one another only when every array field's chunks are sound.
    """
    problems: list[Problem] = []
    unsound_chunks: list[Problem] = []  # of every array field
    for field_name, field in spec.fields.items():
        key = ("fields", field_name)
        bad_name = name_problem(field_name, "field")
        if bad_name is not None:
            problems.append(Problem((key,), bad_name))
            continue
        problems.extend(_source_problems(spec, field_name, field))
        problems.extend(_reference_problems(spec, field_name, field))
        problems.extend(field.problems(field_name, spec.pad))
        if isinstance(field, ArrayField):
            found = chunk_problems(spec, field_name)
            unsound_chunks.extend(found)
            problems.extend(found)
    if not unsound_chunks and spec.image_fields:  # chunk rows are known and sound
        problems.extend(batch_problems(spec))
    if not any(spec.reads_content(name) for name in spec.fields):
        problems.append(
            Problem(
                (("fields",),),
                "at least one field that reads its files (image, mask, volume, series) is needed",
            )
        )
    problems.extend(_stratify_problems(spec))
    problems.extend(_group_by_problems(spec))
    problems.extend(_pair_problems(spec))
    problems.extend(_mask_shape_problems(spec))
    problems.extend(path_problems(spec))
    problems.extend(_remote_problems(spec))
    problems.extend(volume_problems(spec.fields, spec.sources, spec.source_of))
    problems.extend(_window_problems(spec))
    used = {spec.source_of(name) for name in spec.fields if spec.reads_content(name)}
    problems.extend(
        Problem((("sources", name),), _unused_source(spec, name))
        for name in spec.sources
        if name not in used
    )
    return problems


def _unused_source(spec: SpecView, name: str) -> str:
    field = spec.fields.get(name)
    if isinstance(field, ImageField) and field.derive is not None:
        return (
            f"no field reads this source's files: fields.{name} is derived from "
            f"{field.derive.from_field} and reads no files; remove sources.{name} or the derive"
        )
    return (
        f"no field reads this source's files; add fields.{name}, read it as a sidecar "
        f"(from: {{json: {name}, key: ...}}), or remove it"
    )


def _pair_problems(spec: SpecView) -> list[Problem]:
    """A scaled or derived pair is stored aligned only when the shapes are exactly the factor
    apart and a too large input is cropped (on the pair's grid) or rejected, not resized."""
    problems = []
    for name, field in spec.fields.items():
        if not isinstance(field, ImageField) or field.shape is None:
            continue
        pairs: list[tuple[str, str, int, bool]] = []  # (key, partner, factor, this is high)
        if field.scale is not None:
            pairs.append(("scale.of", field.scale.of, field.scale.factor, True))
        if field.derive is not None and field.derive.factor is not None:
            pairs.append(("derive.from", field.derive.sources[0], field.derive.factor, False))
        for where, other, factor, high in pairs:
            partner = spec.fields.get(other)
            if not isinstance(partner, ImageField) or partner.shape is None:
                continue  # _reference_problems says so
            low_shape, high_shape = (
                (partner.shape, field.shape) if high else (field.shape, partner.shape)
            )
            if tuple(high_shape[1:]) != tuple(factor * n for n in low_shape[1:]):
                wanted = (
                    [factor * n for n in low_shape[1:]]
                    if high
                    else [n // factor for n in high_shape[1:]]
                )
                relation = f"{factor} x" if high else f"1/{factor} of"
                problems.append(
                    Problem(
                        (("fields", name, "shape"),),
                        f"must be {relation} {other}'s on each axis ({wanted}, by "
                        f"fields.{name}.{where}) for the pair to line up, got {list(field.shape)}",
                    )
                )
            if spec.pad.oversize == "resize":
                problems.append(
                    Problem(
                        (("pad", "oversize"),),
                        f"resize fits the two fields of fields.{name}.{where} each on its own "
                        f"(they would no longer line up); use crop or reject",
                    )
                )
    return problems


def _mask_shape_problems(spec: SpecView) -> list[Problem]:
    """A mask has its image's size (or it is rejected), so its field must have the image
    field's height and width: else the two are padded apart and never line up."""
    plain = [n for n, f in spec.fields.items() if isinstance(f, ImageField) and f.derive is None]
    problems = []
    for name, field in spec.fields.items():
        if not isinstance(field, MaskField) or field.shape is None:
            continue
        of = field.of or (plain[0] if plain else None)
        image = spec.fields.get(of) if of else None
        if not isinstance(image, ImageField) or image.shape is None:
            continue
        if tuple(field.shape[1:]) != tuple(image.shape[1:]):
            problems.append(
                Problem(
                    (("fields", name, "shape"),),
                    f"must have {of}'s height and width {list(image.shape[1:])} (a mask has its "
                    f"image's size), got {list(field.shape)}; set of: to the image it belongs to",
                )
            )
    return problems


def _window_problems(spec: SpecView) -> list[Problem]:
    """Windows make each input several samples: one field may cut them, not two."""
    cut = [n for n, f in spec.fields.items() if isinstance(f, SeriesField) and f.window]
    return [
        Problem(
            (("fields", name, "window"),),
            f"only one field may cut windows (fields.{cut[0]} does): each window is a sample",
        )
        for name in cut[1:]
    ]


def _remote_problems(spec: SpecView) -> list[Problem]:
    """What object storage cannot hold yet: folder entries (a DICOM series, a folder of
    slices) and kinds that read files beside their own (a recording's channel files)."""
    remote = {name for name, source in spec.sources.items() if isinstance(source.dir, str)}
    problems = [
        Problem(
            (("sources", name, "entries"),),
            "entries: folders is not supported for a source on object storage yet "
            "(a DICOM series or a folder of slices): copy it to a local disk",
        )
        for name in sorted(remote)
        if spec.sources[name].entries == "folders"
    ]
    for field_name, field in spec.fields.items():
        if field.kind == "series" and spec.source_of(field_name) in remote:
            problems.append(
                Problem(
                    (("fields", field_name),),
                    "a series field cannot read a source on object storage yet (its channel "
                    "files are read beside each file): copy the source to a local disk",
                )
            )
    return problems


def _source_problems(spec: SpecView, field_name: str, field: FieldSpec) -> list[Problem]:
    key = ("fields", field_name)
    source = spec.source_of(field_name)
    if source is None or source in spec.sources:
        return []
    if field.source_key != ("source",):
        return [
            Problem(
                ((*key, *field.source_key),),
                unknown_source(source, spec.sources, implicit=False),
            )
        ]
    implicit = getattr(field, "source", None) is None
    return [
        Problem(
            (key if implicit else (*key, "source"),),
            unknown_source(source, spec.sources, implicit=implicit),
        )
    ]


def _reference_problems(spec: SpecView, field_name: str, field: FieldSpec) -> list[Problem]:
    """A derived, scaled or mask field names the image field it follows: it must be one."""
    key = ("fields", field_name)
    plain = [n for n, f in spec.fields.items() if isinstance(f, ImageField) and f.derive is None]
    return [
        Problem(
            ((*key, *where),),
            f"names {target!r}, which is not an image field read from files "
            f"(those are: {', '.join(plain) or 'none'})",
        )
        for where, target in field.references()
        if target not in plain or target == field_name
    ]


def _stratify_problems(spec: SpecView) -> list[Problem]:
    if spec.stratify is None or isinstance(spec.fields.get(spec.stratify), LabelField):
        return []
    labels = [n for n, f in spec.fields.items() if isinstance(f, LabelField)]
    close = difflib.get_close_matches(spec.stratify, labels, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return [
        Problem(
            (("stratify",),),
            f"must name a label field, got {spec.stratify!r} "
            f"(label fields: {', '.join(labels) or 'none'}){hint}",
        )
    ]


def _group_by_problems(spec: SpecView) -> list[Problem]:
    """A group field must be known when splits are assigned: a label or a table column."""
    group_by = spec.group_by
    if group_by is None or group_by.field is None:
        return []
    name = group_by.field
    field = spec.fields.get(name)
    planned = [n for n, f in spec.fields.items() if _known_at_plan_time(f)]
    if field is not None and _known_at_plan_time(field):
        return []
    why = "is not a field" if field is None else "is not known before decoding"
    return [
        Problem(
            (("splits", "group_by", "field"),),
            f"{name!r} {why}: splits are assigned before decoding, so a group comes from a "
            f"label, a table column (fields with from: {{table: ...}}: "
            f"{', '.join(planned) or 'none'}) or a pattern on the path",
        )
    ]


def _known_at_plan_time(field: Any) -> bool:
    origin = getattr(field, "from_", None)
    return isinstance(field, LabelField) or getattr(origin, "table", None) is not None
