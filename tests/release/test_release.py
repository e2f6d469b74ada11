"""release: versioned names, the atomic relative link, rollback, the build lock."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from h5etl.dataflow import Reject
from h5etl.errors import LockHeld, ReleaseError
from h5etl.release import listing as release
from h5etl.release import naming
from h5etl.release.folder import OutputFolder


def _publish(output: OutputFolder, content: bytes, rejects: list[Reject] | None = None) -> Path:
    version = output.next_version()
    with output.staged() as temp:
        temp.write_bytes(content)
        info = output.publish(temp, rejects or [], version=version)
    assert not temp.exists()
    return info.path


def test_publish_versions_and_moves_the_link(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path / "releases", "cells")
    with output.locked():
        first = _publish(output, b"one", [Reject("/raw/a.png", "clean", "oversize", "big", "a")])
        second = _publish(output, b"two")
    assert first.name == "cells-v0001.h5"
    assert second.name == "cells-v0002.h5"
    assert first.read_bytes() == b"one"
    assert os.readlink(output.link) == "cells-v0002.h5"  # relative: the folder can move
    assert output.link.read_bytes() == b"two"
    report = (tmp_path / "releases" / "cells-v0001.rejects.jsonl").read_text(encoding="utf-8")
    assert [json.loads(line)["reason"] for line in report.splitlines()] == ["oversize"]
    assert (tmp_path / "releases" / "cells-v0002.rejects.jsonl").read_text() == ""
    assert naming.versions(tmp_path / "releases", "cells") == {1: first, 2: second}
    assert naming.current_version(output.link) == 2
    assert not output.lock_path.exists()


def test_the_folder_can_move(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path / "a", "cells")
    with output.locked():
        _publish(output, b"x")
    (tmp_path / "a").rename(tmp_path / "b")
    assert (tmp_path / "b" / "cells.h5").read_bytes() == b"x"


def test_staged_file_is_removed_when_the_build_fails(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")

    def killed_build() -> None:
        with output.staged() as temp:
            temp.write_bytes(b"half")
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        killed_build()
    assert list(tmp_path.iterdir()) == []


def test_publish_never_replaces_a_release(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    existing = tmp_path / "cells-v0001.h5"
    existing.write_bytes(b"old")
    report = tmp_path / "cells-v0001.rejects.jsonl"
    report.write_text("old report\n")
    with output.staged() as temp:
        temp.write_bytes(b"new")
        with pytest.raises(ReleaseError, match="appeared"):
            output.publish(temp, [Reject("x.png", "clean", "orphan")], version=1)
    assert existing.read_bytes() == b"old"
    # the clash once overwrote the existing release's rejects report before failing
    assert report.read_text() == "old report\n"
    assert not output.link.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing.name, report.name]


def test_list_and_rollback(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    other = OutputFolder(tmp_path, "other")
    with output.locked():
        for content in (b"1", b"2", b"3"):
            _publish(output, content)
    with other.locked():
        _publish(other, b"o")
    found = release.list_releases(tmp_path)
    assert [(i.name, i.version, i.current) for i in found] == [
        ("cells", 1, False),
        ("cells", 2, False),
        ("cells", 3, True),
        ("other", 1, True),
    ]
    assert found[0].rejects is not None
    assert release.rollback(output.link).version == 2
    assert output.link.read_bytes() == b"2"
    assert release.rollback(output.link).version == 1
    with pytest.raises(ReleaseError, match="no release older"):
        release.rollback(output.link)
    assert release.rollback(output.link, 3).version == 3
    with pytest.raises(ReleaseError, match="v0007"):
        release.rollback(output.link, 7)
    assert naming.current_version(output.link) == 3


def test_rollback_of_a_link_to_an_unversioned_file(tmp_path: Path) -> None:
    # cells.h5 -> cells-final.h5 with no cells-vNNNN.h5 raised TypeError formatting None
    (tmp_path / "cells-final.h5").write_bytes(b"x")
    link = tmp_path / "cells.h5"
    os.symlink("cells-final.h5", link)
    with pytest.raises(ReleaseError) as caught:
        release.rollback(link)
    assert str(caught.value) == (
        f"{link}: no cells-vNNNN.h5 release to roll back to (the link points at cells-final.h5)"
    )
    assert os.readlink(link) == "cells-final.h5"
    with pytest.raises(ReleaseError, match="no release v0001; have none"):
        release.rollback(link, 1)


def test_rollback_needs_a_link(tmp_path: Path) -> None:
    path = tmp_path / "cells-v0001.h5"
    path.write_bytes(b"x")
    with pytest.raises(ReleaseError, match="not a release link"):
        release.rollback(path)
    with pytest.raises(ReleaseError, match="not a folder"):
        release.list_releases(tmp_path / "missing")


def test_lock_held_by_a_live_process(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    with output.locked(), pytest.raises(LockHeld, match="another build"):  # noqa: SIM117
        with OutputFolder(tmp_path, "cells").locked():
            pass
    with OutputFolder(tmp_path, "other").locked():  # other names are independent
        pass


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    pid = 2**22 + 12345  # above the default pid_max, so no live process has it
    holder = {"pid": pid, "host": socket.gethostname(), "started": "then"}
    output.lock_path.write_text(json.dumps(holder), encoding="utf-8")
    stale = tmp_path / f".cells{naming.PARTIAL_MARK}{pid}.h5"
    stale.write_bytes(b"half")
    with output.locked():
        assert output.remove_stale_partials() == [stale]
    assert not stale.exists()
    assert not output.lock_path.exists()


def test_lock_from_another_host_is_respected(tmp_path: Path) -> None:
    output = OutputFolder(tmp_path, "cells")
    holder = {"pid": 1, "host": "elsewhere.example", "started": "then"}
    output.lock_path.write_text(json.dumps(holder), encoding="utf-8")
    with pytest.raises(LockHeld, match="elsewhere"), output.locked():
        pass
    assert output.lock_path.exists()


@pytest.mark.parametrize(
    ("text", "folder", "expected"),
    [
        ("name: cells\n", "releases", True),  # output left out: releases/ beside the config
        ("name: cells\noutput: out\n", "out", True),
        ("name: cells\noutput: out\n", "releases", False),
        ("name: other\n", "releases", False),
        ("name: [cells\n", "releases", False),  # unreadable YAML: any doubt says no
        ("- a list\n", "releases", False),
    ],
)
def test_has_link_reads_the_config_cheaply(
    tmp_path: Path, text: str, folder: str, expected: bool
) -> None:
    from h5etl.release.naming import has_link

    (tmp_path / folder).mkdir()
    (tmp_path / folder / "cells-v0001.h5").write_bytes(b"")
    (tmp_path / folder / "cells.h5").symlink_to("cells-v0001.h5")
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    assert has_link(config) is expected
