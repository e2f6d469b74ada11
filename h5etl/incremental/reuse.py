"""reuse: which samples an incremental build takes from its parent without decoding them.

Input: the plan, the parent release (``h5etl.incremental.parent``) and the carry record its build
left beside it (files' stamps, per-block statistics, each row's sample). Output: per split, the
parent's blocks to copy byte for byte (whole chunk rows of every fixed field, untouched by
any changed or removed sample; a ragged column's values go with their samples' rows, see
``parent_rows``), and the plan to decode: the parent's other samples in its row order, then the
new ones in the plan's seeded order. Pure planning, plus hashing the files whose size or
mtime changed (the fast pre-check failed; equal bytes still carry).

Samples are matched by their carry key (``carry_key``): the sample's split name, and for the
windows of a recording, which share that name as their ``sample_key``, the window's own key
beside it; the record keeps each parent row's carry key. A recording's windows are carried
when its files are unchanged, and all of them are decoded again when they changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from h5etl.dataflow import Sample
from h5etl.errors import RejectError
from h5etl.execute import local_threads
from h5etl.format import yaml_load
from h5etl.format.contract import LayoutRecord
from h5etl.incremental.carry_record import (
    FORMAT,
    BlockLog,
    plan_block,
    sample_carry_key,
    sample_state,
)
from h5etl.incremental.parent import Parent, ParentSplit
from h5etl.incremental.redo import (
    Redo,
    bare_config,
    bare_fields,
    fields_to_redo,
    refused,
    transform_changes,
)
from h5etl.inputs import opening as inputs
from h5etl.plan.result import Plan
from h5etl.release.folder import OutputFolder
from h5etl.sink.parent_rows import Seed, runs
from h5etl.stats.tallies import Tallies

if TYPE_CHECKING:
    from h5etl.sink.writer import Sink

logger = logging.getLogger(__name__)

# Config keys that change no stored byte of a sample already in the parent: a parent built
# with other values still carries (fractions and seed place only new samples).
VOLATILE_KEYS = (
    "description",
    "attrs",
    "output",
    "max_rejects",
    "max_shrink",
    "allow_empty",
    "on_error",
    "splits",
    "seed",
)


@dataclass(frozen=True, slots=True)
class CarriedBlock:
    """One block (``rows`` rows from ``start``) of a parent split, copied into the new one."""

    start: int
    rows: int
    samples: tuple[Sample, ...]  # this build's samples for those rows, in row order
    tally: dict[str, Any]  # the block's statistics and conversions (tallies JSON)


@dataclass(slots=True)
class CarryPlan:
    """What an incremental build copies and what it decodes."""

    parent: Parent
    blocks: dict[str, list[CarriedBlock]] = field(default_factory=dict)
    decode: Plan | None = None
    rate: float | None = None  # the parent's decode seconds per sample (``local_threads``)
    block: int = 1  # rows of one block (``plan_block``)
    redo: Redo | None = None  # the fields made again for the carried samples (changed code)

    @property
    def samples(self) -> int:
        return sum(b.rows for blocks in self.blocks.values() for b in blocks)

    @property
    def decoding(self) -> int:
        """Samples this build decodes: those not carried, and the carried ones again for
        the fields it makes again."""
        todo = self.decode.total if self.decode is not None else 0
        return todo + (self.samples if self.redo is not None else 0)

    def seed(self) -> Seed:
        """The rows the sink copies with its datasets (``parent_rows.Seed``): a split's first
        run of carried blocks, when it starts at row 0 and leaves at most one block of the
        parent's split out (the copy of a dataset is whole, then cut: more would be copied
        for nothing; the other runs are copied chunk by chunk)."""
        rows = {}
        for split, blocks in self.blocks.items():
            first = runs([(b.start, b.rows) for b in blocks])[:1]
            if first and first[0][0] == 0:
                left = len(self.parent.splits[split].keys) - first[0][1]
                rows[split] = first[0][1] if left <= self.block else 0
        return Seed(self.parent.path, rows, self.redo.columns if self.redo else frozenset())


def config_core(text: str) -> dict[str, Any]:
    """A stored config without the keys that change no stored byte (``VOLATILE_KEYS``)."""
    try:
        data = yaml_load.safe_load(text) or {}
    except (yaml.YAMLError, RecursionError):
        return {"unreadable": text}
    if not isinstance(data, dict):
        return {"unreadable": text}
    return {k: v for k, v in data.items() if k not in VOLATILE_KEYS}


def why_not(
    parent: Parent, record: Mapping[str, Any] | None, config: str, layout: LayoutRecord, plan: Plan
) -> str | None:
    """Why the parent cannot be carried from (None: it can, perhaps making some fields
    again: ``redone``)."""
    block = plan_block(plan)
    if record is None:
        return f"v{parent.version:04d} has no carry record beside it"
    if record.get("format") != FORMAT:
        return f"the carry record beside v{parent.version:04d} is of another h5etl"
    if record.get("fingerprint") != parent.fingerprint:
        return f"the carry record beside v{parent.version:04d} is not that release's"
    if record.get("block") != block:
        return "the chunk rows changed"
    changed = transform_changes(parent.layout, layout)
    if changed:  # the code that makes some fields' values: those are made again, or all
        problem = refused(fields_to_redo(changed, plan.kinds, plan.transforms), plan.kinds)
        if problem is not None:
            return "; ".join([*(f"{c.category} {c.where}" for c in changed.values()), problem])
    if bare_config(config_core(parent.config)) != bare_config(config_core(config)):
        return f"the config differs from v{parent.version:04d}'s in more than {VOLATILE_KEYS}"
    if bare_fields(parent.layout) != bare_fields(layout) or (
        parent.layout.template != layout.template
    ):
        return f"the fields are stored otherwise than in v{parent.version:04d}"
    return None


def redone(parent: Parent, layout: LayoutRecord, plan: Plan) -> frozenset[str]:
    """The fields a build carrying from ``parent`` makes again for every sample it carries
    (``redo.fields_to_redo``): their code changed, or the values they are made from."""
    changed = transform_changes(parent.layout, layout)
    return fields_to_redo(changed, plan.kinds, plan.transforms) if changed else frozenset()


def file_lineage(plan: Plan) -> bool:
    """Whether each lineage digest of the plan's samples is the SHA-256 of one source file,
    so that a touched file's bytes can be compared with it. A kind that reads its source
    itself (a DICOM folder, a recording's channels) digests what it read, which only
    decoding computes: a touched file of such a sample is decoded again, never hashed."""
    return not any(kind.reads_own_files for kind in plan.kinds)


def unchanged(
    sample: Sample,
    stamp: str,
    known: list[Any] | None,
    lineage: tuple[bytes, ...],
    *,
    hashable: bool = True,
) -> bool:
    """Whether a sample's stored rows are what decoding its files now would give;
    ``hashable``: its lineage digests are its files' own (``file_lineage``)."""
    state = sample_state(sample, stamp)
    if known is None or state[0] != known[0] or state[2] != known[2]:
        return False  # other files, or other plan values (a label, a table cell)
    if state[1] == known[1]:
        return True  # same sizes and mtimes: the fast pre-check
    if not hashable:
        return False
    try:
        digests = [hashlib.sha256(inputs.read_file(path)).hexdigest() for path in sample.paths]
    except (OSError, RejectError):
        # decoding will say what is wrong with it; a folder (a DICOM series, a recording)
        # has its kind's digest over the files it read, which only decoding computes
        return False
    return [d.encode() for d in digests] == [bytes(h) for h in lineage]


def _carried_blocks(
    old: ParentSplit,
    keys: Sequence[str],
    by_name: Mapping[str, Sample],
    block: int,
    known: Mapping[str, list[Any]],
    tallies: Sequence[dict[str, Any]],
    stamps: Mapping[str, str],
    hashable: bool = True,
) -> tuple[list[CarriedBlock], list[Sample]]:
    """The parent split's blocks whose every row is unchanged, and its other samples still
    in the inputs (to decode again), in its row order; ``keys``: each row's carry key."""
    blocks: list[CarriedBlock] = []
    waiting: list[Sample] = []
    if len(keys) != len(old.keys):
        keys, tallies = [], []  # a record of other rows: nothing of this split carries
    for b in range(min(-(-len(keys) // block), len(tallies))):
        rows = range(b * block, min((b + 1) * block, len(keys)))
        here = [by_name.get(keys[r]) for r in rows]
        if all(
            s is not None
            and unchanged(
                s, stamps[s.key], known.get(keys[r]), tuple(old.lineage[r]), hashable=hashable
            )
            for r, s in zip(rows, here, strict=True)
        ):
            chosen = tuple(s for s in here if s is not None)
            blocks.append(CarriedBlock(b * block, len(rows), chosen, tallies[b]))
        else:
            waiting.extend(s for s in here if s is not None)
    return blocks, waiting


def plan_carry(
    plan: Plan,
    parent: Parent,
    record: Mapping[str, Any],
    stamps: Mapping[str, str],
    block: int,
    redo: frozenset[str] = frozenset(),
) -> CarryPlan:
    """Split the plan into the parent blocks to copy and the plan of samples to decode;
    ``redo``: fields made again for the carried samples (their other fields copied)."""
    carry = CarryPlan(parent, rate=local_threads.per_sample_seconds(record), block=block)
    decode: dict[str, list[Sample]] = {}
    known: Mapping[str, list[Any]] = record.get("samples", {})
    tallies: Mapping[str, list[Any]] = record.get("blocks", {})
    keys: Mapping[str, list[str]] = record.get("rows", {})
    for split, members in plan.splits.items():
        by_name = {sample_carry_key(s): s for s in members}
        old = parent.splits.get(split)
        blocks, waiting = (
            ([], [])
            if old is None
            else _carried_blocks(
                old,
                keys.get(split, []),
                by_name,
                block,
                known,
                tallies.get(split, []),
                stamps,
                hashable=file_lineage(plan),
            )
        )
        taken = {s.key for b in blocks for s in b.samples} | {s.key for s in waiting}
        fresh = [s for s in members if s.key not in taken]  # in the plan's seeded order
        if blocks and blocks[-1].rows < block and (waiting or fresh):
            # a partial block (the parent split's last) must stay last: decoded again
            waiting.extend(blocks.pop().samples)
        carry.blocks[split] = blocks
        decode[split] = [*waiting, *fresh]
    digest = f"{plan.digest}+carry:{parent.version}:{parent.fingerprint}"
    carry.decode = dataclasses.replace(plan, splits=decode, digest=digest)
    if redo and carry.samples:
        carried = {
            split: [s for b in blocks for s in b.samples] for split, blocks in carry.blocks.items()
        }
        carry.redo = Redo.of(redo, plan, carried)
    logger.info("carrying %d samples from v%04d", carry.samples, parent.version)
    return carry


def decide(
    plan: Plan,
    parent: Parent,
    output: OutputFolder,
    config: str,
    layout: LayoutRecord,
    record: Mapping[str, Any] | None = None,
) -> tuple[CarryPlan | None, str | None]:
    """The carry plan from ``parent``, or None and why it cannot be carried from;
    ``record``: its carry record as this build read it already (else read here)."""
    if record is None:
        record = output.read_carry(parent.version)
    reason = why_not(parent, record, config, layout, plan)
    if reason is not None or record is None:
        return None, reason
    redo = redone(parent, layout, plan)
    return plan_carry(plan, parent, record, plan.stamps, plan_block(plan), redo), None


def facts(carried: CarryPlan, copied: int, stored: int) -> dict[str, Any]:
    """What the release records of its parent (``fileformat.PARENT_ATTR``)."""
    out = {
        "version": carried.parent.version,
        "source_fingerprint": carried.parent.fingerprint,
        "samples_reused": carried.samples,
        "bytes_reused": copied,
        "samples_decoded": stored - carried.samples,
    }
    if carried.redo is not None:
        out["fields_redone"] = sorted(carried.redo.fields)
    return out


def record_rows(samples: tuple[Sample, ...]) -> dict[str, list[str]]:
    """This build's sample keys of carried rows (its own keys and groups)."""
    from h5etl.format import contract as fileformat

    return {
        fileformat.SAMPLE_KEY: [s.split_name for s in samples],
        fileformat.SAMPLE_GROUP: [s.group for s in samples],
    }


def copy_into(
    sink: Sink,
    carried: CarryPlan,
    tallies: Tallies,
    log: BlockLog,
    between: Callable[[], None] = lambda: None,
) -> tuple[str, int]:
    """Copy every carried block into the new release (the sink writes); return the source
    fingerprint lines of the carried rows, in write order, and the stored bytes copied.
    ``between``: called now and then while chunks are copied (``Sink.copy_parent_rows``).
    With fields to make again (``carried.redo``), their columns are not copied and each
    block's tally waits for their new statistics (``Redo.hold``)."""
    lines: list[str] = []
    copied = 0
    redo = carried.redo
    skip = redo.columns if redo is not None else frozenset()
    for split, blocks in carried.blocks.items():
        samples = tuple(s for b in blocks for s in b.samples)
        spans = [(b.start, b.rows) for b in blocks]
        copied += sink.copy_parent_rows(
            carried.parent.path, split, spans, record_rows(samples), between, skip
        )
        lineage = carried.parent.splits[split].lineage
        for b in blocks:
            keys = [sample_carry_key(s) for s in b.samples]
            if redo is not None:
                redo.hold(split, b.tally, keys, tallies)
            else:
                tallies.add_block(split, b.tally)
                log.add(split, [b.tally], keys)
            # the stored S64 digests as text a block at a time (per digest: twice the time)
            digests = lineage[b.start : b.start + b.rows].astype(f"U{lineage.dtype.itemsize}")
            lines.extend(
                f"{sample.key}\t{','.join(hashes)}\n"
                for sample, hashes in zip(b.samples, digests.tolist(), strict=True)
            )
    return "".join(lines), copied
