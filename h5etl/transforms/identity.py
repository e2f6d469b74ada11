"""identity: which code made a stored value, as a small record the same on every machine.

A call's identity is its text, its module's name and origin, the SHA-256 of the module file's
bytes, the installed distribution and version that holds the module (when one does), and its
arguments as canonical JSON. Never a path, a time or a process id: two machines building the
same config with the same code agree byte for byte. A built-in is named by h5etl's version.

Only the function's own module file is hashed: a helper module it imports is covered by the
distribution's version when installed, and not at all beside the config (keep a transform's
code in its one file there).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from h5etl._version import __version__
from h5etl.transforms.apply import (
    FieldChain,
    Transforms,
    chain_site,
    derive_site,
    sample_site,
)
from h5etl.transforms.loading import CallSpec, canonical_json

__all__ = ["CodeIdentity", "describe", "field_digests", "identity_of"]


@dataclass(frozen=True, slots=True)
class CodeIdentity:
    """The code and arguments of one call; ``digest`` is what an incremental build compares."""

    call: str
    module: str
    origin: str
    source_sha256: str | None
    distribution: str | None
    version: str | None
    args: str  # canonical JSON

    def as_json(self) -> dict[str, str | None]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, str | None]) -> CodeIdentity:
        return cls(**data)  # type: ignore[arg-type]  # the record's own keys, as_json wrote them

    @property
    def digest(self) -> str:
        return hashlib.sha256(canonical_json(self.as_json()).encode()).hexdigest()


def identity_of(spec: CallSpec) -> CodeIdentity:
    """``spec``'s identity (in the parent: looking up a distribution reads package metadata)."""
    ref = spec.module
    if ref.origin == "builtin":
        return CodeIdentity(
            spec.text, ref.name, ref.origin, None, "h5etl", __version__, spec.args_json
        )
    distribution, version = (
        _distribution(ref.name, ref.path) if ref.origin == "installed" else (None, None)
    )
    return CodeIdentity(
        spec.text, ref.name, ref.origin, ref.sha256, distribution, version, spec.args_json
    )


@functools.cache
def _packages() -> dict[str, list[str]]:
    return {
        top: sorted(set(names))
        for top, names in importlib.metadata.packages_distributions().items()
    }


def _distribution(module: str, path: str | None) -> tuple[str | None, str | None]:
    """(distribution, version) holding ``module``: the standard library is ``python``; where
    several distributions share a top-level name (namespace packages), the one that lists
    the module's file."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return "python", platform.python_version()
    names = _packages().get(top, [])
    if len(names) > 1 and path is not None:
        names = [n for n in names if _holds(n, Path(path))] or names[:0]
    if len(names) != 1:
        return None, None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return None, None


def _holds(distribution: str, path: Path) -> bool:
    files = importlib.metadata.distribution(distribution).files or []
    resolved = path.resolve()
    return any(Path(str(f.locate())).resolve() == resolved for f in files)


def describe(transforms: Transforms) -> dict[str, object]:
    """The build's transforms as JSON for the layout record and the lineage: each field's
    chain and each sample-level call, with their identities, the seed, and each touched
    field's digest (``field_digests``: what the next incremental build compares)."""
    return {
        "seed": transforms.seed,
        "digests": field_digests(transforms),
        "fields": {
            chain.field: [identity_of(spec).as_json() for spec in chain.calls]
            for chain in transforms.chains
        },
        "sample": [
            {"fields": list(step.fields), **identity_of(step.call).as_json()}
            for step in transforms.sample_calls
        ],
        "derived": {
            d.field: {"from": list(d.sources), **identity_of(d.call).as_json()}
            for d in transforms.derived
        },
    }


def field_digests(transforms: Transforms) -> dict[str, str]:
    """Per field a transform touches, one digest of all the code that makes its value.

    Followed as the values flow: a field's chain, then each sample-level call that sees it,
    which mixes in the digests of every field it sees (a crop of image and mask reads both),
    and, for a call that draws random numbers, the seed and its ``site``. An incremental
    build redoes a field's samples when its digest changed, and no field's when only an
    unrelated field's did.
    """
    state: dict[str, str] = {}
    chains = {chain.field: chain for chain in transforms.chains}
    for derived in transforms.derived:  # in decode order: a source's chain ran before
        sources = list(derived.sources)
        for name in sources:
            _chain_state(state, chains.pop(name, None), transforms.seed)
        call = _call_digest(derived.call, transforms.seed, derive_site(derived.field))
        state[derived.field] = _digest(
            ["derive", derived.field, call, sources, [state.get(n, "") for n in sources]]
        )
    for chain in chains.values():
        _chain_state(state, chain, transforms.seed)
    seen: dict[tuple[str, ...], int] = {}
    for step in transforms.sample_calls:
        site = sample_site(step.fields, seen)
        inputs = [state.get(name, "") for name in step.fields]
        mixed = _digest(
            ["sample", list(step.fields), _call_digest(step.call, transforms.seed, site), inputs]
        )
        state.update({name: _digest([mixed, name]) for name in step.fields})
    return state


def _chain_state(state: dict[str, str], chain: FieldChain | None, seed: int) -> None:
    """A field's digest after its chain (over its derive's digest, for a derived field)."""
    if chain is None:
        return
    calls = [_call_digest(s, seed, chain_site(chain.field, i)) for i, s in enumerate(chain.calls)]
    before = state.get(chain.field)
    parts: list[object] = ["chain", chain.field, calls]
    state[chain.field] = _digest(parts if before is None else [*parts, before])


def _call_digest(spec: CallSpec, seed: int, site: str) -> str:
    own = identity_of(spec).digest
    return _digest([own, seed, site]) if spec.wants_rng else own


def _digest(parts: object) -> str:
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()
