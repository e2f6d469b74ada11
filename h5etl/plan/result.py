"""result: what planning produced, the ``Plan`` a build executes (samples per split in write
order, the rejects, the kinds, the split policy); ``admit`` makes it, every later stage reads it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from h5etl.dataflow import Reject, Sample
from h5etl.decode.probes import ProbeRules
from h5etl.inputs.urls import is_remote
from h5etl.kinds.base import Kind

if TYPE_CHECKING:
    from h5etl.transforms.apply import Transforms


@dataclass(frozen=True, slots=True)
class Plan:
    """Samples per split in write order; decode tasks are cut from it lazily.

    It holds discover's own ``Sample`` objects (no per-sample copies: a plan of millions of
    files lives in the single parent process for the whole build).
    """

    splits: dict[str, list[Sample]]
    rejects: list[Reject]
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (original key, new key)
    digest: str = ""  # SHA-256 of splits, keys, file names, probed sizes, file sizes and mtimes
    kinds: tuple[Kind, ...] = ()  # the fields' kinds, bound to the inputs (class names found)
    warnings: list[str] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=dict)  # how splits were assigned (JSON)
    stamps: dict[str, str] = field(default_factory=dict)  # key -> its files' sizes and mtimes
    probes: ProbeRules | None = None  # what a decode reject re-checks (h5etl.inputs.reasons)
    previous: Mapping[str, str] | None = None  # the parent's split of each name (sticky)
    transforms: Transforms | None = None  # the config's user code, for the workers (issue 28)

    @property
    def remote(self) -> bool:
        """Whether a source is on object storage (its tasks then carry their stamps)."""
        first = next((samples[0] for samples in self.splits.values() if samples), None)
        return first is not None and any(is_remote(root) for _, root in first.roots)

    @property
    def total(self) -> int:
        return sum(len(samples) for samples in self.splits.values())

    def fingerprint(self) -> str:
        """What a resume must find unchanged: splits, keys, files, their sizes and mtimes,
        and the code of the user's transforms (an edit of a module beside the config leaves
        the config as it was, but not what its samples become)."""
        if self.transforms is None:
            return self.digest
        from h5etl.transforms.identity import field_digests

        code = hashlib.sha256(json.dumps(field_digests(self.transforms), sort_keys=True).encode())
        return f"{self.digest}+transforms:{code.hexdigest()}"
