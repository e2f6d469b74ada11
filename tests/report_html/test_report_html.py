"""h5etl report --html: the page shows what the file holds, every number as h5py reads it,
carries everything it needs inline, escapes every name, and renders in a real browser."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl import examples
from h5etl.cli.app import app
from h5etl.report_html import SECTIONS, write_html_report

# The datasets of a split the layout table leaves out: the lineage, the sample keys and
# the offsets beside ragged columns (the table shows the column they belong to).
BOOKKEEPING = ("source_sha256", "sample_key", "sample_group")
BLOSC = 32001  # the HDF5 filter id of Blosc
# Elements the page may contain: no script, no link, no iframe, no object.
ALLOWED = {
    *("html", "head", "meta", "title", "style", "body", "nav", "a", "section", "h1", "h2"),
    *("h3", "p", "table", "thead", "tbody", "tr", "th", "td", "span", "ul", "li", "figure"),
    *("img", "figcaption", "pre", "code"),
}


class Page(HTMLParser):
    """The page as tables of cell texts per section, its images, its tags and attributes."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, list[list[list[str]]]] = {}
        self.texts: dict[str, list[str]] = {}
        self.order: list[str] = []
        self.images: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._section = ""
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.append((tag, found))
        if tag == "section":
            self._section = str(found["id"])
            self.order.append(self._section)
            self.sections[self._section] = []
            self.texts[self._section] = []
        elif tag == "table" and self._section:
            self.sections[self._section].append([])
        elif tag == "tr" and self._section:
            self.sections[self._section][-1].append([])
        elif tag in ("td", "th") and self._section:
            self._cell = []
        elif tag == "img":
            self.images.append(str(found["src"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = ""
        if tag in ("td", "th") and self._cell is not None:
            self.sections[self._section][-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._section:
            self.texts[self._section].append(data)

    def table(self, section: str, first: str) -> list[list[str]]:
        """The rows (without the header) of the table of ``section`` whose header starts
        with ``first``."""
        for rows in self.sections[section]:
            if rows and rows[0] and rows[0][0] == first:
                return rows[1:]
        raise AssertionError(f"no table {first!r} in section {section!r}")

    def pairs(self, section: str) -> dict[str, str]:
        """The first headerless two-column table of ``section`` as a dict."""
        return {row[0]: row[1] for row in self.sections[section][0] if len(row) == 2}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The link of demo example NAME, built once per module on first use."""
    links: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in links:
            config = examples.prepare(tmp_path_factory.mktemp(name) / "demo", name)
            report = h5etl.build(h5etl.load_spec(config), jobs=1)
            assert report.link is not None
            links[name] = report.link
        return links[name]

    return build


def _page(link: Path, tmp_path: Path) -> tuple[Page, Path]:
    out = write_html_report(link, tmp_path / "report.html", shown=4)
    return Page(out.read_text("utf-8")), out


def _check_layout(page: Page, handle: h5py.File) -> None:
    rows = page.table("layout", "dataset")
    shown = {row[0]: row for row in rows}
    expected = {
        f"/{split}/{name}"
        for split in ("train", "valid")
        for name in handle[split]
        if name not in BOOKKEEPING and not name.endswith("_offsets")
    }
    assert set(shown) == expected
    for path, row in shown.items():
        dataset = handle[path]
        text = h5py.check_string_dtype(dataset.dtype) is not None
        assert row[4] == str(dataset.shape), path
        assert row[5] == ("str" if text else dataset.dtype.name), path
        assert row[6] == str(dataset.chunks), path
        plist = dataset.id.get_create_plist()
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        assert (row[7] == "none") == (not filters), path
        assert row[7].startswith("blosc(") == (BLOSC in filters), path


def _check_counts(page: Page, handle: h5py.File) -> None:
    counts = {row[0]: int(_number(row[1])) for row in page.table("splits", "split")}
    assert counts == {s: len(handle[f"{s}/source_sha256"]) for s in ("train", "valid")}


def _check_histograms(page: Page, handle: h5py.File) -> None:
    """Class counts of labels (a bincount of the stored ints), pixels per mask value (the
    histogram attrs the build stored: over the unpadded pixels)."""
    expected: dict[tuple[str, str], int] = {}
    for split in ("train", "valid"):
        for node in handle[split].values():
            if node.attrs.get("kind") == "label":
                names = [str(c) for c in node.attrs["classes"]]
                counts = np.bincount(node[...], minlength=len(names))
                expected.update({(split, names[i]): int(n) for i, n in enumerate(counts)})
            elif "histogram_values" in node.attrs and node.attrs.get("kind") != "label":
                values, counts = node.attrs["histogram_values"], node.attrs["histogram_counts"]
                expected.update(
                    {(split, str(v)): int(n) for v, n in zip(values, counts, strict=True)}
                )
    shown = {}
    for rows in page.sections["splits"][1:]:  # a row per class, a column per split
        splits = rows[0][1:]
        for row in rows[1:]:
            for split, cell in zip(splits, row[1:], strict=True):
                shown[(split, row[0])] = int(_number(cell.split(" (")[0]))
    # a mask value one split lacks is shown as 0 there; its histogram attrs leave it out
    assert {k: n for k, n in shown.items() if n or k in expected} == expected


def _check_stats(page: Page, handle: h5py.File) -> None:
    rows = page.table("statistics", "dataset")
    expected = []
    for split in ("train", "valid"):
        for name, node in handle[split].items():
            if "mean" in node.attrs:
                columns = [np.atleast_1d(node.attrs[k]) for k in ("mean", "std", "min", "max")]
                expected += [
                    (name, split, channel, [c[channel] for c in columns])
                    for channel in range(len(columns[0]))
                ]
    assert len(rows) == len(expected) > 0
    for row, (name, split, channel, values) in zip(rows, expected, strict=True):
        assert row[:3] == [name, split, str(channel)]
        np.testing.assert_allclose([_number(v) for v in row[3:7]], values, rtol=1e-5)


def _check_rejects(page: Page, handle: h5py.File) -> None:
    table = handle["diagnostics/rejects"][...]
    rows = page.table("rejects", "path")
    columns = ("path", "stage", "reason", "detail", "key")
    assert rows == [[row[c].decode() for c in columns] for row in table]
    reasons = {row[0]: int(_number(row[1])) for row in page.table("rejects", "reason")}
    attrs = handle["diagnostics"].attrs
    assert reasons == {
        k.removeprefix("rejects_"): int(v)
        for k, v in attrs.items()
        if k.startswith("rejects_") and k != "rejects_total"
    }


def _check_lineage(page: Page, handle: h5py.File) -> None:
    lineage = page.pairs("lineage")
    assert lineage["change"] == handle.attrs["change"]
    assert lineage["version"] == str(handle.attrs["version"])
    assert "".join(page.texts["lineage"]).endswith(handle.attrs["config"])


@pytest.mark.parametrize("example", ["cells", "classification", "ct-volumes", "vibration"])
def test_the_page_shows_the_numbers_the_file_holds(
    built: Callable[[str], Path], tmp_path: Path, example: str
) -> None:
    link = built(example)
    page, _ = _page(link, tmp_path)
    assert page.order == list(SECTIONS)
    with h5py.File(link, "r") as handle:
        _check_counts(page, handle)
        _check_layout(page, handle)
        _check_histograms(page, handle)
        _check_stats(page, handle)
        _check_rejects(page, handle)
        _check_lineage(page, handle)
    assert len(page.images) == 2  # a preview per split, inline
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        picture = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert min(picture.size) > 32


def test_the_page_needs_nothing_from_outside(built: Callable[[str], Path], tmp_path: Path) -> None:
    page, _ = _page(built("cells"), tmp_path)
    for tag, attrs in page.tags:
        assert tag in ALLOWED, tag
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        if tag == "a":
            assert str(attrs["href"]).startswith("#")
        if tag == "img":
            assert str(attrs["src"]).startswith("data:image/png;base64,")


def test_a_release_of_an_older_version_is_explained_too(tmp_path: Path) -> None:
    # built by h5etl 0.1: no layout record, no rejects table, no story
    old = Path(__file__).parents[1] / "data" / "cells-0.1-lzf.h5"
    page, _ = _page(old, tmp_path)
    assert page.order == list(SECTIONS)
    with h5py.File(old, "r") as handle:
        _check_counts(page, handle)
        _check_layout(page, handle)
    assert "no layout record" in "".join(page.texts["layout"])
    assert "stores no rejects table" in "".join(page.texts["rejects"])
    assert page.pairs("lineage")["parent"] == "not recorded"
    assert len(page.images) == 2


def _hostile(root: Path) -> Path:
    """A class-folder release whose class names, file names, description and notes are
    markup; one broken file among them is rejected. Returns its link."""
    rng = np.random.default_rng(0)
    for folder in ('<b onclick="alert(1)">', 'a&b "q"'):
        (root / "raw" / folder).mkdir(parents=True)
        for index in range(2):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "raw" / folder / f"<script>alert({index}).png")
    broken = root / "raw" / '<b onclick="alert(1)">' / "<img src=x onerror=alert(9)>.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    config = {
        "name": "hostile",
        "pipeline": "classification",
        "output": "releases",
        "description": "<script>alert('d')</script>",
        "notes": "<img src=x onerror=alert('n')>",
        "sources": {"image": {"dir": "raw", "glob": "**/*.png"}},
        "splits": {"train": 0.5, "valid": 0.5},
        "stratify": "label",
        "fields": {
            "image": {"shape": [3, 8, 8]},
            "label": {"kind": "label", "source": "image", "from": "folder"},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": 2},
        # the broken file is its class folder's only one: a rejected input and an empty class
        "max_rejects": 1,
        "allow_empty": True,
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(root / "config.yaml"), jobs=1)
    assert report.link is not None
    return report.link


def test_names_from_the_file_are_shown_as_text_never_as_markup(tmp_path: Path) -> None:
    # a release built from hostile file names must not inject markup into the page
    page, out = _page(_hostile(tmp_path), tmp_path)
    assert {tag for tag, _ in page.tags} <= ALLOWED
    assert not any(name.startswith("on") for _, attrs in page.tags for name in attrs)
    classes = {row[0] for rows in page.sections["splits"][1:] for row in rows[1:]}
    assert classes == {'<b onclick="alert(1)">', 'a&b "q"'}
    [reject] = page.table("rejects", "path")
    assert reject[0] == 'raw/<b onclick="alert(1)">/<img src=x onerror=alert(9)>.png'
    assert page.pairs("summary")["description"] == "<script>alert('d')</script>"
    assert page.pairs("lineage")["notes"] == "<img src=x onerror=alert('n')>"
    assert "<script" not in out.read_text("utf-8")


def _invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_the_command_takes_a_link_a_file_or_a_folder(
    built: Callable[[str], Path], tmp_path: Path
) -> None:
    link = built("classification")
    folder = link.parent
    for given in (link, link.resolve(), folder, folder / "shapes", folder / "shapes-v0001.h5"):
        out = tmp_path / "page.html"
        code, output = _invoke("report", given, "--html", out, "--n", "1")
        assert (code, output) == (0, f"report: {out}\n"), given
        assert Page(out.read_text("utf-8")).pairs("summary")["release file"] == "shapes-v0001.h5"
        out.unlink()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        pytest.param("missing.h5", "no such file", id="missing"),
        pytest.param("text.h5", "not a release: not an HDF5 file", id="not-hdf5"),
        pytest.param("empty", "a folder: say which release with --name NAME", id="empty-folder"),
        pytest.param("plain.h5", "not an h5etl release", id="plain-hdf5"),
    ],
)
def test_no_release_is_one_line_and_exit_code_2(tmp_path: Path, given: str, message: str) -> None:
    (tmp_path / "text.h5").write_text("hello")
    (tmp_path / "empty").mkdir()
    with h5py.File(tmp_path / "plain.h5", "w") as handle:
        handle["x"] = np.arange(3)
    out = tmp_path / "page.html"
    code, output = _invoke("report", tmp_path / given, "--html", out)
    assert code == 2
    assert len(output.splitlines()) == 1, output
    assert output.startswith("h5etl: error: "), output
    assert message in output, output
    assert not out.exists()
    assert not list(tmp_path.glob(".page.html*"))


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_a_browser_renders_the_page_without_errors(
    built: Callable[[str], Path], tmp_path: Path
) -> None:
    _, out = _page(built("cells"), tmp_path)
    shot = tmp_path / "page.png"
    browser = [
        str(_chromium()),
        *("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"),
        *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
        f"--user-data-dir={tmp_path / 'profile'}",
        *("--enable-logging=stderr", "--v=0", "--window-size=1200,2000"),
        f"--screenshot={shot}",
        out.resolve().as_uri(),
    ]
    done = subprocess.run(browser, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    console = [line for line in lines if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[:2] == (2000, 1200)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 100  # text, tables, previews: not a blank or one-colour page
    drawn = (pixels < 245).any(axis=2).mean()
    assert drawn > 0.05, drawn
