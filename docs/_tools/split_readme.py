"""One-off: copy the README's sections into docs/ pages (issue 27). Kept for the record of
where each README heading went; re-running overwrites the copied pages."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (heading as the README writes it, page it moves to, page title when it starts a page)
MOVES: list[tuple[str, str, str]] = [
    ("## Set up", "tutorials/install.md", "Install and set up"),
    ("## Commands", "how-to/commands.md", "The commands"),
    ("### Exit codes", "reference/exit-codes.md", "Exit codes"),
    ("## The config", "reference/config-guide.md", "The config, explained"),
    ("## Field kinds", "how-to/field-kinds.md", "Field kinds: images, masks, labels"),
    ("### Stratified splits", "how-to/splits.md", "Splits"),
    ("### Incremental builds", "how-to/incremental.md", "Incremental releases"),
    ("### Metadata: values and texts from tables and sidecars", "how-to/metadata.md", "Metadata"),
    ("### Volumes: CT and MR cases (DICOM, NIfTI, slice folders)", "how-to/volumes.md", "Volumes"),
    ("### Sensor recordings: the series kind", "how-to/series.md", "Sensor recordings"),
    ("### Extending: add a kind", "internals/add-a-kind.md", "Add a field kind"),
    ("## Examples", "tutorials/examples.md", "The examples"),
    ("## The file", "reference/file-format.md", "The file format"),
    ("## Releases that tell their story", "how-to/diff-rollback-prune.md", "Diff, rollback, prune"),
    ("### Reproducible bytes", "how-to/reproducible.md", "Reproducible bytes"),
    ("## Reading a release", "how-to/reading.md", "Reading a release"),
    (
        "### Chunk size, chunk cache and compression: what reading costs",
        "how-to/codec-and-chunks.md",
        "Choosing codec and chunks",
    ),
    ("### Looking at a release", "how-to/inspect.md", "Looking at a release"),
    ("## Scale-out: a Dask cluster", "how-to/dask.md", "A Dask cluster and shards"),
    ("### Scale-out figures and the model", "benchmarks/scale-out.md", "Scale-out"),
    ("## What h5etl guarantees", "reference/guarantees.md", "Guarantees"),
    ("## Benchmarks", "benchmarks/build.md", "Build throughput"),
    (
        "### Incremental builds: what a new release costs",
        "benchmarks/incremental.md",
        "Incremental builds",
    ),
    (
        "### Carrying CT volumes: what a corrected case costs",
        "benchmarks/carrying-volumes.md",
        "Carrying CT volumes",
    ),
    ("### Field kinds: what they cost", "benchmarks/field-kinds.md", "Field kinds"),
    ("### Volumes: what a build costs", "benchmarks/volumes.md", "Volumes"),
    ("### Series: ragged columns against HDF5 vlen", "benchmarks/series.md", "Series"),
    (
        "### Messy folders, chunk sizes and the 10x corpus",
        "benchmarks/messy-folders.md",
        "Messy folders and the 10x corpus",
    ),
    ("## How it is built", "internals/architecture.md", "Architecture"),
    ("## Changelog", "", ""),  # CHANGELOG.md
]
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (what the README's own links use)."""
    text = heading.lstrip("#").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, text) of each heading outside fences."""
    heads = []
    fenced = False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            heads.append((i, line))
    return heads


def main() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    heads = headings(lines)
    starts = {text: i for i, text in heads}
    cuts = sorted((starts[h], page, title) for h, page, title in MOVES)
    anchors: dict[str, tuple[str, str]] = {}  # github slug -> (page, the site's slug)
    spans = []
    for n, (start, page, title) in enumerate(cuts):
        end = cuts[n + 1][0] if n + 1 < len(cuts) else len(lines)
        spans.append((start, end, page, title))
        for i, text in heads:
            if start <= i < end and page:
                anchors[slug(text)] = (page, site_slug(text))
    pages: dict[str, list[str]] = {}
    for start, end, page, title in spans:
        if not page:
            continue
        shift = len(lines[start]) - len(lines[start].lstrip("#")) - 2
        body = []
        fenced = False
        for line in lines[start:end]:
            if FENCE.match(line):
                fenced = not fenced
            if not fenced and line.startswith("#") and shift > 0:
                line = line[shift:]
            body.append(_relink(line, page, anchors))
        pages.setdefault(page, [f"# {title}", "", "<!-- moved from the README (issue 27) -->", ""])
        pages[page].extend(body)
    for page, body in pages.items():
        path = ROOT / "docs" / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(body).rstrip() + "\n", encoding="utf-8")
        print(page, len(body))


def site_slug(heading: str) -> str:
    """Python-Markdown's anchor of a heading (what MkDocs serves)."""
    from markdown.extensions.toc import slugify

    return slugify(heading.lstrip("#").strip().replace("`", ""), "-")


def _relink(line: str, page: str, anchors: dict[str, tuple[str, str]]) -> str:
    def one(m: re.Match[str]) -> str:
        anchor = m.group(1)
        if anchor not in anchors:
            return f"](#{anchor})"
        target, site = anchors[anchor]
        if target == page:
            return f"](#{site})"
        rel = os.path.relpath(target, os.path.dirname(page))
        return f"]({rel}#{site})"

    return re.sub(r"\]\(#([\w\-]+)\)", one, line)


if __name__ == "__main__":
    main()
