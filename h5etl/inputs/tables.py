"""tables: per-sample values from a CSV/TSV/JSON table (class folders:
``h5etl.inputs.classfolders``).

Input: a table file and the columns a field reads from it. Output: a frozen ``Table`` that
answers ``get(sample path, column)``. Pure: no pydantic,
no HDF5; a ``Table`` pickles, so decode workers may hold one. A broken table is a
``ConfigError`` (one line, naming the table and the line); a sample without a row is the
sample's ``RejectError``.

Formats, chosen by suffix:

- ``.csv``: the first row names the columns. The delimiter is whichever of ``,`` ``;`` and tab
  splits that header row into the most cells (a tie, or a one-column header, is ``,``), so the
  semicolon files of spreadsheets set to a European locale read as they are. Quotes as the
  ``csv`` module reads them (a quote may follow spaces). ``.tsv``: always tab.
- ``.json``: a list of objects each holding the key column (``[{"file": "a.png", "age": 41}]``),
  or an object mapping each key to an object of the other columns
  (``{"a.png": {"age": 41}}``; there the mapping's key is the key column). Every entry must
  hold every column asked for (``null`` for an empty value); JSON keeps its types.
- UTF-8, with or without a BOM. Blank rows are skipped. Cells are stripped of surrounding
  whitespace; an empty cell (or JSON ``null`` or ``""``) is ``None``: the kind decides whether
  that is a reject or a default. CSV cells are ``str``: the kind parses numbers.

Which row a sample finds: keys and sample paths are compared after NFC, ``\\`` as ``/`` and a
leading ``./`` removed, case-sensitively. For the sample ``cat/img_001.png`` (its file's path
relative to the source folder, with suffix) the first of these keys the table holds wins:
``cat/img_001.png``, ``cat/img_001`` (the sample's key), ``img_001.png``, ``img_001``. A bare
file name must name one sample: ``Table.bind(all sample paths)`` finds the keys that several
samples reach that way (``ambiguous``) and the rows no sample reaches (``unmatched``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import stat
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from h5etl.errors import ConfigError, RejectError
from h5etl.inputs import opening as inputs

Cell = str | int | float | bool | None
FORMATS = {".csv": "csv", ".tsv": "tsv", ".json": "json"}
DELIMITERS = (",", ";", "\t")  # sniffed for .csv, in order of preference on a tie


@dataclass(frozen=True)
class Table:
    """The rows of one table file, by normalised key; ``columns[0]`` is the key column.

    ``rows[key]`` holds the cells of ``columns`` in that order. After ``bind``:
    ``ambiguous`` maps a key to the samples that all reach it by file name alone, and
    ``unmatched`` lists the keys no sample reaches (for a warning).
    """

    path: Path
    columns: tuple[str, ...]
    rows: dict[str, tuple[Cell, ...]]
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unmatched: tuple[str, ...] = ()
    bound: bool = False

    @property
    def key(self) -> str:
        """The key column's name."""
        return self.columns[0]

    @property
    def keys(self) -> tuple[str, ...]:
        """The normalised keys, in the order of the file."""
        return tuple(self.rows)

    def row_key(self, name: str) -> str | None:
        """The key of the row the sample ``name`` finds (see the module docstring), or None."""
        path = normalise(name)
        base = path.rpartition("/")[2]
        for candidate in (path, strip_suffix(path), base, strip_suffix(base)):
            if candidate in self.rows:
                return candidate
        return None

    def get(self, name: str, column: str) -> Cell:
        """The cell of ``column`` in the row of the sample ``name`` (None when empty).

        Raises:
            KeyError: ``column`` was not asked for when the table was loaded (a bug).
            RejectError: ``no_row`` when no row names the sample; ``ambiguous_row`` when the
                row names it by a file name that other samples share (after ``bind``).
        """
        if column not in self.columns:
            raise KeyError(f"column {column!r} was not loaded from {self.path}")
        key = self.row_key(name)
        if key is None:
            raise RejectError(
                "no_row",
                f"no row of {self.path.name} has {name!r} in column {self.key!r} (its path, "
                "its path without suffix, or its file name if no other sample has it)",
                path=self.path,
            )
        if key in self.ambiguous:
            shared = self.ambiguous[key]
            raise RejectError(
                "ambiguous_row",
                f"row {key!r} of {self.path.name} names {len(shared)} files "
                f"({', '.join(shared)}); write their paths in column {self.key!r}",
                path=self.path,
            )
        return self.rows[key][self.columns.index(column)]

    def bind(self, names: Iterable[str]) -> Table:
        """This table, knowing every sample: file names several samples share become
        ``ambiguous``, and rows no sample reaches are listed in ``unmatched``."""
        claims: dict[str, set[str]] = {}
        for name in names:
            key = self.row_key(name)
            if key is not None:
                claims.setdefault(key, set()).add(name)
        ambiguous = {
            key: tuple(sorted(claims[key])) for key in self.rows if len(claims.get(key, ())) > 1
        }
        unmatched = tuple(key for key in self.rows if key not in claims)
        return dataclasses.replace(self, ambiguous=ambiguous, unmatched=unmatched, bound=True)


def normalise(name: str) -> str:
    """A key or sample path as tables compare them: NFC, ``/`` for ``\\``, no leading ``./``."""
    path = unicodedata.normalize("NFC", name.strip()).replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path


def strip_suffix(path: str) -> str:
    """``path`` without its last suffix, as discover forms keys (``a/b.png`` -> ``a/b``)."""
    stem, dot, suffix = path.rpartition(".")
    return stem if dot and "/" not in suffix and stem and not stem.endswith("/") else path


def load_table(path: Path, *, key: str, columns: Sequence[str]) -> Table:
    """Read the table ``path`` (``.csv``, ``.tsv`` or ``.json``): its key column and ``columns``.

    Returns:
        The table; ``get(sample path, column)`` reads a cell (see the module docstring).

    Raises:
        ConfigError: (``path`` = the table) no such file or not readable, an unknown suffix,
            not UTF-8, no header or an empty file, the key column or a requested column
            missing, a column named twice, a duplicate key (both lines named), a row with the
            wrong number of cells, an empty key, JSON that is invalid or not a list/object of
            objects, a JSON cell that is a list or object.
    """
    wanted = tuple(dict.fromkeys([key, *columns]))
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"tables of type {path.suffix or '(no suffix)'!r} cannot be read; "
            "use .csv, .tsv or .json",
            path=path,
        )
    data = _read(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"line {line}: not UTF-8 (byte 0x{data[exc.start]:02x}); save the table as UTF-8",
            path=path,
        ) from exc
    if kind == "json":
        rows = _json_rows(path, text, wanted)
    else:
        rows = _csv_rows(path, text, wanted, "\t" if kind == "tsv" else None)
    return Table(path, wanted, rows)


def _read(path: Path) -> bytes:
    try:
        info = os.stat(path)
    except FileNotFoundError as exc:
        why = "symbolic link points nowhere" if os.path.islink(path) else "no such file"
        raise ConfigError(f"{why}; the table must exist before the build", path=path) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from exc
    if not stat.S_ISREG(info.st_mode):
        what = inputs.kind_of(info.st_mode) or f"of mode {info.st_mode:o}"
        raise ConfigError(f"not a regular file but {what}; name a table file", path=path)
    try:
        return inputs.read_file(str(path))
    except RejectError as exc:
        cause = exc.__cause__
        detail = cause.strerror if isinstance(cause, OSError) and cause.strerror else exc.message
        raise ConfigError(f"cannot read: {detail}", path=path) from exc


def _cell(value: Cell) -> Cell:
    return (value.strip() or None) if isinstance(value, str) else value


def _header(path: Path, header: list[str], wanted: tuple[str, ...]) -> list[int]:
    """The position of each wanted column in ``header`` (names stripped)."""
    names = [name.strip() for name in header]
    positions = []
    for column in wanted:
        found = [i for i, name in enumerate(names) if name == column]
        if not found:
            raise ConfigError(
                f"column {column!r} not in {path.name}; it has: {', '.join(names)} "
                "(the first row must name the columns)",
                path=path,
            )
        if len(found) > 1:
            raise ConfigError(
                f"column {column!r} is named twice in the header (columns {found[0] + 1} and "
                f"{found[1] + 1}); rename one",
                path=path,
            )
        positions.append(found[0])
    return positions


def _delimiter(text: str) -> str:
    """Of ``,`` ``;`` and tab, the one that splits the first non-blank line into most cells."""
    first = next((line for line in io.StringIO(text, newline="") if line.strip()), "")
    counts = [
        len(next(csv.reader([first], delimiter=d, skipinitialspace=True), [])) for d in DELIMITERS
    ]
    return DELIMITERS[counts.index(max(counts))]


def _csv_rows(
    path: Path, text: str, wanted: tuple[str, ...], delimiter: str | None
) -> dict[str, tuple[Cell, ...]]:
    """The rows of a CSV/TSV (``delimiter`` None: sniffed), by normalised key."""
    delimiter = delimiter or _delimiter(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, skipinitialspace=True)
    key = wanted[0]
    rows: dict[str, tuple[Cell, ...]] = {}
    lines: dict[str, int] = {}
    header: list[str] | None = None
    positions: list[int] = []
    while True:
        line = reader.line_num + 1  # where this record starts (a quoted cell may span lines)
        try:
            row = next(reader, None)
        except csv.Error as exc:
            raise ConfigError(f"line {line}: {exc}", path=path) from exc
        if row is None:
            break
        if not any(cell.strip() for cell in row):
            continue  # blank rows, and the ",,," rows spreadsheets leave at the end
        if header is None:
            header, positions = row, _header(path, row, wanted)
            continue
        if len(row) != len(header):
            hint = f" (quote cells that contain {delimiter!r})"
            raise ConfigError(
                f"line {line}: {len(row)} cell{'s' * (len(row) != 1)}, but the header has "
                f"{len(header)}{hint if len(row) > len(header) else ''}",
                path=path,
            )
        cells = tuple(_cell(row[i]) for i in positions)
        raw = cells[0]
        if raw is None:
            raise ConfigError(f"line {line}: empty {key!r}; every row needs one", path=path)
        assert isinstance(raw, str)
        name = normalise(raw)
        if name in lines:
            raise ConfigError(
                f"line {line}: {key} {raw!r} again (first on line {lines[name]}); "
                "give each file one row",
                path=path,
            )
        lines[name] = line
        rows[name] = cells
    if header is None:
        raise ConfigError("the table is empty; the first row must be a header", path=path)
    return rows


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in pairs:
        if name in out:
            raise KeyError(name)  # json.loads raises no KeyError of its own
        out[name] = value
    return out


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    names = {str: "a string", list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _json_row(path: Path, where: str, entry: object, wanted: tuple[str, ...]) -> tuple[Cell, ...]:
    """The cells of ``wanted`` in one JSON entry (``where`` names it in messages)."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: not an object but {_json_type(entry)}", path=path)
    cells: list[Cell] = []
    for column in wanted:
        if column not in entry:
            raise ConfigError(
                f"{where} has no {column!r} (write null for an empty value)", path=path
            )
        value = entry[column]
        if not isinstance(value, str | int | float | bool | None):
            raise ConfigError(
                f"{where}: {column!r} must be a string, a number, true, false or null, "
                f"not {_json_type(value)}",
                path=path,
            )
        cells.append(_cell(value))
    return tuple(cells)


def _json_rows(path: Path, text: str, wanted: tuple[str, ...]) -> dict[str, tuple[Cell, ...]]:
    key = wanted[0]
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"line {exc.lineno}: not valid JSON: {exc.msg}", path=path) from exc
    except KeyError as exc:
        raise ConfigError(
            f"{exc.args[0]!r} appears twice in one object; keep one", path=path
        ) from exc
    except RecursionError as exc:
        raise ConfigError("JSON nested too deeply", path=path) from exc
    entries: list[tuple[str, object]] = []  # (where, entry), the key column filled in
    if isinstance(document, dict):
        for name, entry in document.items():
            if isinstance(entry, dict):
                entry = {**entry, key: name}  # the mapping's key is the key column
            entries.append((f"entry {name!r}", entry))
    elif isinstance(document, list):
        entries = [(f"entry {i}", entry) for i, entry in enumerate(document, 1)]
    else:
        raise ConfigError(
            f"not a list of objects or an object of objects but {_json_type(document)}; "
            f'write [{{"{key}": "a.png", ...}}, ...] or {{"a.png": {{...}}, ...}}',
            path=path,
        )
    rows: dict[str, tuple[Cell, ...]] = {}
    first: dict[str, str] = {}
    for where, entry in entries:
        cells = _json_row(path, where, entry, wanted)
        raw = cells[0]
        if not isinstance(raw, str):
            shown = "empty" if raw is None else f"{raw!r}, not text"
            raise ConfigError(f"{where}: {key!r} is {shown}; every entry needs one", path=path)
        name = normalise(raw)
        if name in first:
            raise ConfigError(
                f"entries {first[name].removeprefix('entry ')} and "
                f"{where.removeprefix('entry ')} both have {key} {raw!r}; "
                "give each file one entry",
                path=path,
            )
        first[name] = where
        rows[name] = cells
    return rows
