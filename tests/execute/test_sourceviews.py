"""sourceviews: a worker's view of a source folder against the build's (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5etl.execute import sourceviews


def _folder(root: Path, files: dict[str, bytes], folders: tuple[str, ...] = ()) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    for name in folders:
        (root / name).mkdir()
    return str(root)


def test_the_same_folder_is_no_difference_and_files_added_since_are_none(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "raw", {f"s{i:03d}.png": b"x" * i for i in range(200)})
    view = sourceviews.view_of(folder)
    assert view.entries == 200
    assert len(view.probes) == sourceviews.PROBES  # spread over the names, not all 200
    assert ("s000.png", 0) in view.probes
    assert ("s199.png", 199) in view.probes  # the first and the last
    assert sourceviews.difference(folder, view) is None
    (tmp_path / "raw" / "s200.png").write_bytes(b"new")  # a folder being filled
    (tmp_path / "raw" / ".nfs000123").write_bytes(b"")  # hidden entries do not count
    assert sourceviews.difference(folder, view) is None


def test_an_empty_mount_point_is_named_with_what_the_build_sees(tmp_path: Path) -> None:
    view = sourceviews.view_of(_folder(tmp_path / "share", {"a.png": b"1", "b.png": b"22"}))
    empty = _folder(tmp_path / "unmounted", {})
    assert sourceviews.difference(empty, view) == (
        f"sees the source folder {empty} empty where this build sees 2 entries "
        f"(a share that did not mount on that host?)"
    )


@pytest.mark.parametrize(
    ("there", "folders", "said"),
    [
        pytest.param({"a.png": b"1"}, (), "sees 1 entries in the source folder", id="missing"),
        pytest.param({"a.png": b"1", "b.png": b"3"}, (), "b.png as 1 bytes", id="size"),
        pytest.param({"a.png": b"1"}, ("b.png",), "b.png as a folder", id="folder"),
    ],
)
def test_another_copy_of_the_data_is_a_difference(
    tmp_path: Path, there: dict[str, bytes], folders: tuple[str, ...], said: str
) -> None:
    view = sourceviews.view_of(_folder(tmp_path / "build", {"a.png": b"1", "b.png": b"22"}))
    other = _folder(tmp_path / "other", there, folders)
    problem = sourceviews.difference(other, view)
    assert problem is not None
    assert said in problem
    assert "another copy of the data?" in problem


def test_a_folder_the_worker_cannot_see(tmp_path: Path) -> None:
    view = sourceviews.view_of(_folder(tmp_path / "raw", {"a.png": b"1"}))
    missing = str(tmp_path / "elsewhere")
    assert sourceviews.difference(missing, view) == f"cannot see the source folder {missing}"
    # a folder the build does not see either: discovery says so, not this check
    assert sourceviews.view_of(missing) == sourceviews.View(-1, ())
    assert sourceviews.difference(missing, sourceviews.view_of(missing)) is None
