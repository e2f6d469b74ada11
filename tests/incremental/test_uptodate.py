"""Up to date: a rebuild of unchanged inputs and config publishes nothing and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, RawFolder, WriteConfig, random_pair, save

from h5etl import build, load_spec
from h5etl.check.health import check_release
from h5etl.execute import pool as workers

MESSAGE = "(6 samples, same config and inputs): no new release; --full rebuilds"


def cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5etl", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


def releases(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "releases").glob("cells-v*.h5"))


def folder_state(root: Path) -> dict[str, Any]:
    """Every file of the output folder but the status file, with its bytes, and the link."""
    out = root / "releases"
    files = {
        p.name: p.read_bytes()
        for p in out.iterdir()
        if p.is_file() and not p.is_symlink() and not p.name.endswith(".status.json")
    }
    return {"files": files, "link": os.readlink(out / "cells.h5")}


def test_an_unchanged_rebuild_publishes_nothing_and_says_so(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    first = build(load_spec(config), jobs=1)
    assert first.path is not None
    before = folder_state(tmp_path)
    started: list[int] = []
    monkeypatch.setattr(workers, "warm_up", started.append)
    again = build(load_spec(config), jobs=2)
    assert started == []  # nothing to decode: the worker pool was never started
    assert again.up_to_date
    assert (again.version, again.path, again.reused) == (1, first.path, 0)
    assert again.samples == first.samples
    assert folder_state(tmp_path) == before  # no new file, the link untouched
    status = json.loads((tmp_path / "releases" / "cells.status.json").read_text())
    assert status["state"] == "succeeded"
    assert status["result"]["up_to_date"] is True
    assert status["result"]["version"] == 1
    # the command line: one line, exit 0; `status` says so too
    done = cli("build", config, "-j", "1")
    assert (done.returncode, done.stdout) == (
        0,
        f"cells: nothing changed since cells-v0001 {MESSAGE}\n",
    )
    assert folder_state(tmp_path) == before
    shown = cli("status", tmp_path / "releases")
    assert shown.returncode == 0
    assert "up to date: nothing changed since v0001" in shown.stdout
    assert "no new release" in shown.stdout


def _touch_bytes(raw: RawFolder) -> None:
    rng = np.random.default_rng(5)
    save(raw.image("s002"), random_pair(rng, (9, 9))[0])


def _new_sample(raw: RawFolder) -> None:
    image, mask = random_pair(np.random.default_rng(6), (8, 8))
    save(raw.image("new"), image)
    save(raw.mask("new"), mask)


def _remove_sample(raw: RawFolder) -> None:
    raw.image("s004").unlink()
    raw.mask("s004").unlink()


Change = Callable[[RawFolder], None]


@pytest.mark.parametrize(
    ("change", "overrides", "options", "reused"),
    [
        pytest.param(_touch_bytes, {}, {}, None, id="a-file-with-other-bytes"),
        pytest.param(_new_sample, {}, {}, None, id="a-new-sample"),
        pytest.param(_remove_sample, {}, {}, None, id="a-removed-sample"),
        pytest.param(None, {"description": "another"}, {}, 6, id="another-description"),
        pytest.param(None, {"storage": {"chunk_samples": 3}}, {}, 0, id="other-chunks"),
        pytest.param(None, {"notes": "fixed labels"}, {}, 6, id="new-notes"),
        pytest.param(None, {}, {"full": True}, 0, id="full"),
    ],
)
def test_anything_changed_builds_a_new_release(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    change: Change | None,
    overrides: dict[str, Any],
    options: dict[str, Any],
    reused: int | None,
) -> None:
    raw = make_raw(tmp_path, n=6)
    # a sample lost of 6 is 17 %: past the default max_shrink (test_publish_guard)
    config = write_config(tmp_path, storage={"chunk_samples": 2}, max_shrink=0.5)
    spec = load_spec(config)
    build(spec, jobs=1)
    if change is not None:
        change(raw)
    if overrides:
        config = write_config(
            tmp_path, **{"storage": {"chunk_samples": 2}, "max_shrink": 0.5, **overrides}
        )
    report = build(load_spec(config), jobs=1, **options)
    assert not report.up_to_date
    assert report.version == 2
    assert releases(tmp_path) == ["cells-v0001.h5", "cells-v0002.h5"]
    assert os.readlink(tmp_path / "releases" / "cells.h5") == "cells-v0002.h5"
    if reused is not None:
        assert report.reused == reused
    assert report.path is not None
    assert check_release(report.path, deep=True).ok
    # and that release in turn is up to date
    assert build(load_spec(config), jobs=1).up_to_date


def test_notes_of_the_command_line_build_those_equal_to_the_releases_do_not(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    assert cli("build", config, "-j", "1", "-q", "--notes", "first").returncode == 0
    same = cli("build", config, "-j", "1", "-q", "--notes", "first")
    assert "nothing changed since cells-v0001" in same.stdout
    none = cli("build", config, "-j", "1", "-q")  # no notes: nothing new to say
    assert "nothing changed since cells-v0001" in none.stdout
    other = cli("build", config, "-j", "1", "-q", "--notes", "second")
    assert other.returncode == 0, other.stderr
    assert releases(tmp_path) == ["cells-v0001.h5", "cells-v0002.h5"]
    with h5py.File(tmp_path / "releases" / "cells-v0002.h5", "r") as handle:
        assert handle.attrs["notes"] == "second"


def test_a_touched_file_of_the_same_bytes_is_up_to_date_and_hashed_once(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    config = write_config(tmp_path)
    build(load_spec(config), jobs=1)
    touched = raw.mask("s001")
    later = touched.stat().st_mtime_ns + 10**9
    os.utime(touched, ns=(later, later))
    assert build(load_spec(config), jobs=1).up_to_date  # equal bytes (SHA-256)
    record = json.loads((tmp_path / "releases" / ".cells-v0001.h5.carry.json").read_text())
    assert record["samples"]["s001"][1].split(",")[1] == f"{touched.stat().st_size}:{later}"
    assert releases(tmp_path) == ["cells-v0001.h5"]


def test_decode_time_rejects_unchanged_are_up_to_date_fixed_they_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    broken = {"bad": "truncated_late", "spot": "mask_128", "lonely": "orphan_image"}
    raw = make_raw(tmp_path, n=6, broken=broken)
    config = write_config(tmp_path)
    first = build(load_spec(config), jobs=1)
    assert first.path is not None
    assert {r.reason for r in first.rejects} == {"truncated", "mask_values", "orphan"}
    record = json.loads((tmp_path / "releases" / ".cells-v0001.h5.carry.json").read_text())
    assert sorted(record["rejected"]) == ["bad", "spot"]  # rejected while decoding
    again = build(load_spec(config), jobs=1)
    assert again.up_to_date
    # reported as a build reports them: absolute paths, the same rows
    assert sorted(r.as_json().items() for r in again.rejects) == sorted(
        r.as_json().items() for r in first.rejects
    )
    # and the status file counts them all, not only those found before decoding
    status = json.loads((tmp_path / "releases" / "cells.status.json").read_text())
    assert status["rejects"]["total"] == len(first.rejects) == 5
    assert status["rejects"]["reasons"] == {"mask_values": 2, "orphan": 1, "truncated": 2}
    # the mask is fixed: it builds, and the sample is stored now
    save(raw.mask("spot"), random_pair(np.random.default_rng(8), (12, 14))[1])
    fixed = build(load_spec(config), jobs=1)
    assert not fixed.up_to_date
    assert fixed.version == 2
    assert sum(fixed.samples.values()) == 7
    assert {r.reason for r in fixed.rejects} == {"truncated", "orphan"}
    assert build(load_spec(config), jobs=1).up_to_date


def test_build_many_shows_up_to_date_configs(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    (tmp_path / "configs").mkdir()
    sources = {"image": {"dir": "../raw/images"}, "mask": {"dir": "../raw/masks"}}
    for name in ("one", "two"):  # a sample lost of 6: past the default max_shrink
        write_config(
            tmp_path / "configs",
            config_name=f"{name}.yaml",
            name=name,
            sources=sources,
            max_shrink=0.5,
        )
    assert cli("build", "configs", "-j", "1", "-q", cwd=tmp_path).returncode == 0
    _remove_sample(raw)
    done = cli("build", "configs", "-j", "1", "-q", cwd=tmp_path)
    assert done.returncode == 0
    assert "2 of 2 configs built\n" in done.stdout
    again = cli("build", "configs", "-j", "1", "-q", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    rows = [line.split() for line in again.stdout.splitlines() if line.startswith("configs/")]
    assert [row[1:6] for row in rows] == [
        ["one", "up", "to", "date", "v0002"],
        ["two", "up", "to", "date", "v0002"],
    ]
    assert all(line.endswith("no new release") for line in again.stdout.splitlines()
               if line.startswith("configs/"))  # fmt: skip
    assert "2 of 2 configs built (2 of them up to date: nothing changed)" in again.stdout
