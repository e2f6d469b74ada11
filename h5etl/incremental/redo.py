"""redo: an incremental build that makes only the fields whose transform changed (issue 28).

When the parent differs from this build only in the code or arguments of transforms, its
samples whose files are unchanged are carried as usual, but for the fields whose transform
digest changed (``transform_change``), and those whose value depends on one (a ``derive``
from it, every field of a sample-level call that sees it): those are made again for every
carried sample, by a decode of just them (``DecodeRecipe.narrowed``), written row for row
beside the copied columns (``Sink.write`` with ``only``). The carried blocks' tallies keep the
parent's statistics of the other fields and take the new ones of these, so statistics,
digests and the carry record are a full build's. A sample the new code rejects ends the
plan (``RedoRejected``): the build decodes every sample instead.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from h5etl.dataflow import BatchResult, Sample
from h5etl.decode.recipe import DecodeRecipe
from h5etl.format.contract import TRANSFORMS_KEY, LayoutRecord
from h5etl.history.changes import Change, transform_change
from h5etl.incremental.carry_record import BlockLog
from h5etl.kinds.base import Kind
from h5etl.kinds.columns import ArrayColumn
from h5etl.plan.result import Plan
from h5etl.plan.tasks import TaskCutter
from h5etl.stats.tallies import Tallies, block_json

if TYPE_CHECKING:
    from h5etl.sink.writer import Sink
    from h5etl.transforms.apply import Transforms


class RedoRejected(Exception):
    """The changed code rejected a carried sample: its other fields are in the file already,
    so this write is given up and every sample decoded (the message says)."""


def transform_changes(before: LayoutRecord, after: LayoutRecord) -> dict[str, Change]:
    """Per field in both records whose code differs (its transform digest), the change:
    ``transform changed (field, old -> new)``."""
    return {
        name: change
        for name, record in after.fields.items()
        if (old := before.fields.get(name)) is not None
        and (change := transform_change(name, old.extra, record.extra)) is not None
    }


def bare_fields(layout: LayoutRecord) -> dict[str, Any]:
    """The fields' records without what names their code (the transforms entry and a
    derive's call, which its transform digest covers): equal when only code changed."""
    out = {}
    for name, record in layout.fields.items():
        code = {TRANSFORMS_KEY, "call"} & set(record.extra)
        out[name] = {k: v for k, v in record.as_json().items() if k not in code}
    return out


def bare_config(core: Mapping[str, Any]) -> dict[str, Any]:
    """A config's core (``reuse.config_core``) without the transforms it names (the
    sample-level ``transforms``, each field's ``transform``, a derive's ``call`` and
    ``args``): their digests in the layout record tell what they change."""
    out = {k: v for k, v in core.items() if k != "transforms"}
    fields = out.get("fields")
    if isinstance(fields, dict):
        out["fields"] = {
            name: _bare_field(entry) if isinstance(entry, dict) else entry
            for name, entry in fields.items()
        }
    return out


def _bare_field(entry: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in entry.items() if k != "transform"}
    derive = out.get("derive")
    if isinstance(derive, dict):
        out["derive"] = {k: v for k, v in derive.items() if k not in ("call", "args")}
    return out


def _sample_groups(transforms: Transforms | None) -> list[set[str]]:
    return [set(step.fields) for step in transforms.sample_calls] if transforms else []


def _closed(start: set[str], grow: Callable[[set[str]], set[str]]) -> frozenset[str]:
    out = set(start)
    while (more := grow(out) - out) != set():
        out |= more
    return frozenset(out)


def fields_to_redo(
    changed: Mapping[str, Change], kinds: Sequence[Kind], transforms: Transforms | None
) -> frozenset[str]:
    """The fields whose stored values the changed code can change: those whose digest
    changed, each field that reads one's value (a derive), and each field a sample-level
    call sees with one of them, until nothing more is added."""
    groups = _sample_groups(transforms)

    def grow(found: set[str]) -> set[str]:
        readers = {k.name for k in kinds if set(k.reads_values_of) & found}
        return found | readers | {f for g in groups if g & found for f in g}

    return _closed(set(changed), grow)


def inputs_of(
    stored: frozenset[str], kinds: Sequence[Kind], transforms: Transforms | None
) -> tuple[frozenset[str], frozenset[str]]:
    """What making ``stored`` again needs: the fields computed (transformed: those, the
    values they read, the fields their sample-level calls see) and the fields decoded
    (those, and the pixels they check against, untransformed)."""
    by_name = {kind.name: kind for kind in kinds}
    groups = _sample_groups(transforms)

    def values(found: set[str]) -> set[str]:
        read = {d for n in found for d in by_name[n].reads_values_of}
        return found | read | {f for g in groups if g & found for f in g}

    def pixels(found: set[str]) -> set[str]:
        return found | {d for n in found for d in by_name[n].depends_on}

    computed = _closed(set(stored), values)
    return computed, _closed(set(computed), pixels)


def refused(stored: frozenset[str], kinds: Sequence[Kind]) -> str | None:
    """Why ``stored`` cannot be made again beside copied columns (None: it can): only fixed
    array columns are written apart from their samples' other rows."""
    for kind in kinds:
        if kind.name in stored and (
            kind.plan_side or not all(isinstance(c, ArrayColumn) for c in kind.columns.values())
        ):
            return f"field {kind.name} is not a fixed array, made again only with its samples"
    return None


@dataclass(slots=True)
class Redo:
    """The fields an incremental build makes again for the samples it carries, and the
    carried blocks' tallies waiting for their new statistics."""

    fields: frozenset[str]  # stored again
    computed: frozenset[str]
    decoded: frozenset[str]
    columns: frozenset[str]  # their array columns
    plan: Plan  # the carried samples, by split, in row order
    order: tuple[str, ...]  # every column, as a block tally lists its statistics
    pending: dict[str, deque[tuple[dict[str, Any], list[str]]]] = field(default_factory=dict)
    left: int = 0  # carried samples whose columns are still to come

    @classmethod
    def of(cls, stored: frozenset[str], plan: Plan, carried: Mapping[str, list[Sample]]) -> Redo:
        computed, decoded = inputs_of(stored, plan.kinds, plan.transforms)
        columns = frozenset(n for k in plan.kinds if k.name in stored for n in k.columns)
        samples = dataclasses.replace(plan, splits=dict(carried))
        total = sum(len(s) for s in carried.values())
        order = tuple(n for k in plan.kinds for n in k.columns)
        return cls(stored, computed, decoded, columns, samples, order, left=total)

    @classmethod
    def none(cls) -> Redo:
        """No field made again (``left`` is 0: no result is taken for one)."""
        empty = frozenset[str]()
        return cls(empty, empty, empty, empty, Plan({}, []), ())

    def cutter(self, block: int, sample_bytes: int) -> TaskCutter:
        """Tasks of the carried samples without reserves: each keeps exactly its samples."""
        return TaskCutter(self.plan, block, sample_bytes=sample_bytes, reserve=0)

    def recipe(self, recipe: DecodeRecipe) -> DecodeRecipe:
        """The build's recipe making only these fields (``DecodeRecipe.narrowed``)."""
        return recipe.narrowed(self.fields, self.computed, self.decoded)

    def hold(self, split: str, tally: dict[str, Any], keys: list[str], tallies: Tallies) -> None:
        """A carried block's tally: the other fields' part counts now, the block waits."""
        kept = {
            "stats": {n: s for n, s in tally.get("stats", {}).items() if n not in self.columns},
            "conversions": {
                n: c for n, c in tally.get("conversions", {}).items() if n not in self.fields
            },
        }
        tallies.add_block(split, kept)
        self.pending.setdefault(split, deque()).append((kept, keys))

    def consume(
        self,
        results: Iterator[BatchResult],
        sink: Sink,
        tallies: Tallies,
        log: BlockLog | None,
        done: Callable[[int], None],
    ) -> None:
        """Take the redo tasks' results, the first of ``results`` (``done``: told how many
        samples each settled, for progress)."""
        while self.left:
            assert log is not None  # a build that carries logs its blocks
            result = next(results)
            self.take(result, sink, tallies, log)
            done(result.accepted)

    def take(self, result: BatchResult, sink: Sink, tallies: Tallies, log: BlockLog) -> None:
        """Write a result of the redo tasks (their fields' rows only) and complete the
        tallies of the blocks it covers."""
        task = result.task
        if result.rejects:
            raise RedoRejected(
                f"the changed transform rejected a carried sample: {result.rejects[0].detail}"
            )
        # Without rejects a task defers only its tail (a partial block, the last task of a
        # round), which the next round decodes first: the rows stay in order. Anything else
        # would put rows out of place: the write is given up rather than the release wrong.
        if result.deferred != list(range(result.accepted, len(task.samples))):
            raise RedoRejected(f"a task of {task.split} deferred samples before others")
        sink.write(result, only=self.columns)
        self.left -= result.accepted
        waiting = self.pending[task.split]
        for block in result.blocks:
            kept, keys = waiting.popleft()
            new = block_json(block)
            made = {
                "stats": {n: s for n, s in new["stats"].items() if n in self.columns},
                "conversions": {n: c for n, c in new["conversions"].items() if n in self.fields},
            }
            tallies.add_block(task.split, made)
            stats = {**kept["stats"], **made["stats"]}
            merged = {
                "stats": {n: stats[n] for n in self.order if n in stats},
                "conversions": {**kept["conversions"], **made["conversions"]},
            }
            log.add(task.split, [merged], keys)
