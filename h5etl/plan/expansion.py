"""Plan-time expansion: an input that becomes several samples (a recording cut into windows).

``clean.plan`` calls ``expanded`` after assigning splits, so each input's samples stay in its
split. The kind that expands (``Kind.expands``) gives each sample's key and plan-time value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from h5etl.dataflow import Sample
from h5etl.kinds.base import Kind

if TYPE_CHECKING:
    from h5etl.decode.probes import Probed


def expanded(
    by_split: dict[str, list[tuple[Sample, Probed]]], kinds: Sequence[Kind]
) -> dict[str, list[tuple[Sample, Probed]]]:
    """Inputs that become several samples (a recording cut into windows) as those samples,
    each in the split of its input: the split is seeded by the input's name, which each
    keeps as its ``name`` (its ``sample_key``), so no input straddles two splits."""
    planned = [kind for kind in kinds if kind.plan_side]
    expanding = [(column, kind) for column, kind in enumerate(planned) if kind.expands]
    if not expanding:
        return by_split
    column, kind = expanding[0]  # the config allows one field that expands
    out: dict[str, list[tuple[Sample, Probed]]] = {}
    for split, pairs in by_split.items():
        out[split] = [
            (
                dataclasses.replace(
                    sample,
                    key=key,
                    name=sample.split_name,
                    extras=(*sample.extras[:column], value, *sample.extras[column + 1 :]),
                ),
                outcome,
            )
            for sample, outcome in pairs
            for key, value in kind.expand(sample, sample.extras[column])
        ]
    return out
