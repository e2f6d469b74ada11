"""Builds that tell the truth: nothing stored fails, dry runs predict, failures explain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, exact_splits, save

from h5etl import BuildFailed, build, load_spec
from h5etl.history.build_report import BuildReport


def _files(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


def _published(folder: Path) -> set[str]:
    return {name for name in _files(folder) if name.endswith(".h5")}


def _report_lines(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _previous_release(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> Path:
    """A folder with a good v0001 and its link, then raw inputs replaced by ``make_raw``."""
    make_raw(tmp_path, n=4)
    config = write_config(tmp_path)
    assert build(load_spec(config)).path is not None
    for folder in ("images", "masks"):
        for png in (tmp_path / "raw" / folder).glob("*.png"):
            png.unlink()
    return config


def test_a_build_whose_pairs_are_all_rejected_publishes_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # every pair was size_mismatch: the build exited 0, published an empty release and
    # moved the link
    config = _previous_release(tmp_path, make_raw, write_config)
    make_raw(tmp_path, n=0, broken={f"b{i}": "size_mismatch" for i in range(3)})
    releases = tmp_path / "releases"
    before = {name: (releases / name).read_bytes() for name in _published(releases)}
    link = os.readlink(releases / "cells.h5")

    with pytest.raises(BuildFailed) as failed:
        build(load_spec(config))

    message = str(failed.value)
    assert message.startswith(f"{config}: no sample to store: 6 of 6 input files")
    assert "size_mismatch 6" in message
    assert os.readlink(releases / "cells.h5") == link
    assert {name: (releases / name).read_bytes() for name in _published(releases)} == before
    assert not [name for name in _files(releases) if ".partial-" in name]
    report = failed.value.report
    assert report is not None
    assert str(report) in message
    assert {row["reason"] for row in _report_lines(report)} == {"size_mismatch"}
    assert len(_report_lines(report)) == 6


def test_a_build_whose_samples_all_fail_at_decode_publishes_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the header probe passes these; only decoding finds the bad mask values
    config = _previous_release(tmp_path, make_raw, write_config)
    make_raw(tmp_path, n=0, broken={f"m{i}": "mask_128" for i in range(5)})
    releases = tmp_path / "releases"

    with pytest.raises(BuildFailed, match="no sample to store: 10 of 10 input files"):
        build(load_spec(config), jobs=2)

    assert _published(releases) == {"cells-v0001.h5", "cells.h5"}
    assert not [name for name in _files(releases) if ".partial-" in name]


def test_the_cli_exits_1_and_names_the_rejects_report(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=0, broken={"a": "size_mismatch"})
    config = write_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "h5etl", "build", str(config), "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "no sample to store" in line
    assert "cells.failed.rejects.jsonl" in line
    assert (tmp_path / "releases" / "cells.failed.rejects.jsonl").is_file()
    assert not _published(tmp_path / "releases")


def test_an_empty_split_is_a_warning(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    config = write_config(tmp_path, splits={"train": 0.999, "valid": 0.001})
    report = build(load_spec(config))
    assert report.samples == {"train": 3, "valid": 0}
    (warning,) = report.warnings
    assert warning.startswith("split 'valid' is empty")


def _messy(tmp_path: Path, make_raw: MakeRaw) -> None:
    """Broken files of which only decoding can tell (masks), and ones a header probe catches
    (a text file; PNGs cut short, whose last bytes are not IEND's)."""
    make_raw(
        tmp_path,
        n=20,
        broken={
            "late1": "truncated_late",
            "late2": "truncated_late",
            "bad1": "mask_128",
            "bad2": "mask_128",
            "text": "text",
        },
    )


def _reasons(report: BuildReport) -> list[tuple[str, str]]:
    return sorted((r.path, r.reason) for r in report.rejects)


def test_a_dry_run_says_what_it_did_not_check(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # it predicted 14 rejects where the build found 24, and said nothing about it
    _messy(tmp_path, make_raw)
    spec = load_spec(write_config(tmp_path))
    dry = build(spec, dry_run=True)
    assert {r.reason for r in dry.rejects} == {"unreadable", "truncated"}
    assert any("--dry-run --decode" in w for w in dry.warnings)
    assert all("decod" not in check for check in dry.checks)
    assert not (tmp_path / "releases").exists()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_decoding_dry_run_predicts_the_build_exactly(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, jobs: int
) -> None:
    _messy(tmp_path, make_raw)
    spec = load_spec(write_config(tmp_path, storage={"chunk_samples": 2}))
    dry = build(spec, dry_run=True, decode=True, jobs=jobs)
    assert not (tmp_path / "releases").exists(), "a dry run writes nothing"
    real = build(spec, jobs=jobs)
    assert _reasons(dry) == _reasons(real)
    assert dry.samples == real.samples
    assert any("decod" in check for check in dry.checks)
    # none but the one the build gives too: decoding rejected samples the splits counted on
    assert dry.warnings == real.warnings


def test_a_dry_run_honours_max_rejects_like_the_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    _messy(tmp_path, make_raw)
    config = write_config(tmp_path, max_rejects=2)
    spec = load_spec(config)
    with pytest.raises(BuildFailed) as dry:
        build(spec, dry_run=True, decode=True)
    with pytest.raises(BuildFailed) as real:
        build(spec)
    assert str(dry.value).startswith(f"{config}: ")
    # the build adds where its report is, before the docs pointer both end with
    dry_text, pointer = str(dry.value).rsplit(" (see ", 1)
    assert str(real.value).startswith(dry_text)
    assert str(real.value).endswith(f" (see {pointer}")
    assert dry.value.rejects, "the per-file rejects travel with the error"
    # the header-only dry run fails too: one unreadable pair is 2 files, over a limit of 1
    config_1 = write_config(tmp_path, max_rejects=1)
    with pytest.raises(BuildFailed, match="over max_rejects 1"):
        build(load_spec(config_1), dry_run=True)


def test_a_build_failed_on_max_rejects_writes_its_per_file_reasons(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # it left no per-file reasons and sent the user to --dry-run, which printed a tally
    _messy(tmp_path, make_raw)
    config = write_config(tmp_path, max_rejects=3)
    with pytest.raises(BuildFailed) as failed:
        build(load_spec(config), jobs=2)
    message = str(failed.value)
    assert message.startswith(f"{config}: ")
    assert "--dry-run" not in message
    assert failed.value.report is not None
    rows = _report_lines(failed.value.report)
    assert len(rows) > 3
    assert all(row["path"] and row["reason"] and row["detail"] for row in rows)
    assert not _published(tmp_path / "releases")


def test_decode_rejects_leave_every_chunk_to_the_workers(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # after a decode reject, the tasks in flight arrived off the chunk grid and the writer
    # decompressed and recompressed every chunk after it
    rng = np.random.default_rng(3)
    make_raw(tmp_path, n=60)
    for i in range(0, 60, 7):  # one bad pixel in every seventh mask
        mask = np.zeros((20, 20), np.uint8)
        mask[rng.integers(20), rng.integers(20)] = 77
        save(tmp_path / "raw" / "masks" / f"s{i:03d}.png", mask)
        save(tmp_path / "raw" / "images" / f"s{i:03d}.png", np.zeros((20, 20, 3), np.uint8))
    spec = load_spec(write_config(tmp_path, storage={"chunk_samples": 4}))
    one = build(spec, jobs=1)
    two = build(spec, jobs=2, full=True)  # the same inputs again: up to date without --full
    assert len(one.rejects) == 2 * 9
    for report in (one, two):
        assert sum(report.samples.values()) == 60 - 9
        assert not any(n for path, n in report.chunk_paths.items() if path.endswith("rechunked"))
    assert one.datasets.keys() == two.datasets.keys()
    assert all(one.datasets[d]["sha256"] == two.datasets[d]["sha256"] for d in one.datasets)


def test_a_split_whose_samples_were_all_rejected_is_split_again(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the warning said "none of the samples fell in it ... change the fractions" when every
    # sample planned for the split had been rejected at decode; now the build splits the
    # samples it stores by the rule over them (issue 25: splits exact for what is stored)
    splits = {"train": 0.5, "valid": 0.5}
    make_raw(tmp_path, n=0)
    valid = 0
    where = exact_splits([f"x{i:02d}" for i in range(12)], splits, 0)
    for i in range(12):
        name = f"x{i:02d}"
        bad = where[name] == "valid"
        valid += bad
        mask = np.zeros((20, 20), np.uint8)
        mask[0, 0] = 128 if bad else 255
        save(tmp_path / "raw" / "images" / f"{name}.png", np.zeros((20, 20, 3), np.uint8))
        save(tmp_path / "raw" / "masks" / f"{name}.png", mask)
    assert 0 < valid < 12
    report = build(load_spec(write_config(tmp_path, splits=splits)))
    stored = 12 - valid
    assert report.samples == {"train": (stored + 1) // 2, "valid": stored // 2}
    (warning,) = report.warnings
    assert warning.startswith(f"decoding rejected {valid} planned samples: split again")


def test_sources_that_match_no_file_say_where_they_looked(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # "0 of 0 input files were rejected", pointing at an empty rejects report
    make_raw(tmp_path, n=2)
    sources = {s: {"dir": f"raw/{s}s", "glob": "*.jpg"} for s in ("image", "mask")}
    config = write_config(tmp_path, sources=sources)
    with pytest.raises(BuildFailed) as caught:
        build(load_spec(config), jobs=1)
    assert "the sources matched no file (sources.image: '*.jpg' in " in str(caught.value)


def test_a_plain_build_says_it_removed_a_killed_builds_work(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a killed build's temp file and journal were deleted without a word
    make_raw(tmp_path, n=3)
    spec = load_spec(write_config(tmp_path))
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / ".cells.partial-1-abcdef.h5").write_bytes(b"dead")
    report = build(spec, jobs=1)
    assert any("--resume continues a killed build" in w for w in report.warnings)
    again = build(spec, jobs=1)  # nothing left over: nothing to say
    assert not any("killed build" in w for w in again.warnings)


def test_an_up_to_date_build_also_says_it_removed_a_killed_builds_work(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    spec = load_spec(write_config(tmp_path))
    first = build(spec, jobs=1)
    dead = tmp_path / "releases" / ".cells.partial-2-abcdef.h5"
    dead.write_bytes(b"dead")
    again = build(spec, jobs=1)
    assert again.up_to_date
    assert again.version == first.version
    assert not dead.exists()
    assert any(".cells.partial-2-abcdef.h5" in w and "--resume" in w for w in again.warnings)


def test_resume_with_nothing_to_resume_is_up_to_date_when_nothing_changed(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=3)
    spec = load_spec(write_config(tmp_path))
    first = build(spec, jobs=1)
    again = build(spec, jobs=1, resume=True)  # no killed build here: a plain build
    assert again.up_to_date
    assert again.version == first.version
    assert sorted(p.name for p in (tmp_path / "releases").glob("cells-v*.h5")) == ["cells-v0001.h5"]
