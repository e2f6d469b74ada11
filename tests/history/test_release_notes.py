"""The release tells its own story: rejects inside the file, notes, parent and change label,
and ``h5etl releases`` showing them. Real builds; files read back with h5py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import h5py
import pytest
import yaml
from conftest import ALL_BROKEN, MakeRaw, WriteConfig, add_pairs
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.config.spec import spec_sha256
from h5etl.pipeline import run as pipeline
from h5etl.units import human_size

runner = CliRunner()
COLUMNS = ("path", "stage", "reason", "detail", "key")


def _cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _rejects_in(path: Path) -> list[dict[str, str]]:
    with h5py.File(path, "r") as handle:
        table = handle["diagnostics/rejects"]
        assert table.dtype.names == COLUMNS
        return [
            {name: value.decode() for name, value in zip(COLUMNS, row, strict=True)}
            for row in table[...]
        ]


def test_rejects_are_inside_the_file_and_beside_it(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=4, broken=ALL_BROKEN)
    report = pipeline.build(load_spec(write_config(tmp_path)), jobs=1)
    assert report.path is not None
    assert report.rejects_path is not None
    inside = _rejects_in(report.path)
    beside = [json.loads(line) for line in report.rejects_path.read_text("utf-8").splitlines()]
    # the same rows; inside, paths as the config wrote its source folders (raw/images/...),
    # so the file is the same wherever the project lies
    root = f"{tmp_path}/"
    assert inside == [
        {k: v.replace(root, "") if k in ("path", "detail") else v for k, v in row.items()}
        for row in beside
    ]
    assert all(not r["path"].startswith("/") for r in inside)
    expected = {os.path.relpath(path, tmp_path): reason for path, reason in raw.reasons.items()}
    assert {r["path"]: r["reason"] for r in inside} == expected
    assert all(r["stage"] in {"discover", "clean", "decode"} for r in inside)
    # a file copied alone still says what was left out
    alone = tmp_path / "elsewhere" / "copy.h5"
    alone.parent.mkdir()
    shutil.copyfile(report.path, alone)
    assert {r["path"] for r in _rejects_in(alone)} == set(expected)
    code, out, _ = _cli("check", alone, "--deep")
    assert code == 0, out


def test_check_finds_a_rejects_table_that_disagrees_with_the_tallies(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4, broken=ALL_BROKEN)
    report = pipeline.build(load_spec(write_config(tmp_path)), jobs=1)
    assert report.path is not None
    rows = _rejects_in(report.path)
    reason = rows[0]["reason"]
    with h5py.File(report.path, "r") as handle:
        tallied = int(handle["diagnostics"].attrs[f"rejects_{reason}"])
    edited = tmp_path / "edited.h5"
    shutil.copyfile(report.path, edited)
    with h5py.File(edited, "r+") as handle:  # one row gone from the table, the tallies kept
        table = handle["diagnostics/rejects"][1:]
        del handle["diagnostics/rejects"]
        handle["diagnostics"].create_dataset("rejects", data=table)
    code, out, _ = _cli("check", report.path)
    assert code == 0, out
    code, out, _ = _cli("check", edited)
    assert code == 1
    assert f"/diagnostics/rejects lists {len(rows) - 1} rejects" in out
    assert f"{reason} {tallied - 1}" in out
    assert f"not the {len(rows)} the tallies count" in out


def test_no_rejects_is_an_empty_table(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    report = pipeline.build(load_spec(write_config(tmp_path)), jobs=1)
    assert report.path is not None
    assert _rejects_in(report.path) == []


def test_notes_from_the_config_and_the_command_line(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=5)
    config = write_config(tmp_path, notes="first cut\nfrom the lab")
    code, out, _ = _cli("build", config, "-j", "1", "-q")
    assert code == 0, out
    plain = write_config(tmp_path, config_name="plain.yaml")
    code, out, _ = _cli("build", config, "-j", "1", "-q", "--notes", "masks of s002 fixed")
    assert code == 0, out
    folder = tmp_path / "releases"
    with h5py.File(folder / "cells-v0001.h5") as one, h5py.File(folder / "cells-v0002.h5") as two:
        assert one.attrs["notes"] == "first cut\nfrom the lab"
        assert two.attrs["notes"] == "masks of s002 fixed"  # the command line wins
        # notes are not part of the build's config: same text, same digest
        assert "notes" not in yaml.safe_load(one.attrs["config"])
        assert one.attrs["config_sha256"] == two.attrs["config_sha256"]
    assert spec_sha256(load_spec(plain)) == _config_sha(folder / "cells-v0001.h5")
    code, out, _ = _cli("releases", folder)
    assert code == 0, out
    assert "notes: first cut from the lab" in out
    assert "notes: masks of s002 fixed" in out


def _config_sha(path: Path) -> str:
    with h5py.File(path, "r") as handle:
        return str(handle.attrs["config_sha256"])


def test_notes_with_a_nul_are_a_usage_error(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=2)
    code, _, err = _cli("build", write_config(tmp_path), "-q", "--notes", "a\0b")
    assert code == 2
    assert err.startswith("h5etl: error: --notes: HDF5 text cannot hold a NUL")
    assert not (tmp_path / "releases").exists() or not list((tmp_path / "releases").glob("*.h5"))


UP_TO_DATE = "(6 samples, same config and inputs): no new release; --full rebuilds"


def test_releases_shows_size_time_counts_parent_change_and_notes(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    # a withdrawn sample of 6 is 17 %: past the default max_shrink (test_publish_guard)
    config = write_config(tmp_path, splits={"train": 1.0}, max_shrink=0.5)
    assert _cli("build", config, "-j", "1", "-q", "--notes", "v1")[0] == 0
    code, out, _ = _cli("build", config, "-j", "1", "-q")  # nothing changed: no release
    assert (code, out) == (0, f"cells: nothing changed since cells-v0001 {UP_TO_DATE}\n")
    code, out, _ = _cli("build", config, "-j", "1", "-q", "--full")  # builds all the same
    assert code == 0
    assert "change: patch (from v0001): no change" in out
    raw.image("s000").unlink()
    raw.mask("s000").unlink()
    assert _cli("build", config, "-j", "1", "-q")[0] == 0
    folder = tmp_path / "releases"
    code, out, _ = _cli("releases", folder)
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 6  # a line per release, and a line of its story
    for version, story in zip(
        (1, 2, 3),
        (
            "initial: the first release of this name here; notes: v1",
            "patch from v0001: no change",
            "major from v0002: 1 sample removed",
        ),
        strict=True,
    ):
        path = folder / f"cells-v{version:04d}.h5"
        main, told = lines[2 * version - 2], lines[2 * version - 1]
        with h5py.File(path, "r") as handle:
            created = handle.attrs["created_at"]
            count = len(handle["train/image"])
        assert main.startswith("*" if version == 3 else " ")
        assert f"{path.name}  " in main
        assert human_size(path.stat().st_size) in main
        assert f"  {created}  " in main
        assert re.search(rf"train {count}; ", main), main
        assert told == f"    {story}"


def test_releases_json_gives_each_release_for_scripts(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=5)
    # a withdrawn sample of 5 is 20 %: past the default max_shrink (test_publish_guard)
    config = write_config(tmp_path, splits={"train": 1.0}, max_shrink=0.5)
    assert _cli("build", config, "-j", "1", "-q", "--notes", "first")[0] == 0
    raw.image("s001").unlink()
    raw.mask("s001").unlink()
    assert _cli("build", config, "-j", "1", "-q")[0] == 0
    folder = tmp_path / "releases"
    code, out, _ = _cli("releases", folder, "--json")
    assert code == 0, out
    listed = json.loads(out)
    assert [r["version"] for r in listed] == [1, 2]
    assert [r["current"] for r in listed] == [False, True]
    for entry in listed:
        path = Path(entry["path"])
        assert path == folder / f"cells-v{entry['version']:04d}.h5"
        assert entry["size"] == path.stat().st_size
        with h5py.File(path, "r") as handle:
            assert entry["created_at"] == handle.attrs["created_at"]
            assert entry["samples"] == {"train": len(handle["train/image"])}
        assert entry["fields"] == {"image": "image", "mask": "mask", "filename": "text"}
    assert (listed[0]["change"], listed[0]["parent"], listed[0]["notes"]) == (
        "initial",
        None,
        "first",
    )
    assert (listed[1]["change"], listed[1]["parent"], listed[1]["notes"]) == ("major", 1, None)
    assert listed[1]["summary"] == "major: 1 sample removed"
    (tmp_path / "empty").mkdir()
    assert _cli("releases", tmp_path / "empty", "--json")[:2] == (0, "[]\n")


@pytest.mark.parametrize("name", ["cells-0.1-lzf.h5", "cells-0.1-blosc.h5"])
def test_releases_of_an_old_version_tell_what_they_have(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "releases"
    folder.mkdir()
    copy = folder / "cells-v0002.h5"
    shutil.copyfile(Path(__file__).parents[1] / "data" / name, copy)
    with h5py.File(copy, "r") as handle:
        created = handle.attrs["created_at"]  # not the copy's mtime
    code, out, _ = _cli("releases", folder)
    assert code == 0, out
    assert out.splitlines() == [  # no story line: that version recorded none
        f"  cells-v0002.h5  {human_size(copy.stat().st_size):>10}  {created}  "
        "train 7, valid 3; image (image), mask (mask), filename (text)"
    ]


def test_a_build_after_an_unreadable_parent_still_publishes(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4)
    config = write_config(tmp_path)
    assert _cli("build", config, "-j", "1", "-q")[0] == 0
    (tmp_path / "releases" / "cells-v0001.h5").write_bytes(b"damaged")
    code, out, _ = _cli("build", config, "-j", "1", "-q")
    assert code == 0, out
    with h5py.File(tmp_path / "releases" / "cells-v0002.h5", "r") as handle:
        assert "change" not in handle.attrs
        assert handle.attrs["change_summary"] == "the parent cells-v0001.h5 is unreadable"


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed")
def test_h5dump_reads_the_rejects_table(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # HDF5 1.10's tools read the compound of variable-length strings
    raw = make_raw(tmp_path, n=2, broken=["mask_128"])
    report = pipeline.build(load_spec(write_config(tmp_path)), jobs=1)
    assert report.path is not None
    done = subprocess.run(
        ["h5dump", "-d", "/diagnostics/rejects", str(report.path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"mask_values"') == 2
    assert f'"{raw.mask("broken_mask_128").relative_to(tmp_path)}"' in done.stdout


def test_the_change_label_takes_the_written_rows_which_are_the_files_samples(
    tmp_path: Path, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h5etl.history import snapshot
    from h5etl.history.diff import diff_paths

    compared: list[tuple[dict[str, int], int]] = []
    read_back = snapshot.snapshot_of

    def both_ways(handle: h5py.File, path: Path, *, written: Any = None) -> snapshot.Snapshot:
        taken = read_back(handle, path, written=written)
        if written is not None:  # the label's snapshot: the rows the sink appended
            assert taken.samples == read_back(handle, path).samples
            compared.append(({s: len(r) for s, r in written.items()}, len(taken.samples)))
        return taken

    monkeypatch.setattr(snapshot, "snapshot_of", both_ways)
    # the second build appends carried rows, then decoded ones (new, changed, and those of
    # blocks a change touched): all come through the watcher
    add_pairs(tmp_path, [f"s{i:03d}" for i in range(41)])
    config = load_spec(write_config(tmp_path, storage={"chunk_samples": 4}, fields={}))
    first = pipeline.build(config)
    assert not compared  # a first release has no parent to compare with
    add_pairs(tmp_path, [f"new{i}" for i in range(5)], seed=3)
    add_pairs(tmp_path, ["s007"], seed=4)  # changed
    (tmp_path / "raw" / "images" / "s011.png").unlink()  # withdrawn
    (tmp_path / "raw" / "masks" / "s011.png").unlink()
    second = pipeline.build(config)
    assert second.path is not None
    assert first.path is not None
    assert second.reused > 0  # carried rows came through the watcher too
    [(written, stored)] = compared
    assert sum(written.values()) == stored == 45  # read from the watcher, not the file
    with h5py.File(second.path, "r") as handle:
        label, summary = handle.attrs["change"], handle.attrs["change_summary"]
    change = diff_paths(first.path, second.path)
    assert (label, summary) == (change.label, change.summary())
    assert summary == "major: 1 sample removed"  # s011 was withdrawn
    assert [len(change.added), len(change.changed), len(change.removed)] == [5, 1, 1]
