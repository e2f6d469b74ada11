"""settle: the release of the samples a build stored, when decoding rejected some of them.

Splits are assigned at plan time (``split_assign``), before decoding finds the files it
must reject; the rejects then leave their splits short (40 good pairs and 4 corrupt ones in
``valid`` were stored 35/5 where the exact rule over the 40 gives 32/8). When decoding
rejected planned samples, ``resettled`` runs the same rule again over the samples stored
(with the same parent splits, so sticky and grouped as before) and the build writes the
release again from that plan (``rewrite``), carrying from the parent what it carries
anyway. The promise "every split within one sample of fraction x N" (with groups: "as close
as whole groups allow") then holds for the samples actually stored, and the file depends on
them alone: not on the rejects, the write's deferred samples, a resume or the shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from h5etl.dataflow import Reject, Sample, text_bytes
from h5etl.incremental import carry_record, parent, reuse
from h5etl.plan import split_assign as assign
from h5etl.plan.admit import write_order
from h5etl.plan.result import Plan
from h5etl.plan.stratify import Stratum

if TYPE_CHECKING:
    from h5etl.config.spec import Spec
    from h5etl.format.contract import LayoutRecord
    from h5etl.history.build_report import BuildReport
    from h5etl.release.folder import OutputFolder


def resettled(spec: Spec, plan: Plan, late: Sequence[Reject]) -> Plan | None:
    """The plan of the samples stored, split by the rule over them; None when decoding
    rejected none of the planned samples."""
    dropped = {reject.key for reject in late}
    if not dropped:
        return None
    units: dict[str, list[Sample]] = {}  # split name -> its stored samples (a recording's windows)
    for members in plan.splits.values():
        for sample in members:
            if sample.key not in dropped:
                units.setdefault(sample.split_name, []).append(sample)
    names = sorted(units)
    placed = assign.assign(
        names,
        spec.splits,
        spec.seed,
        strata=_strata(spec, plan, [units[n][0] for n in names]),
        groups=[str(units[n][0].group) for n in names] if spec.group_by is not None else None,
        previous=plan.previous,
    )
    by_split: dict[str, list[Sample]] = {split: [] for split in spec.splits}
    for name, split in zip(names, placed.splits, strict=True):
        by_split[split].extend(units[name])
    digest = hashlib.sha256(text_bytes(plan.digest))
    for name, split in zip(names, placed.splits, strict=True):
        digest.update(text_bytes(f"\x00{split}\x01{name}"))
    policy = {
        **plan.policy,
        **placed.policy,
        "counts": {split: len(members) for split, members in by_split.items()},
        "settled": len(dropped),  # samples decoding rejected after the splits were planned
    }
    return dataclasses.replace(
        plan,
        splits=write_order(spec.seed, by_split),
        digest=f"{digest.hexdigest()}+settled",
        policy=policy,
    )


def _strata(spec: Spec, plan: Plan, samples: Sequence[Sample]) -> list[Stratum] | None:
    """Each sample's class (``stratify:``), from its plan-time values, as ``clean`` read it."""
    if spec.stratify is None:
        return None
    planned = [kind.name for kind in plan.kinds if kind.plan_side]
    column = planned.index(spec.stratify)
    return [sample.extras[column] for sample in samples]


def line(first: Plan, settled: Plan) -> str:
    """What the build summary says of a settled plan."""
    was = {sample.key: split for split, members in first.splits.items() for sample in members}
    moved = sum(
        1 for split, members in settled.splits.items() for s in members if was[s.key] != split
    )
    counts = "/".join(str(len(members)) for members in settled.splits.values())
    rejected = settled.policy.get("settled", 0)
    return (
        f"decoding rejected {rejected} planned sample{'s' * (rejected != 1)}: split again over "
        f"the samples stored ({counts}), {moved} moved"
    )


class Write(Protocol):
    """``write.write_release`` for one plan: writes it into a temp file, returns its block log."""

    def __call__(
        self, plan: Plan, report: BuildReport, temp: Path, *, carried: reuse.CarryPlan | None
    ) -> tuple[str, carry_record.BlockLog] | None: ...


def rewrite(
    write: Write,
    plans: tuple[Plan, Plan],
    report: BuildReport,
    temp: Path,
    *,
    origin: parent.Parent | None,
    output: OutputFolder,
    config: str,
    layout: LayoutRecord,
    record: Mapping[str, Any] | None,
) -> tuple[str, carry_record.BlockLog] | None:
    """Write the release again from the settled plan (``plans[1]``) into ``temp``, carrying
    from ``origin`` (the parent, None for ``--full``) what the settled plan leaves unchanged,
    as the first write did: the file depends on the settled plan alone, never on how the
    first file came about (a resumed build writes the file one never killed does).
    ``record``: the parent's carry record as the build read it."""
    first, settled = plans
    again = None
    if origin is not None:
        again, _ = reuse.decide(settled, origin, output, config, layout, record)
    report.warnings.append(line(first, settled))
    return write(settled, report, temp, carried=again)
