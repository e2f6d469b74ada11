"""``h5etl prune DIR --keep N``: a dry run by default, never the linked release, ``--yes``
deletes the rest (each with its rejects report), never under a running build."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import MakeRaw, WriteConfig, sha256_file
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.release.lock import BuildLock
from h5etl.units import human_size

runner = CliRunner()


def _cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def four(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> Path:
    """Four releases of ``cells`` (with rejects reports), the link rolled back to v0002."""
    make_raw(tmp_path, n=3, broken=["text"])
    config = write_config(tmp_path)
    for _ in range(4):
        assert _cli("build", config, "-j", "1", "-q", "--full")[0] == 0  # else: up to date
    folder = tmp_path / "releases"
    assert _cli("rollback", folder / "cells.h5", "--to", "2")[0] == 0
    return folder


def _files(folder: Path) -> dict[str, str]:
    """Every release file and the files beside it, by name: their SHA-256 (not the lock)."""
    return {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.endswith(".lock")
    }


def test_dry_run_by_default(four: Path) -> None:
    before = _files(four)
    code, out, _ = _cli("prune", four, "--keep", "1")
    assert code == 0, out
    assert _files(four) == before  # nothing deleted
    lines = out.splitlines()
    beside = "cells-v0001.rejects.jsonl + cells-v0001.build.json + .cells-v0001.h5.carry.json"
    assert lines[0].startswith(f"delete  cells-v0001.h5 + {beside}  ")
    assert lines[1] == "keep    cells-v0002.h5  (cells.h5 points at it)"
    assert lines[2].startswith(f"delete  cells-v0003.h5 + {beside.replace('0001', '0003')}  ")
    assert lines[3] == "keep    cells-v0004.h5  (newest 1)"
    gone = ("cells-v0001", "cells-v0003")
    size = sum((four / n).stat().st_size for n in before if n.lstrip(".").startswith(gone))
    assert lines[4].startswith("dry run: 2 releases (")
    assert lines[4].endswith("would be deleted; --yes deletes them")
    assert human_size(size) in lines[4]


def test_yes_deletes_all_but_the_newest_and_the_linked(four: Path) -> None:
    before = _files(four)
    code, out, _ = _cli("prune", four, "--keep", "1", "--yes")
    assert code == 0, out
    after = _files(four)
    gone = ("cells-v0001", "cells-v0003")
    kept = {n: h for n, h in before.items() if not n.lstrip(".").startswith(gone)}
    assert after == kept  # the kept files are byte for byte what they were
    assert os.readlink(four / "cells.h5") == "cells-v0002.h5"
    assert "deleted 2 releases" in out.splitlines()[-1]
    code, out, _ = _cli("releases", four)
    assert code == 0
    assert re.findall(r"^[* ] (\S+\.h5) ", out, re.MULTILINE) == [
        "cells-v0002.h5",
        "cells-v0004.h5",
    ]
    assert _cli("check", four / "cells.h5", "--deep")[0] == 0
    # nothing more to do, and a build still numbers on
    assert _cli("prune", four, "--keep", "1")[1].splitlines()[-1] == "nothing to delete"


def test_keep_more_than_there_are(four: Path) -> None:
    before = _files(four)
    code, out, _ = _cli("prune", four, "--keep", "9", "--yes")
    assert code == 0
    assert _files(four) == before
    assert out.splitlines()[-1].startswith("deleted 0 releases")


def test_an_orphan_report_goes_too(four: Path) -> None:
    (four / "cells-v0001.h5").unlink()  # as a prune stopped between the two files leaves it
    code, out, _ = _cli("prune", four, "--keep", "2", "--yes")
    assert code == 0, out
    assert not (four / "cells-v0001.rejects.jsonl").exists()
    assert not (four / "cells-v0001.build.json").exists()
    assert not (four / ".cells-v0001.h5.carry.json").exists()
    left = sorted(p.name for p in four.glob("cells-v*.h5"))
    assert left == ["cells-v0002.h5", "cells-v0003.h5", "cells-v0004.h5"]


def test_never_under_a_running_build(four: Path) -> None:
    before = _files(four)
    with BuildLock(four / ".cells.lock", "cells").held():
        code, _, err = _cli("prune", four, "--keep", "1", "--yes")
    assert code == 1
    assert err.count("\n") == 1
    assert "another build" in err or "lock" in err, err
    assert _files(four) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--keep", "0"], "--keep", id="keep-0"),
        pytest.param([], "missing option '--keep'", id="no-keep"),
    ],
)
def test_usage_errors(four: Path, args: list[str], message: str) -> None:
    code, _, err = _cli("prune", four, *args)
    assert code == 2
    assert message in err


def test_not_a_folder(tmp_path: Path) -> None:
    code, _, err = _cli("prune", tmp_path / "nowhere", "--keep", "1")
    assert code == 2
    assert "not a folder" in err
