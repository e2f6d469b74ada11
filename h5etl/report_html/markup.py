"""markup: HTML built so that no string from a release can become markup.

Every text goes through :func:`tag`, which escapes it (``html.escape``, quotes too) unless it
is :class:`Markup`, which only this package makes (tags it built, the stylesheet, data URIs
of PNGs it encoded). A release built from hostile file names (``<script>`` in a name, a class
folder, a note) therefore shows them as text. No JavaScript, no external resources: the page
opens from a file without a network.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence

from PIL import Image

__all__ = ["Markup", "join", "png_uri", "table", "tag", "text"]


class Markup(str):
    """A fragment of HTML this package built: inserted as it is, never escaped again."""

    __slots__ = ()


def text(value: object) -> Markup:
    """``value`` as escaped text (``Markup`` as it is)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[object]) -> Markup:
    """Fragments one after another, each escaped unless it is Markup."""
    return Markup("".join(text(part) for part in parts))


def tag(element: str, /, *children: object, **attrs: object) -> Markup:
    """``<element attrs>children</element>``; attribute values and children are escaped.

    A keyword ``class_`` is the ``class`` attribute; ``None`` or ``False`` leaves it out.
    """
    shown = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{text(value)}"'
        for key, value in attrs.items()
        if value is not None and value is not False
    )
    if element in ("img", "meta", "br"):
        return Markup(f"<{element}{shown}>")
    return Markup(f"<{element}{shown}>{join(children)}</{element}>")


def table(
    head: Sequence[object], rows: Iterable[Sequence[object]], *, class_: str | None = None
) -> Markup:
    """A table: a header row (none when ``head`` is empty), then one row per item, the first
    cell of each a ``th``."""
    body = [
        tag("tr", *(tag("th" if i == 0 else "td", cell) for i, cell in enumerate(row)))
        for row in rows
    ]
    return tag(
        "table",
        tag("thead", tag("tr", *(tag("th", cell) for cell in head))) if head else "",
        tag("tbody", *body),
        class_=class_,
    )


def png_uri(picture: Image.Image) -> str:
    """``picture`` as a ``data:image/png;base64,...`` URI (the page carries its images)."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


STYLE = Markup(
    """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  margin: 0 auto; max-width: 1100px; padding: 16px 24px 48px; color: #1e1e1e; }
h1 { font-size: 24px; margin: 8px 0 2px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 2px solid #e3e7ee; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.sub { color: #5a6270; margin: 0 0 12px; }
nav a { margin-right: 12px; color: #2456a6; text-decoration: none; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #dde2ea; padding: 3px 8px; text-align: left; vertical-align: top; }
thead th { background: #eef2f8; }
tbody th { font-weight: 600; background: #fafbfd; }
td.num, .num td { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #f6f8fa; border: 1px solid #e3e7ee; padding: 10px; overflow-x: auto;
  font-size: 12px; max-height: 480px; }
.bar { display: inline-block; height: 10px; background: #3b82c4; vertical-align: middle;
  margin-right: 6px; }
.ok { color: #1d7a36; font-weight: 600; }
.bad { color: #b3261e; font-weight: 600; }
.note { color: #5a6270; font-style: italic; }
figure { margin: 8px 0 16px; }
figure img { max-width: 100%; border: 1px solid #dde2ea; }
figcaption { color: #5a6270; font-size: 12px; }
"""
)
