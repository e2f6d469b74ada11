"""The header probes' rules from a config: parent-side planning, apart from the rules
themselves (``h5etl.decode.probes.ProbeRules``, plain data the workers run), so the worker
side never imports the spec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from h5etl.decode.probes import ProbeRules
from h5etl.kinds.base import Kind
from h5etl.plan.kind_registry import decode_order

if TYPE_CHECKING:
    from h5etl.config.spec import Spec


def probe_rules(spec: Spec, kinds: Sequence[Kind]) -> ProbeRules:
    """What the header probes check for ``spec``'s fields (``kinds``, the registry's)."""
    targets = (kind.probe_target() for kind in kinds)
    folders = frozenset(
        i for i, source in enumerate(spec.sources.values()) if source.entries == "folders"
    )
    # only kinds that override it: this runs for every sample, and the rules travel to
    # the header probes' workers
    companions = tuple(
        (k.source_index, k)
        for k in kinds
        if k.source_index is not None and type(k).companion_paths is not Kind.companion_paths
    )
    ordered = (kinds[i] for i in decode_order(kinds))
    return ProbeRules(
        spec.pad.oversize == "reject",
        tuple(t for t in targets if t is not None),
        folders,
        companions,
        tuple(k for k in ordered if k.probes_headers and k.source_index is not None),
    )
