"""release_notes: what a release says about itself: its notes, its parent, the change from it.

A build's parent is the release the link pointed at when the build started (the one whose
record also keeps the splits sticky). Before the file is published, the build diffs the
parent against the file as written (``h5etl.history.diff``) and stores the semantic label and its
reasons; a build without a parent is ``initial``. ``releases`` reads the story back
(``read_story``).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py

from h5etl.dataflow import Reject
from h5etl.errors import H5EtlError
from h5etl.format import contract as fileformat
from h5etl.history.build_report import Before
from h5etl.history.snapshot import SampleFacts, Snapshot, WrittenRows, plain

if TYPE_CHECKING:  # pydantic loads with the build, not with ``h5etl releases``
    from h5etl.config.spec import Spec

logger = logging.getLogger(__name__)

INITIAL = "initial"


def _roots(spec: Spec) -> list[tuple[str, str]]:
    """(absolute folder + sep, as the release stores it + "/" or ""), the deepest first:
    sources may nest, and all sit in the config's folder."""
    roots = [
        (str(source.dir), spec.stored_path(("sources", name, "dir"), source.dir))
        for name, source in spec.sources.items()
    ]
    if spec.config_file is not None:
        roots.append((str(spec.config_file.parent), ""))
    return sorted(
        ((root.rstrip(os.sep) + os.sep, to.rstrip("/") + "/" if to else "") for root, to in roots),
        key=lambda pair: len(pair[0]),
        reverse=True,
    )


def local_rejects(spec: Spec, rows: Sequence[Sequence[str]]) -> list[Reject]:
    """Rows of a release's ``/diagnostics/rejects`` as this build's rejects: their paths
    back under this project's folders (``stored_rejects`` undone), as a build reports them."""
    back = {to: root for root, to in _roots(spec) if to}
    config_folder = next((root for root, to in _roots(spec) if not to), "")
    # a stored folder where a path starts (not inside another path): one pass, longest first
    prefixes = sorted(back, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w/.-])(" + "|".join(map(re.escape, prefixes)) + ")")

    def local(text: str) -> str:
        return pattern.sub(lambda m: back[m.group(1)], text) if prefixes else text

    def local_path(path: str) -> str:
        found = local(path)
        if found == path and not os.path.isabs(path) and config_folder:
            return config_folder + path  # under the config's folder, stored relative to it
        return found

    out = []
    for row in rows:
        values = dict.fromkeys(fileformat.REJECT_COLUMNS, "")
        values.update(zip(fileformat.REJECT_COLUMNS, row, strict=False))
        path, detail = local_path(values["path"]), local(values["detail"])
        out.append(Reject(**{**values, "path": path, "detail": detail}))
    return out


def stored_rejects(spec: Spec, rejects: Sequence[Reject]) -> list[Reject]:
    """The rejects as the release stores them: paths under a source folder as the config
    wrote that folder (``raw/images/a.png``), others under the config's folder relative to
    it (a table named in a detail), in ``path`` and ``detail``, so the file does not depend
    on where the project lies (reproducible bytes); the report beside the release keeps the
    absolute paths."""
    shown = _roots(spec)

    def portable(text: str) -> str:
        for root, to in shown:
            text = text.replace(root, to)
        return text

    return [Reject(portable(r.path), r.stage, r.reason, portable(r.detail), r.key) for r in rejects]


def before_of(snapshot: Snapshot) -> Before:
    """A release as the loss guard compares a build with it: samples per split, and per
    class of each label field over all splits."""
    labels = [name for name, record in snapshot.layout.fields.items() if record.kind == "label"]
    classes: dict[str, Counter[str]] = {name: Counter() for name in labels}
    for fields in snapshot.classes.values():
        for name in labels:
            classes[name].update(fields.get(name, {}))
    counts = {split: snapshot.counts.get(split, 0) for split in snapshot.layout.splits}
    return Before(snapshot.version or 0, counts, {n: dict(c) for n, c in classes.items()})


def read_before(path: Path | None) -> Before | None:
    """The release at ``path`` (the link's, None: none) as ``before_of`` sees it; None when
    it cannot be read (the build then compares with nothing, as a first build)."""
    if path is None:
        return None
    from h5etl.history.snapshot import read_snapshot

    try:
        return before_of(read_snapshot(path))
    except H5EtlError as exc:
        logger.warning("cannot read the parent release (%s); no loss guard against it", exc)
        return None


def _rows(snapshot: Snapshot) -> dict[str, list[tuple[object, ...]]]:
    """Each split's samples in row order, as what identifies them: key, name, source digests."""
    out: dict[str, list[tuple[object, ...]]] = {split: [] for split in snapshot.layout.splits}

    def row(s: SampleFacts) -> tuple[object, ...]:
        return (s.key, s.filename, s.group, tuple(sorted(s.sources.items())))

    for sample in snapshot.samples:
        out.setdefault(sample.split, []).append(row(sample))
    return out


class Annotator:
    """What the sink calls on the finished file: the story attributes to add to it (kept in
    ``attrs`` for the build's summary)."""

    def __init__(self, parent: Path | None):
        self.parent = parent
        self.attrs: dict[str, Any] = {}
        self._before: Snapshot | H5EtlError | None = None  # the parent's, once read
        # the new file's samples as the sink appends them (the sink's ``on_rows``): no
        # label without a parent, so nothing to collect then
        self.rows: WrittenRows | None = None if parent is None else WrittenRows()
        self.same_rows = False  # the file stores the parent's samples, row for row

    def before(self) -> Before | None:
        """The parent as the loss guard compares with it; None without one (or unreadable)."""
        self.prepare()
        return before_of(self._before) if isinstance(self._before, Snapshot) else None

    def prepare(self) -> None:
        """Read the parent's snapshot now: a build waiting for its decoders has the time,
        which the finished file would otherwise wait for (0.03 s for 3,000 samples)."""
        if self.parent is not None and self._before is None:
            from h5etl.history.snapshot import read_snapshot

            try:
                self._before = read_snapshot(self.parent)
            except H5EtlError as exc:
                self._before = exc

    def __call__(self, handle: h5py.File) -> dict[str, Any]:
        self.attrs = self._attrs(handle)
        return self.attrs

    def line(self) -> str:
        """``minor (from v0001): 2 samples added``, for the build's summary."""
        label = self.attrs.get(fileformat.CHANGE_ATTR, "unknown")
        parent = self.attrs.get(fileformat.PARENT_VERSION_ATTR)
        summary = str(self.attrs.get(fileformat.CHANGE_SUMMARY_ATTR, ""))
        summary = summary.split(": ", 1)[-1] if summary.startswith(f"{label}: ") else summary
        after = f" (from v{parent:04d})" if isinstance(parent, int) else ""
        return f"{label}{after}: {summary}" if summary else f"{label}{after}"

    def _attrs(self, handle: h5py.File) -> dict[str, Any]:
        if self.parent is None:
            return {
                fileformat.CHANGE_ATTR: INITIAL,
                fileformat.CHANGE_SUMMARY_ATTR: "the first release of this name here",
            }
        from h5etl.history.diff import diff_releases
        from h5etl.history.snapshot import snapshot_of

        self.prepare()
        before = self._before
        if not isinstance(before, Snapshot):
            # the parent stays as it is; the new release just cannot say what changed
            logger.warning("cannot read the parent release (%s); no change label", before)
            return {fileformat.CHANGE_SUMMARY_ATTR: f"the parent {self.parent.name} is unreadable"}
        written = None if self.rows is None else self.rows.samples
        after = snapshot_of(handle, Path(handle.filename), written=written)
        change = diff_releases(before, after)
        # a row-by-row look only where the counts leave it open (an added sample's build
        # never pays it)
        self.same_rows = dict(before.counts) == dict(after.counts) and _rows(before) == _rows(after)
        out: dict[str, Any] = {
            fileformat.CHANGE_ATTR: change.label,
            fileformat.CHANGE_SUMMARY_ATTR: change.summary(),
            fileformat.PARENT_FINGERPRINT_ATTR: str(
                before.attrs.get(fileformat.FINGERPRINT_ATTR, "")
            ),
        }
        if before.version is not None:
            out[fileformat.PARENT_VERSION_ATTR] = before.version
        return out


@dataclass(frozen=True, slots=True)
class Story:
    """A release's story as ``releases`` shows it; empty strings where it says nothing."""

    created_at: str
    counts: dict[str, int]
    parent: int | None
    change: str
    summary: str
    notes: str
    problem: str = ""  # why the file could not be read


def read_story(path: Path) -> Story:
    """The story the release at ``path`` tells; never raises (an unreadable file says why)."""
    from h5etl.format.fileinfo import sample_counts

    try:
        with h5py.File(path, "r") as handle:
            attrs = {
                k: plain(handle.attrs[k])
                for k in (fileformat.CREATED_AT_ATTR, *fileformat.STORY_ATTRS)
                if k in handle.attrs
            }
            counts = sample_counts(handle)
    except (OSError, ValueError, KeyError) as exc:
        from h5etl.format.fileinfo import why_not_readable

        return Story("", {}, None, "", "", "", problem=why_not_readable(path, exc))
    parent = attrs.get(fileformat.PARENT_VERSION_ATTR)
    return Story(
        created_at=str(attrs.get(fileformat.CREATED_AT_ATTR, "")),
        counts=counts,
        parent=int(parent) if isinstance(parent, int) else None,
        change=str(attrs.get(fileformat.CHANGE_ATTR, "")),
        summary=str(attrs.get(fileformat.CHANGE_SUMMARY_ATTR, "")),
        notes=str(attrs.get(fileformat.NOTES_ATTR, "")),
    )
