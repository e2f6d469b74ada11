"""report_html: one self-contained HTML page that explains a release (``h5etl report``).

The page needs no server and no network: its style is inline, its pictures are PNG data URIs,
it has no script. It shows the layout (shapes, dtypes, chunks, codecs), the samples and class
histograms per split, the normalisation statistics, a preview grid per split, the rejects
with their reasons and the lineage (parent, change, notes, config).

::

    facts.gather(path)   read the release through snapshot, story, check and preview
    page.render(facts)   the HTML; every string from the file escaped (markup.tag)
"""

from __future__ import annotations

import os
from pathlib import Path

from h5etl.errors import UsageError
from h5etl.release import naming
from h5etl.report_html.facts import ReleaseFacts, gather
from h5etl.report_html.page import SECTIONS, render

__all__ = ["SECTIONS", "ReleaseFacts", "find_release", "gather", "render", "write_html_report"]


def find_release(path: Path, name: str | None = None) -> Path:
    """The release ``path`` names: a file or link as it is; a folder's link of ``name`` (the
    folder's only release when no name is given); ``FOLDER/NAME`` for ``FOLDER/NAME.h5``.

    Raises:
        UsageError: a folder without that release, or of several names and none chosen.
    """
    if not path.is_dir():
        if name is not None:
            raise UsageError("--name goes with a folder of releases", path=path)
        beside = path.with_name(naming.link_filename(path.name))
        if not path.exists() and not path.is_symlink() and beside.exists():
            return beside
        return path  # opening it says what is wrong with it
    names = naming.release_names(path)
    if name is None and len(names) != 1:
        found = f"it holds {', '.join(names)}" if names else "it holds no release"
        raise UsageError(f"a folder: say which release with --name NAME; {found}", path=path)
    chosen = name if name is not None else names[0]
    link = path / naming.link_filename(chosen)
    if link.exists():
        return link
    versions = naming.versions(path, chosen)
    if not versions:
        raise UsageError(
            f"no release named {chosen!r}; it holds {', '.join(names) or 'none'}", path=path
        )
    return versions[max(versions)]


def write_html_report(path: Path, out: Path, *, name: str | None = None, shown: int = 16) -> Path:
    """Write the HTML report of the release at ``path`` to ``out``; return ``out``.

    ``out`` appears whole or not at all (written beside it, then renamed).

    Raises:
        UsageError: no such release, or not one (exit code 2).
        ReaderError: its layout record is damaged or newer than this version reads.
    """
    text = render(gather(find_release(path, name), shown=shown))
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, out)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return out
