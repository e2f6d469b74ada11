"""carry_record: what a release leaves beside it for the build after it, and how it names samples.

The carry record (``.<release>.carry.json``, written by ``h5etl.release.folder``) keeps each
sample's files, their stamps and plan-time values (``sample_state``) by carry key, each split's
block tallies and the carry keys of its rows in row order (``BlockLog``), and the decode rate.
``h5etl.incremental.reuse`` reads it to decide what the next build copies.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from h5etl.dataflow import BatchResult, Sample, text_bytes, valid_text
from h5etl.decode.worker_memory import collecting_less
from h5etl.execute import local_threads
from h5etl.format.contract import SAMPLE_KEY
from h5etl.plan.result import Plan
from h5etl.release.folder import OutputFolder

_WINDOW_SEPARATOR = "\x1f"  # between a recording's split name and its window's key
FORMAT = 2  # of the carry record (2: each row's carry key, for windows)


def carry_key(split_name: str, key: str) -> str:
    """What the carry record knows a sample by: its split name, unique but for the windows
    of one recording (and renamed keys), which add their own key."""
    return split_name if key == split_name else f"{split_name}{_WINDOW_SEPARATOR}{key}"


def sample_carry_key(sample: Sample) -> str:
    """A planned sample's carry key (``carry_key`` of its split name and key)."""
    return carry_key(valid_text(sample.split_name), sample.key)


def split_name_of(key: str) -> str:
    """The split name a carry key starts with (a recording's, for its windows)."""
    return key.split(_WINDOW_SEPARATOR, 1)[0]


def with_stamps(record: Mapping[str, Any], stamps: Mapping[str, str]) -> dict[str, Any]:
    """The carry record with new stamps for some of its samples (by carry key): files that
    were touched but hold the same bytes, so the next build need not hash them again."""
    samples = {key: list(state) for key, state in record.get("samples", {}).items()}
    for key, stamp in stamps.items():
        samples[key][1] = stamp  # sample_state: [files, stamp, plan values]
    return {**record, "samples": samples}


def rejected_state(entry: Sequence[Any]) -> tuple[list[Any], list[tuple[str, ...]]]:
    """A ``rejected`` entry of the record: the sample's state and its stored reject rows."""
    return list(entry[:3]), [tuple(row) for row in entry[3]]


def row_keys(result: BatchResult) -> list[str]:
    """The carry keys of a result's stored rows, in row order."""
    names = result.columns[SAMPLE_KEY]
    assert isinstance(names, list)
    return [carry_key(valid_text(str(n)), k) for n, k in zip(names, result.keys, strict=True)]


def _extras_digest(extras: tuple[Any, ...]) -> str:
    return hashlib.sha256(text_bytes(repr(extras))).hexdigest()


_NO_EXTRAS = _extras_digest(())  # most samples' (no plan-side field): computed once


def sample_state(sample: Sample, stamp: str) -> list[Any]:
    """What the carry record keeps of a sample: its files, their stamps, its plan values."""
    extras = _extras_digest(sample.extras) if sample.extras else _NO_EXTRAS
    return [list(sample.relpaths), stamp, extras]


def plan_block(plan: Plan) -> int:
    """Rows of one block: a whole chunk of every array field (``Spec.batch_samples``); a
    ragged column's values are cut in chunks of value rows, not of samples (``parent_rows``)."""
    from h5etl.kinds.columns import ArrayColumn

    rows = [
        c.layout.rows for k in plan.kinds for c in k.columns.values() if isinstance(c, ArrayColumn)
    ]
    return math.lcm(*rows) if rows else 1


def leave_record(
    output: OutputFolder,
    plan: Plan,
    version: int,
    fingerprint: str,
    log: BlockLog,
    *,
    rejected: Mapping[str, list[Any]] | None = None,
    inherited: float | None = None,
) -> None:
    """Write the carry record of release ``version`` beside it, for the build after it;
    ``rejected``: the samples it rejected while decoding (``h5etl.incremental.uptodate``);
    ``inherited``: the parent's decode seconds per sample, kept when this build decoded none."""
    # A dict of a few objects per sample, none in a cycle: young collections while it
    # grows escalated to full ones over the whole heap (a build from object storage holds
    # botocore's models and the listing), 70 of the 80 ms at 3,000 samples from s3rver.
    with collecting_less():
        record = record_of(
            plan, version=version, fingerprint=fingerprint, block=plan_block(plan), log=log
        )
    record["rejected"] = dict(rejected or {})
    rate = local_threads.rate_of(log.samples_decoded, log.decode_seconds, inherited)
    if rate is not None:
        record[local_threads.RATE_KEY] = rate
    output.write_carry(version, record)


@dataclass(slots=True)
class BlockLog:
    """Each split's block tallies and rows' carry keys in row order, for the carry record of
    the new release."""

    blocks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rows: dict[str, list[str]] = field(default_factory=dict)
    samples_decoded: int = 0  # stored or rejected by the decoders (not carried)
    decode_seconds: float = 0.0  # what they took there

    def add(self, split: str, tallies: list[dict[str, Any]], keys: list[str]) -> None:
        self.blocks.setdefault(split, []).extend(tallies)
        self.rows.setdefault(split, []).extend(keys)

    def decoded(self, samples: int, seconds: float) -> None:
        self.samples_decoded += samples
        self.decode_seconds += seconds


def record_of(
    plan: Plan, *, version: int, fingerprint: str, block: int, log: BlockLog
) -> dict[str, Any]:
    """The carry record a release leaves for the build after it (see ``why_not``)."""
    samples = {
        sample_carry_key(sample): sample_state(sample, plan.stamps[sample.key])
        for members in plan.splits.values()
        for sample in members
    }
    return {
        "format": FORMAT,
        "version": version,
        "fingerprint": fingerprint,
        "block": block,
        "samples": samples,
        "blocks": log.blocks,
        "rows": log.rows,
    }
