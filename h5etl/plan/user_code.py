"""user_code: the config's transforms (issue 28) resolved against its kinds, in the parent.

Every call the config names (a field's ``transform``, the sample-level ``transforms``, a
``derive``'s ``call``) is resolved once per spec by ``h5etl.transforms.loading``: its module
imported (only the modules named), its arguments bound to its signature. A call that cannot
run is a ``ConfigError`` at its key, exit 2, before any work. What comes out is the plain,
picklable ``Transforms`` the decode workers run, each field's ``Expectation`` from its kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from h5etl.config.fields import ImageField
from h5etl.config.spec import Spec
from h5etl.errors import ConfigError
from h5etl.format.contract import TRANSFORMS_KEY, FieldRecord
from h5etl.kinds.base import Kind
from h5etl.kinds.image import ImageKind
from h5etl.transforms.apply import DerivedCall, FieldChain, SampleCall, Transforms
from h5etl.transforms.identity import describe, field_digests
from h5etl.transforms.loading import CallError, CallSpec, Loader, ModuleRef

__all__ = [
    "TRANSFORMS_KEY",
    "UserCode",
    "user_code",
    "with_derive_calls",
    "with_transforms",
]


@dataclass(frozen=True, slots=True)
class UserCode:
    """A spec's resolved calls: ``transforms`` (None: the config names none) and the modules
    they imported (``imported``: what the lineage records)."""

    transforms: Transforms | None
    derive_calls: Mapping[str, CallSpec]
    imported: tuple[ModuleRef, ...]

    def record(self) -> dict[str, Any] | None:
        """The transforms as the layout record and the lineage hold them (``describe``)."""
        return None if self.transforms is None else describe(self.transforms)

    def modules(self) -> list[dict[str, str | None]]:
        """The user modules imported, with where they were read from (the lineage's)."""
        return [
            {"module": m.name, "origin": m.origin, "path": m.path, "sha256": m.sha256}
            for m in self.imported
        ]


_LAST: list[tuple[Spec, UserCode]] = []  # the last spec's: a build asks several times


def user_code(spec: Spec, kinds: Sequence[Kind]) -> UserCode:
    """``spec``'s calls resolved (once per spec), with ``kinds``' expectations.

    Raises:
        ConfigError: a call cannot be imported or its arguments do not fit (one line at its
            key), or it names a field it cannot transform.
    """
    if _LAST and _LAST[0][0] is spec:
        return _LAST[0][1]
    found = _resolve(spec, {kind.name: kind for kind in kinds})
    _LAST[:] = [(spec, found)]
    return found


def with_derive_calls(spec: Spec, kinds: Sequence[Kind]) -> tuple[Kind, ...]:
    """``kinds`` with each ``derive: {call}`` field's resolved call (its kind runs it)."""
    calls = user_code(spec, kinds).derive_calls
    return tuple(
        dataclasses.replace(kind, derive_call=calls[kind.name], seed=spec.seed)
        if isinstance(kind, ImageKind) and kind.name in calls
        else kind
        for kind in kinds
    )


def _resolve(spec: Spec, kinds: Mapping[str, Kind]) -> UserCode:
    config_dir = spec.config_file.parent if spec.config_file is not None else None
    loader = Loader(config_dir)
    chains = []
    for name, field in spec.fields.items():
        if field.transform:
            _transformable(spec, kinds, name, f"fields.{name}.transform")
            calls = tuple(
                _call(loader, c.call, c.args, f"fields.{name}.transform[{i}]", spec)
                for i, c in enumerate(field.transform)
            )
            chains.append(FieldChain(name, calls))
    samples = []
    for i, step in enumerate(spec.transforms):
        key = f"transforms[{i}]"
        for name in step.fields:
            _transformable(spec, kinds, name, f"{key}.fields")
        spec_ = _call(loader, step.call, step.args, key, spec)
        samples.append(SampleCall(spec_, tuple(dict.fromkeys(step.fields))))
    derived = _derived(spec, loader, kinds)
    if not (chains or samples or derived):
        return UserCode(None, {}, ())
    names = {c.field for c in chains} | {f for s in samples for f in s.fields}
    names |= {d.field for d in derived}
    expect = tuple(
        (name, e) for name in spec.fields if name in names and (e := kinds[name].expectation())
    )
    order = {name: i for i, name in enumerate(spec.fields)}
    transforms = Transforms(
        spec.seed,
        tuple(sorted(chains, key=lambda c: order[c.field])),
        tuple(samples),
        expect,
        tuple(derived),
    )
    return UserCode(transforms, {d.field: d.call for d in derived}, loader.imported)


def _derived(spec: Spec, loader: Loader, kinds: Mapping[str, Kind]) -> list[DerivedCall]:
    found = []
    for name, field in spec.fields.items():
        derive = field.derive if isinstance(field, ImageField) else None
        if derive is None or derive.call is None:
            continue
        for source in derive.sources:
            if source == name:
                raise ConfigError(
                    "a field cannot be derived from itself",
                    path=spec.config_file,
                    key=f"fields.{name}.derive.from",
                    topic="transforms",
                )
            _transformable(spec, kinds, source, f"fields.{name}.derive.from")
        call = _call(loader, derive.call, derive.args or {}, f"fields.{name}.derive.call", spec)
        found.append(DerivedCall(name, call, derive.sources))
    return _in_decode_order(found)


def _in_decode_order(found: list[DerivedCall]) -> list[DerivedCall]:
    """Derived fields after those they are derived from (a derive of a derive)."""
    by_name = {d.field: d for d in found}
    out: list[DerivedCall] = []

    def visit(d: DerivedCall) -> None:
        if d in out:
            return
        for source in d.sources:
            if source in by_name and by_name[source] is not d:
                visit(by_name[source])
        out.append(d)

    for d in found:
        visit(d)
    return out


def _call(loader: Loader, text: str, args: Mapping[str, Any], key: str, spec: Spec) -> CallSpec:
    try:
        return loader.resolve(text, args)
    except CallError as exc:
        raise ConfigError(str(exc), path=spec.config_file, key=key, topic="transforms") from exc


def _transformable(spec: Spec, kinds: Mapping[str, Kind], name: str, key: str) -> None:
    kind = kinds.get(name)
    if kind is None:
        raise ConfigError(
            f"names field {name!r}, which the config does not have "
            f"(fields: {', '.join(spec.fields)})",
            path=spec.config_file,
            key=key,
            topic="transforms",
        )
    if kind.expectation() is None:
        raise ConfigError(
            f"field {name} is a {kind.kind} field, which transforms cannot make (image, "
            "mask and volume fields can)",
            path=spec.config_file,
            key=key,
            topic="transforms",
        )


def with_transforms(
    records: Mapping[str, FieldRecord], transforms: Transforms | None
) -> dict[str, FieldRecord]:
    """The fields' layout records, each a transform touches with its ``transforms`` entry:
    the digest an incremental build compares and each call (dotted path, args, code
    identity), in the order they run. Fields no transform touches keep their record as
    it was, byte for byte."""
    if transforms is None:
        return dict(records)
    calls = field_calls(describe(transforms))
    out = dict(records)
    for name, digest in field_digests(transforms).items():
        entry = {"digest": digest, "calls": calls.get(name, [])}
        record = out[name]
        out[name] = dataclasses.replace(record, extra={**record.extra, TRANSFORMS_KEY: entry})
    return out


def field_calls(described: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per field, the calls that make its value, in the order they run (from ``describe``):
    its derive, its chain, the sample-level calls that see it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, entry in described.get("derived", {}).items():
        out.setdefault(name, []).append({"step": "derive", **entry})
    for name, chain in described.get("fields", {}).items():
        out.setdefault(name, []).extend({"step": "transform", **c} for c in chain)
    for step in described.get("sample", []):
        for name in step["fields"]:
            out.setdefault(name, []).append({"step": "sample", **step})
    return out
