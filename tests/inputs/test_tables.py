"""tables: label/metadata tables (CSV, TSV, JSON), class folders and class names."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from h5etl.errors import ConfigError, RejectError
from h5etl.inputs import classfolders, tables
from h5etl.inputs import opening as inputs


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def config_error(path: Path, **kwargs: object) -> ConfigError:
    key = str(kwargs.pop("key", "file"))
    columns = kwargs.pop("columns", ("label",))
    assert isinstance(columns, tuple)
    with pytest.raises(ConfigError) as caught:
        tables.load_table(path, key=key, columns=columns)
    error = caught.value
    assert error.path == path
    assert "\n" not in str(error)
    return error


# --- reading --------------------------------------------------------------------------------


def test_csv_rows_are_looked_up_by_key(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label,age\nimg_001.png,cat,3\nimg_002.png,dog,\n")
    table = tables.load_table(path, key="file", columns=["label", "age"])
    assert table.path == path
    assert table.keys == ("img_001.png", "img_002.png")
    assert table.get("img_001.png", "label") == "cat"
    assert table.get("img_001.png", "age") == "3"  # CSV cells are text: the kind parses them
    assert table.get("img_002.png", "age") is None  # an empty cell


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        pytest.param("file,label\r\na.png,cat\r\n", "utf-8", id="crlf"),
        pytest.param("file,label\na.png,cat\n", "utf-8-sig", id="bom"),
        pytest.param("file;label\na.png;cat\n", "utf-8", id="semicolon"),
        pytest.param("file\tlabel\na.png\tcat\n", "utf-8", id="tab"),
        pytest.param(' "file" , label \n" a.png ", cat \n\n', "utf-8", id="quoted-padded"),
        pytest.param("file,label\na.png,cat", "utf-8", id="no-final-newline"),
    ],
)
def test_csv_dialects(tmp_path: Path, text: str, encoding: str) -> None:
    path = write(tmp_path / "labels.csv", text, encoding)
    table = tables.load_table(path, key="file", columns=["label"])
    assert table.keys == ("a.png",)
    assert table.get("a.png", "label") == "cat"


def test_a_quoted_comma_does_not_split_a_cell(tmp_path: Path) -> None:
    path = write(tmp_path / "meta.csv", 'file,scanner\na.png,"Siemens, Erlangen"\n')
    table = tables.load_table(path, key="file", columns=["scanner"])
    assert table.get("a.png", "scanner") == "Siemens, Erlangen"


def test_tsv_is_tab_separated_even_with_commas_in_cells(tmp_path: Path) -> None:
    path = write(tmp_path / "meta.tsv", "file\tnote\na.png\tx, y, z\n")
    table = tables.load_table(path, key="file", columns=["note"])
    assert table.get("a.png", "note") == "x, y, z"


def test_json_list_and_mapping_keep_their_types(tmp_path: Path) -> None:
    rows = [
        {"file": "a.png", "age": 41.5, "n": 3, "ok": True, "scanner": "GE", "gone": None},
        {"file": "b.png", "age": 7, "n": 0, "ok": False, "scanner": "", "gone": None},
    ]
    as_list = write(tmp_path / "meta.json", json.dumps(rows))
    mapping = {row["file"]: {k: v for k, v in row.items() if k != "file"} for row in rows}
    as_mapping = write(tmp_path / "by_file.json", json.dumps(mapping))
    columns = ["age", "n", "ok", "scanner", "gone"]
    for path in (as_list, as_mapping):
        table = tables.load_table(path, key="file", columns=columns)
        assert table.keys == ("a.png", "b.png")
        assert [table.get("a.png", c) for c in columns] == [41.5, 3, True, "GE", None]
        assert [table.get("b.png", c) for c in columns] == [7, 0, False, None, None]
        assert table.get("b.png", "file") == "b.png"  # the key column can be read too


# --- which row a sample finds ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "sample"),
    [
        pytest.param("cat/img_001.png", "cat/img_001.png", id="path"),
        pytest.param("cat/img_001", "cat/img_001.png", id="path-without-suffix"),
        pytest.param("img_001.png", "cat/img_001.png", id="file-name"),
        pytest.param("img_001", "cat/img_001.png", id="file-stem"),
        pytest.param("./cat/img_001.png", "cat/img_001.png", id="dot-slash"),
        pytest.param("cat\\img_001.png", "cat/img_001.png", id="backslashes"),
        pytest.param("caf\u00e9.png", "cafe\u0301.png", id="nfc"),
    ],
)
def test_a_sample_finds_its_row(tmp_path: Path, written: str, sample: str) -> None:
    path = write(tmp_path / "labels.csv", f"file,label\n{written},cat\n")
    table = tables.load_table(path, key="file", columns=["label"])
    assert table.get(sample, "label") == "cat"
    assert table.row_key(sample) == table.keys[0]


def test_the_most_specific_row_wins(tmp_path: Path) -> None:
    path = write(
        tmp_path / "labels.csv", "file,label\ncat/a.png,exact\na.png,name\ndog/b,stem\nb.png,x\n"
    )
    table = tables.load_table(path, key="file", columns=["label"])
    assert table.get("cat/a.png", "label") == "exact"
    assert table.get("dog/a.png", "label") == "name"
    assert table.get("dog/b.png", "label") == "stem"  # the path without suffix beats the name
    assert table.get("cat/b.png", "label") == "x"


@pytest.mark.parametrize(
    ("written", "sample"),
    [
        pytest.param("img_001.jpg", "img_001.png", id="other-suffix"),
        pytest.param("dog/img_001.png", "cat/img_001.png", id="other-folder"),
        pytest.param("IMG_001.png", "img_001.png", id="case"),
        pytest.param("cat/img_001.png", "img_001.png", id="deeper-in-table"),
    ],
)
def test_no_row_is_a_reject_naming_the_table(tmp_path: Path, written: str, sample: str) -> None:
    path = write(tmp_path / "labels.csv", f"file,label\n{written},cat\n")
    table = tables.load_table(path, key="file", columns=["label"])
    assert table.row_key(sample) is None
    with pytest.raises(RejectError) as caught:
        table.get(sample, "label")
    assert caught.value.reason == "no_row"
    assert caught.value.path == path
    assert sample in caught.value.message
    assert "'file'" in caught.value.message


def test_a_file_name_shared_by_two_samples_is_ambiguous_once_bound(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label\nimg.png,cat\ndog/x.png,dog\nsolo,s\n")
    names = ["cat/img.png", "dog/img.png", "dog/x.png", "cat/x.png", "a/solo.png"]
    table = tables.load_table(path, key="file", columns=["label"]).bind(names)
    assert table.get("dog/x.png", "label") == "dog"  # exact rows are never ambiguous
    assert table.get("a/solo.png", "label") == "s"  # a unique file name is fine
    for name in ("cat/img.png", "dog/img.png"):
        with pytest.raises(RejectError) as caught:
            table.get(name, "label")
        assert caught.value.reason == "ambiguous_row"
        assert "cat/img.png" in caught.value.message
        assert "dog/img.png" in caught.value.message
    assert table.unmatched == ()
    assert table.ambiguous == {"img.png": ("cat/img.png", "dog/img.png")}


def test_bind_lists_rows_no_sample_found(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label\na.png,1\nb.png,2\nc,3\n")
    table = tables.load_table(path, key="file", columns=["label"]).bind(["x/a.png"])
    assert table.unmatched == ("b.png", "c")


def test_a_table_pickles(tmp_path: Path) -> None:
    import pickle

    path = write(tmp_path / "labels.csv", "file,label\na.png,1\n")
    table = tables.load_table(path, key="file", columns=["label"]).bind(["a.png"])
    again = pickle.loads(pickle.dumps(table))
    assert again.get("a.png", "label") == "1"
    assert again == table


def test_an_unknown_column_is_a_bug_of_the_caller(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label,age\na.png,1,2\n")
    table = tables.load_table(path, key="file", columns=["label"])
    with pytest.raises(KeyError):
        table.get("a.png", "age")  # not asked for at load time


# --- broken tables --------------------------------------------------------------------------


def test_missing_table(tmp_path: Path) -> None:
    error = config_error(tmp_path / "labels.csv")
    assert "no such file" in str(error)


def test_a_folder_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "labels.csv").mkdir()
    error = config_error(tmp_path / "labels.csv")
    assert "not a regular file" in str(error)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_table(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label\n")
    path.chmod(0)
    error = config_error(path)
    assert "cannot read" in str(error)


def test_a_failing_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what root cannot provoke with chmod: the read itself failing (EIO on a bad disk)
    path = write(tmp_path / "labels.csv", "file,label\n")

    def broken(name: str) -> bytes:
        cause = OSError(errno.EIO, os.strerror(errno.EIO))
        raise RejectError("unreadable", f"OSError: {cause}", path=name) from cause

    monkeypatch.setattr(inputs, "read_file", broken)  # what tables reads through
    error = config_error(path)
    assert error.message == f"cannot read: {os.strerror(errno.EIO)}"


def test_unsupported_suffix(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.xlsx", "x"))
    assert "'.xlsx'" in str(error)
    assert ".csv, .tsv or .json" in str(error)


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label\na.png,chat\nb.png,ch\u00e8vre\n", "latin-1")
    error = config_error(path)
    assert "line 3" in str(error)
    assert "UTF-8" in str(error)


def test_empty_csv(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.csv", "\n\n"))
    assert "empty" in str(error)
    assert "header" in str(error)


def test_key_column_missing(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.csv", "name,label\na.png,cat\n"))
    assert error.message.startswith("column 'file' not in labels.csv; it has: name, label")


def test_requested_column_missing(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.csv", "file,klass\na.png,cat\n"))
    assert error.message.startswith("column 'label' not in labels.csv; it has: file, klass")


def test_duplicate_column_names(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.csv", "file,label,label\na.png,1,2\n"))
    assert "'label'" in str(error)
    assert "columns 2 and 3" in str(error)


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "labels.csv", "file,label\na.png,1\nb.png,2\n a.png ,3\n")
    error = config_error(path)
    assert "line 4" in str(error)
    assert "line 2" in str(error)
    assert "'a.png'" in str(error)


@pytest.mark.parametrize(
    ("row", "cells"),
    [pytest.param("b.png", 1, id="too-few"), pytest.param("b.png,2,3", 3, id="too-many")],
)
def test_wrong_number_of_cells(tmp_path: Path, row: str, cells: int) -> None:
    error = config_error(write(tmp_path / "labels.csv", f"file,label\na.png,1\n{row}\n"))
    assert "line 3" in str(error)
    assert f"{cells} cell" in str(error)
    assert "header has 2" in str(error)


def test_line_numbers_count_quoted_newlines(tmp_path: Path) -> None:
    text = 'file,note\na.png,"two\nlines"\nb.png\n'
    error = config_error(write(tmp_path / "m.csv", text), columns=("note",))
    assert "line 4" in str(error)


def test_empty_key_cell(tmp_path: Path) -> None:
    error = config_error(write(tmp_path / "labels.csv", "file,label\na.png,1\n,2\n"))
    assert "line 3" in str(error)
    assert "empty" in str(error)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param('"labels"', "a list of objects or an object", id="string"),
        pytest.param("[1, 2]", "entry 1", id="list-of-numbers"),
        pytest.param('[{"label": 1}]', "entry 1 has no 'file'", id="no-key"),
        pytest.param('[{"file": 3, "label": 1}]', "entry 1", id="key-not-text"),
        pytest.param('[{"file": "a", "label": [1]}]', "'label'", id="nested-cell"),
        pytest.param('{"a": {"x": 1}}', "entry 'a' has no 'label'", id="mapping-missing-col"),
        pytest.param('{"a": 5}', "entry 'a'", id="mapping-not-objects"),
        pytest.param('{"a": {"label": 1}, "a": {"label": 2}}', "'a'", id="mapping-duplicate"),
        pytest.param('[{"file": "a", "label": 1}, {"file": "a", "label": 2}]', "entries 1 and 2",
                     id="list-duplicate"),
        pytest.param('[{"file": "a", "label": 1},\n  {"file": "b" "label": 2}]', "line 2",
                     id="syntax"),
    ],
)  # fmt: skip
def test_broken_json(tmp_path: Path, document: str, expected: str) -> None:
    error = config_error(write(tmp_path / "labels.json", document))
    assert expected in str(error)


# --- class folders --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relpath", "expected"),
    [
        pytest.param("cat/img.jpg", "cat", id="class"),
        pytest.param("img.jpg", None, id="in-root"),
        pytest.param("cat/sub/img.jpg", None, id="deeper"),
        pytest.param("cafe\u0301/x.png", "caf\u00e9", id="nfc"),
        pytest.param("10/x.png", "10", id="number"),
    ],
)
def test_class_of(relpath: str, expected: str | None) -> None:
    assert classfolders.class_of(relpath) == expected


def test_empty_class_folders(tmp_path: Path) -> None:
    for name in ("cat", "dog", "empty", "only_sub", "only_hidden", "zebra", ".hidden"):
        (tmp_path / name).mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(b"x")
    (tmp_path / "dog" / "b.jpg").write_bytes(b"x")
    (tmp_path / "zebra" / "notes.txt").write_bytes(b"x")
    (tmp_path / "only_sub" / "deep").mkdir()
    (tmp_path / "only_sub" / "deep" / "c.jpg").write_bytes(b"x")
    (tmp_path / "only_hidden" / ".d.jpg").write_bytes(b"x")
    (tmp_path / "root_file.jpg").write_bytes(b"x")
    (tmp_path / "linked").symlink_to(tmp_path / "cat")  # not walked by discover: not a class
    assert classfolders.empty_class_folders(tmp_path) == ["empty", "only_hidden", "only_sub"]
    jpegs = classfolders.empty_class_folders(tmp_path, matches=lambda rel: rel.endswith(".jpg"))
    assert jpegs == ["empty", "only_hidden", "only_sub", "zebra"]


def test_empty_class_folders_of_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        classfolders.empty_class_folders(tmp_path / "nope")
    assert caught.value.path == tmp_path / "nope"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param(["dog", "cat", "dog", "ant"], ["ant", "cat", "dog"], id="text"),
        pytest.param(["10", "2", "1", "2"], ["1", "2", "10"], id="numbers"),
        pytest.param(["-1", "3", "0"], ["-1", "0", "3"], id="negative"),
        pytest.param(["10", "2", "b"], ["10", "2", "b"], id="mixed-is-text"),
        pytest.param(["01", "1", "2"], ["01", "1", "2"], id="same-value-two-spellings"),
        pytest.param(["\u00b2", "1"], ["1", "\u00b2"], id="superscript-is-text"),
        pytest.param([], [], id="none"),
    ],
)
def test_class_names(labels: list[str], expected: list[str]) -> None:
    assert classfolders.class_names(labels) == expected
    assert classfolders.class_names(iter(labels)) == expected
