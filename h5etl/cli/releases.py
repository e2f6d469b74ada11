"""The commands over published releases: ``releases``, ``rollback``, ``diff``, ``prune``,
``report``.

Registered on the one app (``h5etl.cli.common``); each parses, calls one library function
and renders what it returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from h5etl.cli.common import app, run, say
from h5etl.remote.location import is_url
from h5etl.units import human_size

if TYPE_CHECKING:
    from h5etl.history.changes import Change, ReleaseDiff
    from h5etl.history.diff_rejects import RejectChange
    from h5etl.release.naming import ReleaseInfo
    from h5etl.release.prune import PrunePlan

SHOWN_SAMPLES = 20  # per kind of sample change in the text output; --json lists them all


@app.command()
def releases(
    where: Annotated[
        str,
        typer.Argument(metavar="FOLDER", help="An output folder, e.g. releases, or an s3:// URL."),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per release, a list.")
    ] = False,
) -> None:
    """List the releases in FOLDER: size, creation time, samples, parent, change, notes."""
    from h5etl.format import fileinfo
    from h5etl.history.release_notes import read_story
    from h5etl.release import listing as release

    if is_url(where):
        _remote_releases(where, as_json=as_json)
        return
    folder = Path(where)
    found = run(lambda: release.list_releases(folder))
    if as_json:
        import json

        say(json.dumps([_release_json(info) for info in found], indent=1, ensure_ascii=False))
        return
    if not found:
        say(f"{folder}: no releases")
    for info in found:
        mark = "*" if info.current else " "
        story = read_story(info.path)
        held = fileinfo.contents(info.path)  # from the layout record the release carries
        created = story.created_at or info.modified
        say(f"{mark} {info.path.name}  {human_size(info.size):>10}  {created}  {held}")
        told = []
        if story.change:
            parent = f" from v{story.parent:04d}" if story.parent is not None else ""
            summary = story.summary.removeprefix(f"{story.change}: ")
            told.append(f"{story.change}{parent}: {summary}" if summary else story.change)
        if story.notes:
            told.append(f"notes: {' '.join(story.notes.split())}")
        if told:
            say(f"    {'; '.join(told)}")


def _remote_releases(where: str, *, as_json: bool) -> None:
    """``releases`` of an s3:// folder: the uploaded versions, the pointed-at one marked."""
    from h5etl.release import remote_catalog
    from h5etl.remote.location import parse_location

    found = run(lambda: remote_catalog.releases(parse_location(where)))
    if as_json:
        import json

        shown = [
            {"name": r.name, "version": r.version, "url": r.url, "current": r.current,
             "size": r.size}
            for r in found
        ]  # fmt: skip
        say(json.dumps(shown, indent=1))
        return
    if not found:
        say(f"{where}: no releases")
    for entry in found:
        mark = "*" if entry.current else " "
        say(f"{mark} {entry.url.rsplit('/', 1)[-1]}  {human_size(entry.size):>10}  {entry.url}")


def _release_json(info: ReleaseInfo) -> dict[str, Any]:
    """What ``releases`` shows of one release, for scripts (``ReleaseInfo`` and its story)."""
    from h5etl.format import fileinfo
    from h5etl.history.release_notes import read_story

    story = read_story(info.path)
    return {
        "name": info.name,
        "version": info.version,
        "path": str(info.path),
        "current": info.current,
        "size": info.size,
        "created_at": story.created_at or info.modified,
        "samples": story.counts,
        "fields": fileinfo.field_kinds(info.path),
        "parent": story.parent,
        "change": story.change or None,
        "summary": story.summary or None,
        "notes": story.notes or None,
        "problem": story.problem or None,
    }


@app.command()
def rollback(
    link: Annotated[
        str,
        typer.Argument(
            metavar="LINK",
            help="The release link, e.g. releases/cells.h5 or s3://bucket/releases/cells.h5.",
        ),
    ],
    to: Annotated[
        int | None,
        typer.Option("--to", metavar="N", help="Version number (default: the previous one)."),
    ] = None,
) -> None:
    """Point LINK at an earlier (or any) release."""
    from h5etl.release import listing as release

    if is_url(link):
        from h5etl.release import remote_catalog
        from h5etl.remote.location import parse_location

        pointer = run(lambda: remote_catalog.roll_back(parse_location(link), to))
        say(f"{link} -> {pointer.file}")
        return
    info = run(lambda: release.rollback(Path(link), to))
    say(f"{link} -> {info.path.name}")


@app.command()
def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="A release file or link (or URL).")],
    b: Annotated[str, typer.Argument(metavar="B", help="Another release file or link.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the releases differ.")
    ] = False,
) -> None:
    """Show what changed from release A to release B: layout, attributes, samples, classes."""
    from h5etl.history.diff import diff_paths

    found = run(lambda: diff_paths(release_path(a), release_path(b)))
    if as_json:
        import json

        say(json.dumps(found.as_json(), indent=1, ensure_ascii=False))
    else:
        for line in diff_lines(found):
            say(line)
    if exit_code and not found.empty:
        raise typer.Exit(1)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else repr(value[:77] + "...")
    import json  # here, not on every start of the command line (also --version, --help)

    return json.dumps(value, ensure_ascii=False)


def _change_line(change: Change) -> str:
    if change.category == "transform":  # its digests are in where already
        return f"  transform {change.where}"
    if change.before is None:
        return f"  + {change.where}: {_shown(change.after)}"
    if change.after is None:
        return f"  - {change.where}: {_shown(change.before)}"
    return f"  {change.where}: {_shown(change.before)} -> {_shown(change.after)}"


def _side(snapshot: Any) -> str:
    version = f" v{snapshot.version:04d}" if snapshot.version is not None else ""
    notes = " ".join(str(snapshot.attrs.get("notes", "")).split())
    told = f"; notes: {notes}" if notes else ""
    return f"{snapshot.path} ({snapshot.name}{version}, {snapshot.created_at or 'no date'}{told})"


def diff_lines(found: ReleaseDiff) -> list[str]:
    """The diff as text: one section per kind of change, only those that have any."""
    lines = [f"a: {_side(found.a)}", f"b: {_side(found.b)}"]
    lines += [f"note: {note}" for note in found.notes]
    if found.empty:
        return [*lines, "no differences"]
    for title, changes in (
        ("layout", found.layout),
        ("attributes", found.attrs),
        ("config (as stored in the release)", found.config),
    ):
        if changes:
            lines += [f"{title}:", *(_change_line(c) for c in changes)]
    counts = []
    for split, (was, now) in found.counts.items():
        delta = f" ({now - was:+d})" if was is not None and now is not None and now != was else ""
        counts.append(f"{split} {_count(was)} -> {_count(now)}{delta}")
    lines.append(f"samples per split: {', '.join(counts)}")
    lines += _sample_lines(found)
    lines += _reject_lines(found)
    if found.classes:
        lines.append("classes (samples per label class, pixels per mask value):")
        lines += [
            f"  {c.where}: {c.before} -> {c.after} ({c.after - c.before:+d})" for c in found.classes
        ]
    lines.append(f"change: {found.summary()}")
    return lines


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _reject_lines(found: ReleaseDiff) -> list[str]:
    """The rejects section: what was fixed (with the reason it had), newly rejected (with its
    reason), rejected for another reason, or cleared; nothing when neither rejects a file."""
    rejects = found.rejects
    if rejects is None or (rejects.empty and not any(rejects.counts)):
        return []
    before, after = rejects.counts
    if rejects.empty:
        return [f"rejects: {before} -> {after} files, the same inputs for the same reasons"]
    tally = ", ".join(f"{len(items)} {kind}" for kind, items in rejects.kinds() if items)
    lines = [f"rejects: {before} -> {after} files; {tally}"]
    for kind, changes in rejects.kinds():
        lines += [f"  {kind}: {_reject_change(kind, c)}" for c in changes[:SHOWN_SAMPLES]]
        if len(changes) > SHOWN_SAMPLES:
            lines.append(f"  ... {len(changes) - SHOWN_SAMPLES} more {kind} (--json lists all)")
    return lines


def _reject_change(kind: str, change: RejectChange) -> str:
    where = f"{change.path}: {change.detail}" if change.detail else change.path
    if kind == "fixed":
        return f"{change.key} (now in {change.split}): was {change.before}: {where}"
    if kind == "cleared":
        return f"{change.key}: was {change.before}: {where} (neither stored nor rejected now)"
    if kind == "another reason":
        return f"{change.key}: {change.before} -> {change.after}: {where}"
    stored = f" (was in {change.split})" if change.split else ""
    return f"{change.key}: {change.after}: {where}{stored}"


def _sample_lines(found: ReleaseDiff) -> list[str]:
    kinds = (
        ("added", [f"{s.key} ({s.split})" for s in found.added]),
        ("removed", [f"{s.key} ({s.split})" for s in found.removed]),
        ("changed", [f"{s.key} ({s.split}): {', '.join(s.what)}" for s in found.changed]),
        ("moved", [f"{m.key}: {m.before} -> {m.after}" for m in found.moved]),
        ("regrouped", [f"{m.key}: {m.before!r} -> {m.after!r}" for m in found.regrouped]),
    )
    tally = ", ".join(f"{len(items)} {kind}" for kind, items in kinds if items)
    lines = [f"samples: {tally or 'the same'}"]
    for kind, items in kinds:
        lines += [f"  {kind}: {item}" for item in items[:SHOWN_SAMPLES]]
        if len(items) > SHOWN_SAMPLES:
            lines.append(f"  ... {len(items) - SHOWN_SAMPLES} more {kind} (--json lists all)")
    if found.reordered:
        lines.append(f"  write order changed in: {', '.join(found.reordered)}")
    return lines


@app.command()
def prune(
    folder: Annotated[
        str,
        typer.Argument(metavar="FOLDER", help="An output folder, e.g. releases, or an s3:// URL."),
    ],
    keep: Annotated[
        int, typer.Option("--keep", min=1, metavar="N", help="Newest releases to keep per name.")
    ],
    yes: Annotated[bool, typer.Option("--yes", help="Delete (without it: a dry run).")] = False,
) -> None:
    """Delete all but the N newest releases of each name; never the one the link points at."""
    from h5etl.release.prune import prune as plan_prune

    if is_url(folder):
        _remote_prune(folder, keep, apply=yes)
        return
    plan = run(lambda: plan_prune(Path(folder), keep=keep, apply=yes))
    for line in prune_lines(plan):
        say(line)


def _remote_prune(folder: str, keep: int, *, apply: bool) -> None:
    from h5etl.release import remote_catalog
    from h5etl.remote.location import parse_location

    plan = run(lambda: remote_catalog.prune(parse_location(folder), keep=keep, apply=apply))
    gone = [entry for entry in plan if not entry.kept]
    for entry in plan:
        filename = entry.url.rsplit("/", 1)[-1]
        if entry.kept:
            say(f"keep    {filename}  ({entry.kept})")
        else:
            verb = "deleted" if apply else "delete"
            say(f"{verb:<7} {filename} + its reports  {human_size(entry.size)}")
    size = human_size(sum(entry.size for entry in gone))
    if apply:
        say(f"deleted {len(gone)} releases, {size} freed")
    elif gone:
        say(f"dry run: {len(gone)} releases ({size}) would be deleted; --yes deletes them")
    else:
        say("nothing to delete")


def release_path(where: str) -> Path:
    """A release argument as a local file: a URL's release downloaded (once) and checked."""
    if not is_url(where):
        return Path(where)
    from h5etl.release import remote_catalog
    from h5etl.remote.location import parse_location

    return run(lambda: remote_catalog.local_copy(parse_location(where)))


def prune_lines(plan: PrunePlan) -> list[str]:
    lines = []
    for entry in plan.entries:
        name = entry.files[0].name if entry.files else f"v{entry.version:04d}"
        if entry.kept:
            lines.append(f"keep    {name}  ({entry.kept})")
        else:
            verb = "deleted" if plan.applied else "delete"
            extra = "".join(f" + {path.name}" for path in entry.files[1:])
            held = ", ".join(path.name for path in entry.held)
            kept = f"  (keeps {held}: a release that stays maps it)" if held else ""
            lines.append(f"{verb:<7} {name}{extra}  {human_size(entry.size)}{kept}")
    count, size = len(plan.removed), human_size(plan.freed)
    if plan.applied:
        lines.append(f"deleted {count} releases, {size} freed")
    elif count:
        lines.append(f"dry run: {count} releases ({size}) would be deleted; --yes deletes them")
    else:
        lines.append("nothing to delete")
    return lines


__all__ = ["diff", "diff_lines", "prune", "prune_lines", "releases", "report", "rollback"]


@app.command()
def report(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="RELEASE", help="A release file, its link, or a folder of releases."
        ),
    ],
    html: Annotated[Path, typer.Option("--html", metavar="OUT", help="The HTML page to write.")],
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="Which release of a folder (its name)."),
    ] = None,
    n: Annotated[
        int, typer.Option("--n", min=1, metavar="N", help="Samples per split in the previews.")
    ] = 16,
) -> None:
    """Write one self-contained HTML page explaining RELEASE: layout, splits, classes,
    statistics, previews, rejects and lineage (no server, no network needed to view it)."""
    from h5etl.report_html import write_html_report

    written = run(lambda: write_html_report(path, html, name=name, shown=n))
    say(f"report: {written}")
