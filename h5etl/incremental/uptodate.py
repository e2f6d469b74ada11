"""uptodate: whether a build would only publish a copy of the release the link points at.

Like ``make`` or DVC: when the inputs and the config are what that release was built from,
the build publishes nothing and says so ("up to date"). Input: the plan, the parent release
(``h5etl.incremental.parent``), its carry record (``h5etl.incremental.reuse``) and the rejects found
before decoding. Up to date means: the config text, the notes and the h5etl version are the
parent's; every sample the parent stores is planned again, in its split, and unchanged
(stamps, else equal bytes); and every other planned sample was rejected by the parent while
decoding and its files keep their stamps. Rejects found before decoding (orphans, duplicates)
store nothing, so they do not count: a build with nothing new to store publishes nothing,
whatever its reject list. When only samples the parent does not store changed (new ones, or
rejected ones touched), they are decoded; if the finished file stores the parent's samples
row for row (all of them rejected again), it is not published either (``NothingNew``). The
decision is pure, plus hashing the files whose stamps changed (as carrying does). ``Gate``
applies it to one build: it starts the decoder as soon as something will be decoded, and
refreshes the carry record of an up-to-date release (the stamps of touched files of equal
bytes, the samples rejected again) so the next build decides without decoding.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from h5etl._version import __version__
from h5etl.config.spec import Spec, spec_text
from h5etl.dataflow import Reject, Sample, valid_text
from h5etl.execute import local_threads
from h5etl.execute.assembly import layout_record
from h5etl.format import contract as fileformat
from h5etl.format.contract import LayoutRecord
from h5etl.history.build_report import BuildReport
from h5etl.history.release_notes import local_rejects, stored_rejects
from h5etl.incremental import carry_record, reuse
from h5etl.incremental.parent import Parent
from h5etl.incremental.redo import transform_changes
from h5etl.plan.result import Plan
from h5etl.release.folder import OutputFolder
from h5etl.sink import disk as sink_disk

if TYPE_CHECKING:
    from h5etl.execute.assembly import LazyDecoder

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
        carry_record.sample_carry_key(planned[key]): [
            *carry_record.sample_state(planned[key], plan.stamps[key]),
            [list(row) for row in found],
        ]
        for key, found in rows.items()
    }


class NothingNew(Exception):
    """The file written stores the parent's samples row for row: it is not published."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """``why_build``'s answer."""

    reason: str | None  # why a release must be built; None: the parent is up to date
    touched: dict[str, str] = field(default_factory=dict)  # equal bytes, new stamps
    rejected: list[Row] = field(default_factory=list)  # the parent's decode-time reject rows
    # the parent's samples are all planned again unchanged, only others are to decode;
    # None: not looked at (a new sample was found first, ``thorough`` looks)
    stored_same: bool | None = False


def why_build(
    spec: Spec,
    plan: Plan,
    parent: Parent,
    record: Mapping[str, Any] | None,
    layout: LayoutRecord,
    *,
    thorough: bool = False,
) -> Verdict:
    """Why this build must publish a release (None: ``parent`` is up to date), with the
    stamps of the parent's samples whose files were touched but hold the same bytes and
    the rows of the parent's rejects of the samples planned again. A sample the parent
    never saw ends the look at once unless ``thorough`` (``stored_same`` is then None)."""
    config = spec_text(spec)
    reason = reuse.why_not(parent, record, config, layout, plan)
    if reason is not None or record is None:
        return Verdict(reason or "no carry record")
    changed = transform_changes(parent.layout, layout)
    if changed:  # the same files, other code: its fields are made again (an edited module)
        return Verdict("; ".join(f"{c.category} {c.where}" for c in changed.values()))
    if config != parent.config:
        return Verdict(f"the config differs from v{parent.version:04d}'s")
    if spec.notes and spec.notes != parent.notes:
        return Verdict("new release notes")
    if parent.tool_version != __version__:
        return Verdict(f"v{parent.version:04d} was built by h5etl {parent.tool_version or '?'}")
    new = None if thorough else _first_new(plan, record)
    if new is not None:  # found without comparing a stored sample (an added sample's build)
        return Verdict(f"{new} is new", stored_same=None)
    reason, touched, rest = _stored_unchanged(plan, parent, record)
    if reason is not None:
        return Verdict(reason)
    found: list[Row] = []
    rejected: Mapping[str, list[Any]] = record.get("rejected", {})
    for name, sample in rest.items():
        known = rejected.get(name)
        if known is None:
            return Verdict(f"{sample.key} is new", stored_same=True)
        state, rows = carry_record.rejected_state(known)
        if state != carry_record.sample_state(sample, plan.stamps[sample.key]):
            why = f"{sample.key} changed since v{parent.version:04d} rejected it"
            return Verdict(why, stored_same=True)
        found.extend(rows)
    return Verdict(None, touched, found)


def _first_new(plan: Plan, record: Mapping[str, Any]) -> str | None:
    """The key of a planned sample the parent's build never saw (neither stored nor
    rejected): one is enough to build, and finding it costs a lookup per sample."""
    known: Mapping[str, Any] = record.get("samples", {})
    rejected: Mapping[str, Any] = record.get("rejected", {})
    for members in plan.splits.values():
        for sample in members:
            name = carry_record.sample_carry_key(sample)
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
    rest = {
        carry_record.sample_carry_key(s): s for members in plan.splits.values() for s in members
    }
    touched: dict[str, str] = {}
    hashable = reuse.file_lineage(plan)
    for split, old in parent.splits.items():
        keys = rows.get(split, [])
        if len(keys) != len(old.keys):
            return f"the carry record does not list {split}'s rows", {}, {}
        members = {carry_record.sample_carry_key(s) for s in plan.splits.get(split, [])}
        for row, name in enumerate(keys):
            sample = rest.pop(name, None) if name in members else None
            if sample is None:
                return f"{old.keys[row]} is gone from {split}", {}, {}
            stamp = plan.stamps[sample.key]
            state = known.get(name)
            lineage = tuple(old.lineage[row])
            if not reuse.unchanged(sample, stamp, state, lineage, hashable=hashable):
                return f"{sample.key} changed", {}, {}
            if state is not None and state[1] != stamp:
                touched[name] = stamp
    return None, touched, rest


class Gate:
    """One build's answer to "anything to publish?", given as early as it can be: the
    decoder starts once something will be decoded (right after discovery when the samples
    found are not as many as the linked release was built from and more than this process
    would decode itself, ``local_threads``; else after planning), never for an
    up-to-date build. ``always`` (``--full``, ``--resume``): it builds."""

    def __init__(self, output: OutputFolder, decoder: LazyDecoder, *, always: bool = False):
        self.output, self.decoder = output, decoder
        linked = None if always else output.current_release()
        self.record = None if linked is None else output.read_carry(linked[0])
        self._parent = None if linked is None or self.record is None else linked[1]
        # what ``nothing_new`` needs of a build that only decodes samples the parent lacks
        self._pending: tuple[Spec, Plan, Parent, LayoutRecord, bool | None] | None = None

    def _will_copy(self) -> None:
        """The build goes on and may carry from the parent: its bytes are asked for now."""
        if self._parent is not None:
            sink_disk.prefetch(self._parent)
            self._parent = None  # once

    def discovered(self, samples: int) -> None:
        """Discovery found ``samples``: start the workers now unless this may be up to date."""
        known = None if self.record is None else self.record.get("samples")
        # discovery finds recordings, the record keeps their windows: count split names
        names = (
            {carry_record.split_name_of(key) for key in known} if isinstance(known, dict) else None
        )
        if names is None:
            self.decoder.start()  # nothing carries: the workers start meanwhile
        elif len(names) != samples:
            self._will_copy()  # not up to date: the parent's chunks will be copied
            # something will be decoded: at least the samples found beyond the record's
            new = max(samples - len(names), 0)
            if not self.decoder.cheap_here(new, local_threads.per_sample_seconds(self.record)).here:
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
        verdict = why_build(spec, plan, parent, record, layout)
        if verdict.reason is not None:
            logger.info("building a new release: %s", verdict.reason)
            if verdict.stored_same is not False:  # what is decoded may all be rejected again
                self._pending = (spec, plan, parent, layout, verdict.stored_same)
            self._will_copy()
            return False
        if verdict.touched:  # the next build need not hash them again
            self.output.write_carry(
                parent.version, carry_record.with_stamps(record, verdict.touched)
            )
        self._name(report, parent)
        # the rejects found before decoding as they are now, the others as the parent's
        report.rejects = [*report.rejects, *local_rejects(spec, verdict.rejected)]
        return True

    def nothing_new(self, same_rows: bool) -> bool:
        """Whether a finished file stores nothing the parent does not: ``same_rows`` (its
        samples are the parent's, row for row) in a build that found every sample the parent
        stores unchanged, and decoded only others."""
        if not same_rows or self._pending is None:
            return False
        spec, plan, parent, layout, same = self._pending
        if same is None:  # a new sample stopped the look: finish it now (rarely needed)
            same = why_build(spec, plan, parent, self.record, layout, thorough=True).stored_same
        return bool(same)

    def settle(self, report: BuildReport, rejected: Sequence[Reject]) -> None:
        """After ``NothingNew``: ``report`` names the parent; its carry record learns the
        samples decoded and ``rejected`` again, so the next build need not decode them."""
        assert self._pending is not None
        assert self.record is not None
        spec, plan, parent, _, _ = self._pending
        before = self.record.get("rejected")
        known = {
            **(before if isinstance(before, dict) else {}),
            **rejected_of(spec, plan, rejected),
        }
        self.output.write_carry(parent.version, {**self.record, "rejected": known})
        self._name(report, parent)
        report.reused = report.reused_bytes = 0  # nothing was copied into a release

    def _name(self, report: BuildReport, parent: Parent) -> None:
        info = self.output.info(parent.version)
        report.up_to_date = True
        report.version, report.path, report.link = parent.version, parent.path, self.output.link
        report.url = self.output.published_url(parent.version)
        report.rejects_path = info.rejects
        report.samples = {split: len(rows.keys) for split, rows in parent.splits.items()}


def message(report: BuildReport) -> str:
    """The one line an up-to-date build prints."""
    name = report.path.stem if report.path is not None else f"v{report.version or 0:04d}"
    samples = sum(report.samples.values())
    return (
        f"{report.name}: nothing changed since {name} ({samples:,} samples, same config and "
        f"inputs): no new release; --full rebuilds"
    )
