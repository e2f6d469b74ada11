"""page: the report's HTML, one section per question a reader of a release asks.

Sections carry stable ids (``SECTIONS``), so the page can be linked into and tests find
them. Every value from the file passes through ``markup.tag`` (escaped); numbers are shown
in full (counts with thousands separators, statistics to six significant digits).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping

from h5etl._version import __version__
from h5etl.report_html.facts import ReleaseFacts
from h5etl.report_html.markup import STYLE, Markup, join, png_uri, table, tag
from h5etl.units import human_size

__all__ = ["SECTIONS", "render"]

SECTIONS = {
    "summary": "Summary",
    "splits": "Splits and classes",
    "layout": "Layout",
    "statistics": "Normalisation statistics",
    "previews": "Previews",
    "rejects": "Rejects",
    "lineage": "Lineage",
}
MAX_REJECT_ROWS = 2000  # beyond this the page grows slow; the rejects report lists them all


def render(facts: ReleaseFacts) -> str:
    """The whole page, as one self-contained HTML document."""
    snap = facts.snapshot
    title = f"{snap.name} v{snap.version:04d}" if snap.version is not None else snap.name
    nav = tag("nav", *(tag("a", label, href=f"#{key}") for key, label in SECTIONS.items()))
    body = join(
        [
            tag("h1", title),
            tag("p", f"{facts.path} · created {snap.created_at or '?'}", class_="sub"),
            nav,
            _section("summary", _summary(facts)),
            _section("splits", _splits(facts)),
            _section("layout", _layout(facts)),
            _section("statistics", _statistics(facts)),
            _section("previews", _previews(facts)),
            _section("rejects", _rejects(facts)),
            _section("lineage", _lineage(facts)),
            tag("p", f"written by h5etl report {__version__}", class_="note"),
        ]
    )
    head = join(
        [
            tag("meta", charset="utf-8"),
            tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
            tag("title", f"{title} · h5etl release report"),
            tag("style", STYLE),
        ]
    )
    return f"<!DOCTYPE html>\n{tag('html', tag('head', head), tag('body', body), lang='en')}\n"


def _section(key: str, content: Markup) -> Markup:
    return tag("section", tag("h2", SECTIONS[key]), content, id=key)


def _count(value: int) -> str:
    return f"{value:,}"


def _number(value: float) -> str:
    return f"{value:.6g}"


def _summary(facts: ReleaseFacts) -> Markup:
    snap, check = facts.snapshot, facts.check
    rejects = len(snap.rejects) if snap.rejects is not None else None
    verdict = tag("span", check.summary, class_="ok" if check.ok else "bad")
    rows: list[list[object]] = [
        ["release file", facts.file.name],
        ["samples", _count(sum(snap.counts.values()))],
        ["splits", ", ".join(f"{s} {_count(n)}" for s, n in snap.counts.items())],
        ["fields", ", ".join(f"{n} ({f.kind})" for n, f in snap.layout.fields.items())],
        ["rejected inputs", "not recorded" if rejects is None else _count(rejects)],
        ["h5etl check", verdict],
    ]
    if snap.attrs.get("description"):
        rows.insert(0, ["description", snap.attrs["description"]])
    found = [tag("li", f"PROBLEM {p}") for p in check.problems]
    found += [tag("li", f"WARNING {w}") for w in check.warnings]
    return join([table([], rows), tag("ul", *found) if found else ""])


def _splits(facts: ReleaseFacts) -> Markup:
    snap = facts.snapshot
    parts = [table(["split", "samples"], ([s, _count(n)] for s, n in snap.counts.items()))]
    named = sorted({name for per in snap.classes.values() for name in per})
    for name in named:
        kind = snap.layout.fields[name].kind if name in snap.layout.fields else ""
        what = "samples per class" if kind == "label" else "pixels (voxels) per value"
        parts += [tag("h3", f"{name}: {what}"), _histogram(facts, name, kind)]
    if not named:
        parts.append(tag("p", "no label or mask field: no class histogram", class_="note"))
    return join(parts)


def _histogram(facts: ReleaseFacts, name: str, kind: str) -> Markup:
    """A row per class (value), a column per split: its count, share and a bar."""
    splits = list(facts.snapshot.classes)
    per = {split: facts.snapshot.classes[split].get(name, {}) for split in splits}
    totals = {split: sum(counts.values()) or 1 for split, counts in per.items()}
    values = list(dict.fromkeys(v for counts in per.values() for v in counts))
    rows = []
    for value in values:
        cells: list[object] = [value]
        for split in splits:
            n = per[split].get(value, 0)
            share = 100 * n / totals[split]
            bar = tag("span", "", class_="bar", style=f"width:{round(share)}px")
            cells.append(join([bar, f"{_count(n)} ({share:.1f}%)"]))
        rows.append(cells)
    return table(["class" if kind == "label" else "value", *splits], rows)


def _layout(facts: ReleaseFacts) -> Markup:
    layout = facts.snapshot.layout
    head = ["dataset", "field", "kind", "column", "shape", "dtype", "chunks", "codecs", "stored"]
    rows = []
    for c in facts.columns:
        ratio = f", ratio {c.raw / c.stored:.2f}" if c.raw and c.stored else ""
        chunks = "contiguous" if c.chunks is None else str(c.chunks)
        rows.append(
            [
                c.path,
                c.field,
                c.kind,
                c.column,
                str(c.shape),
                c.dtype,
                chunks,
                ", ".join(c.codecs) or "none",
                human_size(c.stored) + ratio,
            ]
        )
    note = (
        "no layout record (an older release): fields read from its groups and config"
        if layout.inferred
        else f"path template {layout.template!r}; a ragged column keeps its rows' offsets "
        "beside it (<dataset>_offsets)"
    )
    readable = [line for line in facts.check.lines if line.startswith("readable by")]
    return join([tag("p", note, class_="note"), table(head, rows), *map(_para, readable)])


def _para(line: str) -> Markup:
    return tag("p", line)


def _statistics(facts: ReleaseFacts) -> Markup:
    head = ["dataset", "split", "channel", "mean", "std", "min", "max", "count"]
    rows = []
    for stat in facts.stats:
        for channel, values in enumerate(stat.rows):
            numbers = [values.get(k) for k in ("mean", "std", "min", "max")]
            count = values.get("count")
            rows.append(
                [
                    stat.name,
                    stat.split,
                    channel,
                    *("" if v is None else _number(v) for v in numbers),
                    "" if count is None else _count(int(count)),
                ]
            )
    if not rows:
        return tag("p", "the release stores no statistics", class_="note")
    note = "per channel, over the stored unpadded values (float64); normalise with mean and std"
    return join([tag("p", note, class_="note"), table(head, rows, class_="num")])


def _previews(facts: ReleaseFacts) -> Markup:
    parts = []
    for preview in facts.previews:
        if preview.picture is None:
            parts.append(tag("h3", preview.split))
            parts.append(tag("p", preview.note, class_="note"))
            continue
        image = tag(
            "img",
            src=png_uri(preview.picture),
            alt=f"preview of split {preview.split}",
            width=preview.picture.width,
            height=preview.picture.height,
        )
        caption = tag("figcaption", f"split {preview.split}: the first samples in stored order")
        parts.append(tag("figure", tag("h3", preview.split), image, caption))
    return join(parts)


def _rejects(facts: ReleaseFacts) -> Markup:
    rejects = facts.snapshot.rejects
    if rejects is None:
        return tag("p", "this release stores no rejects table (built before 0.2)", class_="note")
    if not rejects:
        return tag("p", "no input was rejected", class_="note")
    reasons = Counter(r.reason for r in rejects)
    parts = [
        table(["reason", "files"], ([r, _count(n)] for r, n in sorted(reasons.items()))),
        table(
            ["path", "stage", "reason", "detail", "key"],
            ([r.path, r.stage, r.reason, r.detail, r.key] for r in rejects[:MAX_REJECT_ROWS]),
        ),
    ]
    if len(rejects) > MAX_REJECT_ROWS:
        more = f"… {len(rejects) - MAX_REJECT_ROWS:,} more in the rejects report beside the file"
        parts.append(tag("p", more, class_="note"))
    return join(parts)


def _lineage(facts: ReleaseFacts) -> Markup:
    snap, story = facts.snapshot, facts.story
    parent = "not recorded" if not story.change else "none (a first release)"
    if story.parent is not None:
        parent = f"v{story.parent:04d}"
    rows: list[list[object]] = [
        ["name", snap.name],
        ["version", "" if snap.version is None else snap.version],
        ["created", story.created_at or snap.created_at],
        ["parent", parent],
        ["change", story.change or "not recorded"],
        ["change summary", story.summary],
        ["notes", story.notes or "none"],
        ["source fingerprint", snap.attrs.get("source_fingerprint", "")],
        ["built by", _tools(snap.attrs)],
    ]
    rows += [[f"reused from parent: {k}", _plain(v)] for k, v in facts.reuse.items()]
    rows += [[f"split policy: {k}", _plain(v)] for k, v in facts.policy.items()]
    config = snap.config or "(no config stored)"
    return join([table([], rows), tag("h3", "config"), tag("pre", tag("code", config))])


def _tools(attrs: Mapping[str, object]) -> str:
    names = ("h5etl_version", "h5py_version", "hdf5_version")
    found: Iterable[str] = (f"{n.removesuffix('_version')} {attrs[n]}" for n in names if n in attrs)
    return ", ".join(found)


def _plain(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
