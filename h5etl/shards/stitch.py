"""stitch: the committed shards of a build, carried into the release file as a resume start.

``Shards`` is what the committer (``h5etl.shards.committer``) hands the build once every shard
writer committed: ``restore`` copies each shard's compressed chunks into the sink in write
order (``chunk_copy.carry_shard``, no recompression, each chunk's SHA-256 checked)
and journals them, and ``queues`` is the task cutter's state from which the tail is cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h5etl.dataflow import Reject
from h5etl.errors import ShardError
from h5etl.format import partfiles
from h5etl.release.folder import OutputFolder
from h5etl.resume.journal_use import Checkpoints, Restored
from h5etl.shards import writers as shards
from h5etl.sink import chunk_copy
from h5etl.sink.writer import Sink
from h5etl.stats.tallies import Tallies

__all__ = ["Shards"]


@dataclass(slots=True)
class Shards:
    """The committed shards of a build, in write order, as a ``resume.Start``."""

    files: list[tuple[Path, dict[str, Any]]]  # (shard file, manifest)
    splits: tuple[str, ...]
    geometry: list[int]
    sizes: dict[str, int]  # samples per split in the plan
    ident: str
    reused: int = 0  # shards a killed build had committed
    _queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A virtual release: the tail as one more part, and the names the parts are published as
    tail: tuple[Path, dict[str, Any]] | None = None
    part_names: list[str] = field(default_factory=list)
    tail_job: shards.ShardJob | None = None

    @property
    def virtual(self) -> bool:
        return bool(self.part_names)

    @property
    def parts(self) -> list[Path]:
        """The files a virtual release maps onto, in write order (the shards, the tail)."""
        return [path for path, _ in self._parts()]

    def part_record(self) -> str:
        """The parts as the release records them (``partfiles.record``)."""
        named = zip(self.part_names, self._parts(), strict=True)
        return partfiles.record([(name, path, manifest) for name, (path, manifest) in named])

    def _parts(self) -> list[tuple[Path, dict[str, Any]]]:
        return [*self.files, *([self.tail] if self.tail is not None else [])]

    def _entries(self) -> list[dict[str, Any]]:
        """Every task decoded so far, as one writer would have consumed them: the first round
        split by split, each split's tasks in shard order; then the tail's, in its order."""
        first = [
            entry
            for split in self.splits
            for _, manifest in self.files
            for entry in manifest["tasks"]
            if entry["split"] == split
        ]
        return first + (self.tail[1]["tasks"] if self.tail is not None else [])

    @property
    def queues(self) -> dict[str, dict[str, Any]]:
        """The task cutter's state after the first round: the tail is cut from here."""
        if not self._queues:
            deferred: dict[str, list[int]] = {split: [] for split in self.splits}
            for entry in self._entries():
                deferred[entry["split"]].extend(entry["deferred"])
            self._queues = {
                split: {
                    "consumed": self.sizes[split],
                    "deferred": deferred[split],
                    "rounds": [self.sizes[split]],
                    "cut": self.geometry,
                }
                for split in self.splits
            }
        return self._queues

    def tallies(self) -> Tallies:
        total = Tallies()
        for _, manifest in self._parts():
            total.merge(Tallies.restored(manifest["tallies"]))
        return total

    def restore(self, sink: Sink, checkpoints: Checkpoints) -> Restored:
        """The stitch: carry every shard into ``sink``, checked, and journal it at once.

        Raises:
            ShardError: a shard does not hold what it committed; its commit is withdrawn, so
                the next ``--resume`` writes it again.
        """
        for index, (path, manifest) in enumerate(self._parts()):
            try:
                chunk_copy.carry_shard(
                    sink,
                    path,
                    manifest["rows"],
                    shards.chunk_digests(manifest),
                    part=self.part_names[index] if self.virtual else None,
                )
            except ShardError as exc:
                OutputFolder.manifest_of(path).unlink(missing_ok=True)
                raise ShardError(
                    f"{exc.message}; its commit was withdrawn: build again with --resume to "
                    f"write it anew and reuse the others",
                    path=path,
                ) from exc
        entries = self._entries()
        lines = [line for entry in entries for line in entry["fingerprint"]]
        rejects = [Reject(**r) for entry in entries for r in entry["rejects"]]
        if self.virtual:  # no journal: a resume could not redo the mapping; the shards stay
            checkpoints.fingerprint, checkpoints.rejects = [], []
        else:
            checkpoints.seed_with(list(lines), list(rejects), sink)
        seconds = [manifest["seconds"] for _, manifest in self._parts()]
        return Restored(
            len(lines),
            rejects,
            "".join(lines),
            resumed=False,
            stage="map" if self.virtual else "stitch",
            worker_seconds=float(sum(s["workers"] for s in seconds)),
            writer_seconds=float(sum(s["writer"] for s in seconds)),
        )
