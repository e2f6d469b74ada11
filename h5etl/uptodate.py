"""uptodate: whether a build would only publish a copy of the release the link points at.

Like ``make`` or DVC: when the inputs and the config are what that release was built from,
the build publishes nothing and says so ("up to date"). Input: the plan, the parent release
(``h5etl.parent``), its carry record (``h5etl.carry``) and the rejects found before
decoding. Up to date means: the config text, the notes and the h5etl version are the
parent's; every sample the parent stores is planned again, in its split, and unchanged
(stamps, else equal bytes); every other planned sample was rejected by the parent while
decoding and its files keep their stamps; and the rejects, plan-time and decode-time, are
the very rows the parent stores in ``/diagnostics/rejects``. The decision is pure, plus
hashing the files whose stamps changed (as carrying does). ``Gate`` applies it to one
build: it starts the decoder as soon as something will be decoded, and refreshes the stamps
of touched files of equal bytes in the carry record of an up-to-date release.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from h5etl import __version__, carry, fileformat, inprocess, sink_disk
from h5etl.buildparts import layout_record
from h5etl.clean import Plan
from h5etl.fileformat import LayoutRecord
from h5etl.parent import Parent
from h5etl.records import Reject, Sample, valid_text
from h5etl.release import OutputFolder
from h5etl.report import BuildReport
from h5etl.spec import Spec, spec_text
from h5etl.story import local_rejects, stored_rejects

if TYPE_CHECKING:
    from h5etl.buildparts import LazyDecoder

logger = logging.getLogger(__name__)

Row = tuple[str, ...]  # one reject as the release stores it (``fileformat.REJECT_COLUMNS``)


def reject_rows(spec: Spec, rejects: Iterable[Reject]) -> list[Row]:
    """The rejects as ``/diagnostics/rejects`` rows (portable paths, valid UTF-8)."""
    return [
        tuple(valid_text(r.as_json()[c]) for c in fileformat.REJECT_COLUMNS)
        for r in stored_rejects(spec, list(rejects))
    ]


def rejected_of(spec: Spec, plan: Plan, rejects: Sequence[Reject]) -> dict[str, list[Any]]:
    """The carry record's ``rejected`` entries: each sample rejected while decoding, by its
    carry key: its files, their stamps, its plan values (``carry.sample_state``) and the
    rows its rejects take in the release, so the next build knows it is the same again."""
    planned = {s.key: s for members in plan.splits.values() for s in members}
    rows: dict[str, list[Row]] = {}
    for reject, row in zip(rejects, reject_rows(spec, rejects), strict=True):
        if reject.key in planned:
            rows.setdefault(reject.key, []).append(row)
    return {
        carry.sample_carry_key(planned[key]): [
            *carry.sample_state(planned[key], plan.stamps[key]),
            [list(row) for row in found],
        ]
        for key, found in rows.items()
    }


def why_build(
    spec: Spec,
    plan: Plan,
    parent: Parent,
    record: Mapping[str, Any] | None,
    plan_rejects: Sequence[Reject],
    layout: LayoutRecord,
) -> tuple[str | None, dict[str, str]]:
    """Why this build must publish a release (None: ``parent`` is up to date), and the
    stamps of the parent's samples whose files were touched but hold the same bytes."""
    config = spec_text(spec)
    reason = carry.why_not(parent, record, config, layout, carry.plan_block(plan))
    if reason is not None or record is None:
        return reason or "no carry record", {}
    if config != parent.config:
        return f"the config differs from v{parent.version:04d}'s", {}
    if spec.notes and spec.notes != parent.notes:
        return "new release notes", {}
    if parent.tool_version != __version__:
        return f"v{parent.version:04d} was built by h5etl {parent.tool_version or '?'}", {}
    new = _first_new(plan, record)
    if new is not None:  # found without comparing a stored sample (an added sample's build)
        return f"{new} is new", {}
    reason, touched, rest = _stored_unchanged(plan, parent, record)
    if reason is not None:
        return reason, {}
    expected: list[Row] = reject_rows(spec, plan_rejects)
    rejected: Mapping[str, list[Any]] = record.get("rejected", {})
    for name, sample in rest.items():
        known = rejected.get(name)
        if known is None:
            return f"{sample.key} is new", {}
        state, rows = carry.rejected_state(known)
        if state != carry.sample_state(sample, plan.stamps[sample.key]):
            return f"{sample.key} changed since v{parent.version:04d} rejected it", {}
        expected.extend(rows)
    if sorted(expected) != sorted(parent.rejects):
        return f"the rejects differ from v{parent.version:04d}'s", {}
    return None, touched


def _first_new(plan: Plan, record: Mapping[str, Any]) -> str | None:
    """The key of a planned sample the parent's build never saw (neither stored nor
    rejected): one is enough to build, and finding it costs a lookup per sample."""
    known: Mapping[str, Any] = record.get("samples", {})
    rejected: Mapping[str, Any] = record.get("rejected", {})
    for members in plan.splits.values():
        for sample in members:
            name = carry.sample_carry_key(sample)
            if name not in known and name not in rejected:
                return sample.key
    return None


def _stored_unchanged(
    plan: Plan, parent: Parent, record: Mapping[str, Any]
) -> tuple[str | None, dict[str, str], dict[str, Sample]]:
    """Whether every row the parent stores is a sample planned in its split and unchanged:
    the reason if not, the touched-but-equal samples' stamps (by carry key), and the planned
    samples left (by carry key)."""
    known: Mapping[str, list[Any]] = record.get("samples", {})
    rows: Mapping[str, list[str]] = record.get("rows", {})
    rest = {carry.sample_carry_key(s): s for members in plan.splits.values() for s in members}
    touched: dict[str, str] = {}
    hashable = carry.file_lineage(plan)
    for split, old in parent.splits.items():
        keys = rows.get(split, [])
        if len(keys) != len(old.keys):
            return f"the carry record does not list {split}'s rows", {}, {}
        members = {carry.sample_carry_key(s) for s in plan.splits.get(split, [])}
        for row, name in enumerate(keys):
            sample = rest.pop(name, None) if name in members else None
            if sample is None:
                return f"{old.keys[row]} is gone from {split}", {}, {}
            stamp = plan.stamps[sample.key]
            state = known.get(name)
            lineage = tuple(old.lineage[row])
            if not carry.unchanged(sample, stamp, state, lineage, hashable=hashable):
                return f"{sample.key} changed", {}, {}
            if state is not None and state[1] != stamp:
                touched[name] = stamp
    return None, touched, rest


class Gate:
    """One build's answer to "anything to publish?", given as early as it can be: the
    decoder starts once something will be decoded (right after discovery when the samples
    found are not as many as the linked release was built from and more than this process
    would decode itself, ``h5etl.inprocess``; else after planning), never for an up-to-date
    build. ``always`` (``--full``, ``--resume``): it builds."""

    def __init__(self, output: OutputFolder, decoder: LazyDecoder, *, always: bool = False):
        self.output, self.decoder = output, decoder
        linked = None if always else output.current_release()
        self.record = None if linked is None else output.read_carry(linked[0])
        self._parent = None if linked is None or self.record is None else linked[1]

    def _will_copy(self) -> None:
        """The build goes on and may carry from the parent: its bytes are asked for now."""
        if self._parent is not None:
            sink_disk.prefetch(self._parent)
            self._parent = None  # once

    def discovered(self, samples: int) -> None:
        """Discovery found ``samples``: start the workers now unless this may be up to date."""
        known = None if self.record is None else self.record.get("samples")
        # discovery finds recordings, the record keeps their windows: count split names
        names = {carry.split_name_of(key) for key in known} if isinstance(known, dict) else None
        if names is None:
            self.decoder.start()  # nothing carries: the workers start meanwhile
        elif len(names) != samples:
            self._will_copy()  # not up to date: the parent's chunks will be copied
            # something will be decoded: at least the samples found beyond the record's
            new = max(samples - len(names), 0)
            if not self.decoder.cheap_here(new, inprocess.per_sample_seconds(self.record)).here:
                self.decoder.start()  # too many for this process: the workers start meanwhile

    def up_to_date(
        self, spec: Spec, plan: Plan, report: BuildReport, parent: Parent | None
    ) -> bool:
        """Whether ``parent`` (the linked release) is up to date; if so, ``report`` names
        it (and its carry record learns the stamps of touched files of the same bytes)."""
        record = self.record
        if parent is None or record is None:
            return False
        layout = layout_record(spec, plan)
        reason, touched = why_build(spec, plan, parent, record, report.rejects, layout)
        if reason is not None:
            logger.info("building a new release: %s", reason)
            self._will_copy()
            return False
        if touched:  # the next build need not hash them again
            self.output.write_carry(parent.version, carry.with_stamps(record, touched))
        info = self.output.info(parent.version)
        report.up_to_date = True
        report.version, report.path, report.link = parent.version, parent.path, self.output.link
        report.rejects_path = info.rejects
        report.samples = {split: len(rows.keys) for split, rows in parent.splits.items()}
        report.rejects = local_rejects(spec, parent.rejects)  # as a build reports them
        return True


def message(report: BuildReport) -> str:
    """The one line an up-to-date build prints."""
    name = report.path.stem if report.path is not None else f"v{report.version or 0:04d}"
    samples = sum(report.samples.values())
    return (
        f"{report.name}: nothing changed since {name} ({samples:,} samples, same config and "
        f"inputs): no new release; --full rebuilds"
    )
