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
        pytest.param({"a.png": b"1"}, ("b.png",), "b.png as an empty folder", id="folder"),
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


def _classes(root: Path, counts: dict[str, int]) -> list[tuple[str, str]]:
    """Class folders ``root/<class>/<class>_<i>.png`` (i bytes); their (root, relpath)."""
    files = []
    for name, n in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            (root / name / f"{name}_{i:03d}.png").write_bytes(b"x" * (i + 1))
            files.append((str(root), f"{name}/{name}_{i:03d}.png"))
    return files


def test_planned_files_spread_over_every_source_and_every_class_folder(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    files = _classes(raw, {"ant": 300, "bee": 2, "cat": 1})
    flat = [(str(tmp_path / "masks"), f"m{i:04d}.png") for i in range(500)]
    chosen = sourceviews.planned([*files, *flat])
    # half the budget each; each class folder at least one file, the big one the rest
    assert sorted(chosen) == [str(tmp_path / "masks"), str(raw)]
    assert len(chosen[str(raw)]) == sourceviews.FILES // 2
    assert {relpath.split("/")[0] for relpath in chosen[str(raw)]} == {"ant", "bee", "cat"}
    assert {"ant/ant_000.png", "ant/ant_299.png", "bee/bee_000.png", "bee/bee_001.png"} <= set(
        chosen[str(raw)]
    )
    assert len(chosen[str(tmp_path / "masks")]) == sourceviews.FILES // 2
    assert {"m0000.png", "m0499.png"} <= set(chosen[str(tmp_path / "masks")])
    assert sourceviews.planned([*files, *flat]) == chosen  # the same plan, the same files
    assert sourceviews.planned([]) == {}


def test_class_folders_made_again_empty_name_a_planned_file(tmp_path: Path) -> None:
    # issue 25, B3: a worker whose share did not mount, with the class folders made again
    # (empty) at the mount point, passed a check of the first level alone
    raw = tmp_path / "raw"
    files = _classes(raw, {"a": 40, "b": 40})
    chosen = sourceviews.planned(files)[str(raw)]
    view = sourceviews.view_of(str(raw), chosen)
    assert len(view.files) == len(chosen) == sourceviews.FILES
    assert ("a/a_000.png", 1) in view.files
    assert sourceviews.difference(str(raw), view) is None
    unmounted = tmp_path / "unmounted"
    (unmounted / "a").mkdir(parents=True)
    (unmounted / "b").mkdir()
    # the first level: a class folder this build sees holding files is empty there
    assert sourceviews.difference(str(unmounted), view) == (
        f"sees the folder {unmounted / 'a'} empty where this build sees files in it (a share "
        f"that did not mount on that host?)"
    )
    # a level deeper (a/x/...): the first level looks alike, the planned files do not
    deeper = sourceviews.View(view.entries, view.probes, (("a/x/a_000.png", 1),))
    (unmounted / "a" / "x").mkdir()
    (unmounted / "b" / "y").mkdir()
    assert sourceviews.difference(str(unmounted), deeper) == (
        f"does not see {unmounted / 'a' / 'x' / 'a_000.png'}, an input of this build (it sees "
        f"the folder {unmounted / 'a' / 'x'} empty: a share that did not mount on that host?)"
    )


def test_a_planned_file_of_another_size_or_gone_is_a_difference(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    files = _classes(raw, {"a": 3})
    view = sourceviews.view_of(str(raw), sourceviews.planned(files)[str(raw)])
    (raw / "a" / "a_001.png").write_bytes(b"changed!")
    assert sourceviews.difference(str(raw), view) == (
        f"sees {raw / 'a' / 'a_001.png'} as 8 bytes where this build sees 2 bytes "
        f"(another copy of the data?)"
    )
    (raw / "a" / "a_001.png").unlink()
    assert sourceviews.difference(str(raw), view) == (
        f"does not see {raw / 'a' / 'a_001.png'}, an input of this build (another copy of "
        f"the data?)"
    )
    # an empty folder the build saw may be filled since: a folder being filled
    (raw / "new").mkdir()
    filling = sourceviews.view_of(str(raw))
    (raw / "new" / "n.png").write_bytes(b"1")
    assert sourceviews.difference(str(raw), filling) is None
