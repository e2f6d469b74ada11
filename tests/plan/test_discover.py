"""discover: pairing by key, orphans, duplicates, hidden files, deterministic order."""

from __future__ import annotations

import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
from conftest import base_config, merge
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.config.load import parse_spec
from h5etl.config.spec import Spec
from h5etl.inputs.globs import glob_regex
from h5etl.plan import discover


def spec_for(root: Path, glob: str = "*.png") -> Spec:
    """A spec whose sources are ``root/raw/images`` and ``root/raw/masks``."""
    (root / "raw" / "images").mkdir(parents=True, exist_ok=True)
    (root / "raw" / "masks").mkdir(parents=True, exist_ok=True)
    data = merge(base_config(), {"sources": {"image": {"glob": glob}, "mask": {"glob": glob}}})
    return parse_spec(data, config_path=root / "config.yaml")


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


names = st.text(alphabet="abcAB01_-é", min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    images=st.sets(names, max_size=8),
    masks=st.sets(names, max_size=8),
    hidden=st.sets(names, max_size=2),
    other=st.sets(names, max_size=2),
)
def test_every_file_lands_in_one_sample_or_one_reject(
    images: set[str], masks: set[str], hidden: set[str], other: set[str]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        spec = spec_for(root)
        for source, wanted in (("images", images), ("masks", masks)):
            for key in wanted:
                touch(root / "raw" / source / f"{key}.png")
            for key in hidden:
                touch(root / "raw" / source / f".{key}.png")
            for key in other:
                touch(root / "raw" / source / f"{key}.txt")
        found = discover.find_samples(spec)
    keys = [s.key for s in found.samples]
    assert keys == sorted(images & masks)
    placed = [f.path for s in found.samples for f in s.files] + [r.path for r in found.rejects]
    expected = [str(root / "raw/images" / f"{k}.png") for k in images]
    expected += [str(root / "raw/masks" / f"{k}.png") for k in masks]
    assert sorted(placed) == sorted(expected)
    assert found.files_seen == len(images) + len(masks)
    assert all(r.reason == "orphan" for r in found.rejects)
    assert sorted(r.key for r in found.rejects) == sorted(images ^ masks)
    for sample in found.samples:
        assert [f.source for f in sample.files] == ["image", "mask"]
        assert [f.relpath for f in sample.files] == [f"{sample.key}.png"] * 2


@pytest.mark.parametrize("pairs", [0, 3, 256, 700])
def test_progress_counts_every_listed_file_in_batches(
    tmp_path: Path, pairs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discover, "PROGRESS_EVERY", 128)
    spec = spec_for(tmp_path)
    for n in range(pairs):
        touch(tmp_path / "raw/images" / f"{n}.png")
        touch(tmp_path / "raw/masks" / f"{n}.png")
    calls: list[int] = []
    found = discover.find_samples(spec, calls.append)
    assert sum(calls) == found.files_seen == 2 * pairs
    assert all(0 < c <= 128 for c in calls)
    assert len(calls) == -(-2 * pairs // 128)  # one call a batch, not one a file


def test_order_is_sorted_and_independent_of_creation(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    for key in ["c", "a", "b", "B", "a0"]:
        touch(tmp_path / "raw/masks" / f"{key}.png")
    for key in ["a0", "B", "b", "a", "c"]:
        touch(tmp_path / "raw/images" / f"{key}.png")
    keys = [s.key for s in discover.find_samples(spec).samples]
    assert keys == sorted(["a", "a0", "b", "B", "c"])


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, glob="*")
    touch(tmp_path / "raw/images/a.png")
    touch(tmp_path / "raw/images/a.jpg")
    touch(tmp_path / "raw/masks/a.png")
    touch(tmp_path / "raw/images/b.png")
    touch(tmp_path / "raw/masks/b.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["b"]
    reasons = {Path(r.path).relative_to(tmp_path).as_posix(): r.reason for r in found.rejects}
    assert reasons == {
        "raw/images/a.png": "duplicate_key",
        "raw/images/a.jpg": "duplicate_key",
        "raw/masks/a.png": "duplicate_key",
    }


def test_subfolders_pair_by_relative_path(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, glob="**/*.png")
    for source in ("images", "masks"):
        touch(tmp_path / "raw" / source / "x/a.png")
        touch(tmp_path / "raw" / source / "a.png")
        touch(tmp_path / "raw" / source / ".hidden/b.png")
    touch(tmp_path / "raw/images/y/a.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["a", "x/a"]
    assert [r.key for r in found.rejects] == ["y/a"]


def test_unicode_keys_pair_across_normal_forms(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    name = "café"
    touch(tmp_path / "raw/images" / f"{unicodedata.normalize('NFD', name)}.png")
    touch(tmp_path / "raw/masks" / f"{unicodedata.normalize('NFC', name)}.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == [name]
    assert found.rejects == []


def test_symlinked_files_kept_and_folders_not_walked(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, glob="**/*.png")
    touch(tmp_path / "elsewhere/a.png")
    touch(tmp_path / "elsewhere/sub/c.png")
    os.symlink(tmp_path / "elsewhere/a.png", tmp_path / "raw/images/a.png")
    os.symlink(tmp_path / "elsewhere/gone.png", tmp_path / "raw/images/b.png")
    os.symlink(tmp_path / "elsewhere/sub", tmp_path / "raw/images/sub")
    os.symlink(tmp_path / "raw/images", tmp_path / "raw/images/loop")
    for key in ("a", "b"):
        touch(tmp_path / "raw/masks" / f"{key}.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["a", "b"]  # clean rejects the dangling one
    assert found.rejects == []


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        pytest.param("*.png", "a.png", True, id="star"),
        pytest.param("*.png", "sub/a.png", False, id="star-stays-in-folder"),
        pytest.param("**/*.png", "a.png", True, id="globstar-top"),
        pytest.param("**/*.png", "x/y/a.png", True, id="globstar-deep"),
        pytest.param("?.png", "ab.png", False, id="question"),
        pytest.param("[ab].png", "b.png", True, id="class"),
        pytest.param("[!ab].png", "b.png", False, id="negated-class"),
        pytest.param("*.png", "a.PNG", False, id="case-sensitive"),
        pytest.param("a+b.png", "a+b.png", True, id="regex-chars-escaped"),
    ],
)
def test_glob_regex(pattern: str, path: str, matches: bool) -> None:
    assert bool(glob_regex(pattern).match(path)) is matches


# --- entries that are not regular files ---------------------------------------------------
# A FIFO among the inputs hung the build: the header probe's open() waited for a writer.


def test_fifo_is_rejected_with_its_partner(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    os.mkfifo(tmp_path / "raw/images/pipe.png")
    touch(tmp_path / "raw/masks/pipe.png")
    os.mkfifo(tmp_path / "raw/masks/lonely.png")  # no partner: still named for what it is
    for source in ("images", "masks"):
        touch(tmp_path / "raw" / source / "good.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["good"]
    assert found.files_seen == 5
    by_path = {Path(r.path).relative_to(tmp_path).as_posix(): r for r in found.rejects}
    assert sorted(by_path) == ["raw/images/pipe.png", "raw/masks/lonely.png", "raw/masks/pipe.png"]
    assert {r.reason for r in found.rejects} == {"not_a_file"}
    assert {r.stage for r in found.rejects} == {"discover"}
    fifo = by_path["raw/images/pipe.png"]
    assert fifo.detail.startswith("not a regular file but a named pipe (FIFO)")
    assert fifo.key == "pipe"
    partner = by_path["raw/masks/pipe.png"]
    assert partner.detail.endswith(f"(in {tmp_path / 'raw/images/pipe.png'})")
    assert "named pipe" in by_path["raw/masks/lonely.png"].detail


def test_links_to_non_files_are_rejected(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, glob="*")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "folder").mkdir()
    os.symlink(tmp_path / "pipe", tmp_path / "raw/images/a.png")
    os.symlink(tmp_path / "folder", tmp_path / "raw/images/b.png")
    for key in ("a", "b"):
        touch(tmp_path / "raw/masks" / f"{key}.png")
    found = discover.find_samples(spec)
    assert found.samples == []
    details = {Path(r.path).name: r.detail for r in found.rejects if "raw/images" in r.path}
    assert details["a.png"].startswith("not a regular file but a symbolic link to a named pipe")
    assert details["b.png"].startswith("not a regular file but a symbolic link to a folder")
    assert {r.reason for r in found.rejects} == {"not_a_file"}


def test_dangling_and_looping_links_are_left_to_clean(tmp_path: Path) -> None:
    # clean rejects them as dangling_symlink / symlink_loop; discover keeps them as samples
    spec = spec_for(tmp_path)
    os.symlink(tmp_path / "gone.png", tmp_path / "raw/images/a.png")
    os.symlink(tmp_path / "raw/images/c.png", tmp_path / "raw/images/b.png")
    os.symlink(tmp_path / "raw/images/b.png", tmp_path / "raw/images/c.png")
    for key in ("a", "b", "c"):
        touch(tmp_path / "raw/masks" / f"{key}.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["a", "b", "c"]
    assert found.rejects == []


def test_listing_walks_like_os_walk(tmp_path: Path) -> None:
    root = tmp_path / "src"
    for relpath in ("a.png", "x/b.png", "x/y/c.png", ".hidden/d.png", "x/.e.png", "f.txt"):
        touch(root / relpath)
    os.symlink(root / "x", root / "linked")  # a linked folder is an entry, never walked
    listing = discover.list_source(root, "**/*")
    assert listing.relpaths == ["a.png", "f.txt", "linked", "x/b.png", "x/y/c.png"]
    assert list(listing.not_files) == ["linked"]


class _BreaksOff:
    """An ``os.scandir`` iterator whose listing fails after ``good`` entries (an NFS hiccup)."""

    def __init__(self, inner: os._ScandirIterator[str], good: int):
        self.inner, self.good = inner, good

    def __enter__(self) -> _BreaksOff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def __iter__(self) -> _BreaksOff:
        return self

    def __next__(self) -> os.DirEntry[str]:
        if self.good == 0:
            raise OSError(5, "Input/output error")
        self.good -= 1
        return next(self.inner)


def test_folders_that_cannot_be_listed_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_for(tmp_path, glob="**/*.png")
    for source in ("images", "masks"):
        touch(tmp_path / "raw" / source / "good.png")
        touch(tmp_path / "raw" / source / "locked" / "hidden_from_us.png")
        for i in range(3):
            touch(tmp_path / "raw" / source / "flaky" / f"f{i}.png")
    real = os.scandir

    def scandir(path: str) -> object:
        if path.endswith("images/locked"):
            raise PermissionError(13, "Permission denied", path)
        if path.endswith("masks/flaky"):
            return _BreaksOff(real(path), good=1)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = discover.find_samples(spec)

    folders = {
        Path(r.path).relative_to(tmp_path).as_posix(): r
        for r in found.rejects
        if r.reason == "unreadable"
    }
    assert sorted(folders) == ["raw/images/locked", "raw/masks/flaky"]
    assert folders["raw/images/locked"].detail.endswith("Permission denied")
    assert folders["raw/masks/flaky"].detail.endswith("Input/output error")
    assert {r.stage for r in folders.values()} == {"discover"}
    # what could be listed is paired as usual; the partners of the unseen files are orphans
    assert "good" in [s.key for s in found.samples]
    orphans = {Path(r.path).name for r in found.rejects if r.reason == "orphan"}
    assert "hidden_from_us.png" in orphans


def test_folders_the_glob_cannot_reach_are_neither_walked_nor_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_for(tmp_path)  # "*.png": top-level files only
    for source in ("images", "masks"):
        touch(tmp_path / "raw" / source / "good.png")
        touch(tmp_path / "raw" / source / "lost+found" / "x.png")
    real = os.scandir
    entered: list[str] = []

    def scandir(path: str) -> object:
        entered.append(path)
        if path.endswith("lost+found"):  # root-owned on every ext4 mount
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = discover.find_samples(spec)

    assert [s.key for s in found.samples] == ["good"]
    assert found.rejects == []
    assert not [p for p in entered if p.endswith("lost+found")]


@given(
    folder=st.lists(st.sampled_from(["a", "b", "ab", "x.png"]), min_size=1, max_size=3),
    file=st.sampled_from(["a", "b.png", "x.png"]),
    pattern=st.sampled_from(
        ["*.png", "a/*.png", "a*/*", "*/b.png", "**/*.png", "a/**/b.png", "a/**", "?/?.png", "*"]
    ),
)
def test_folder_may_match_never_hides_a_match(folder: list[str], file: str, pattern: str) -> None:
    reldir = "/".join(folder)
    if glob_regex(pattern).match(f"{reldir}/{file}"):
        assert discover.folder_may_match(reldir, pattern)


@pytest.mark.parametrize(
    ("reldir", "pattern", "may"),
    [
        ("lost+found", "*.png", False),
        ("sub", "sub/*.png", True),
        ("other", "sub/*.png", False),
        ("sub/deeper", "sub/*.png", False),
        ("any/depth", "**/*.png", True),
        ("a/b/c", "a/**/x.png", True),
        ("b", "a/**/x.png", False),
    ],
)
def test_folder_may_match(reldir: str, pattern: str, may: bool) -> None:
    assert discover.folder_may_match(reldir, pattern) is may


@given(
    root=st.text(alphabet="ab/.é ", max_size=6),
    relpath=st.text(alphabet="ab/.é ", max_size=6),
)
def test_join_path_is_os_path_join(root: str, relpath: str) -> None:
    from h5etl.dataflow import join_path

    assert join_path(root, relpath) == os.path.join(root, relpath)
