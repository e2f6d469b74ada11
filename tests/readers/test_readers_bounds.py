"""``Release.read_slice`` bounds: Python slicing of the split, the same on every read path.

Each test builds a small real release with the ``conftest`` factories, reads slices through
one read path (mmap, decoded chunks, h5py) and compares them with numpy slicing of what h5py
reads from the same file.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig

import h5etl
from h5etl.readers import Release

LENGTH = 22  # chunks of 4: the last stored chunk holds 2 rows and 2 rows of padding
# Every boundary that matters for 22 rows in chunks of 4: the ends, a chunk edge, the
# padding of the last chunk, past the last chunk, and the same counted from the end.
BOUNDS = [-40, -23, -22, -21, -5, -1, 0, 1, 3, 4, 5, 19, 20, 21, 22, 23, 24, 25, 40]
# (start, stop, rows) spelled out; the grid over BOUNDS covers them too.
EDGES = [
    # read_slice(20, 30) returned 10 image rows (8 of them the edge chunk's zero padding, or
    # a KeyError past the last chunk) but 2 filenames
    (20, 30, 2),  # stop past the end
    (22, 30, 0),  # start at the end
    (30, 40, 0),  # past the last chunk
    (7, 7, 0),  # start == stop
    (9, 3, 0),  # stop before start
    (-3, 22, 3),  # negative start
    (-5, -1, 4),  # both negative
    (-100, 2, 2),  # start before the beginning
    (0, -100, 0),  # stop before the beginning
]

PATHS = [
    pytest.param("none", {}, {}, "mmap", id="uncompressed-mmap"),
    pytest.param("none", {}, {"use_mmap": False}, "h5py", id="uncompressed-h5py"),
    pytest.param("lzf", {}, {}, "decoded", id="lzf-decoded"),
    pytest.param("blosc", {}, {}, "decoded", id="blosc-decoded"),
    pytest.param("lzf", {}, {"use_decoder": False}, "h5py", id="lzf-h5py"),
    # chunks that split a sample are neither mapped nor decoded: h5py reads the image
    pytest.param("lzf", {"image": {"chunks": [4, 3, 12, 12]}}, {}, "h5py", id="tiles-h5py"),
]


def build(
    make_raw: MakeRaw, write_config: WriteConfig, root: Path, codec: str, fields: dict[str, Any]
) -> Path:
    """A release of ``LENGTH`` samples, all in ``train``, in chunks of 4; returns its link."""
    make_raw(root, n=LENGTH)
    config = write_config(
        root,
        splits={"train": 1.0},
        storage={"chunk_samples": 4, "compression": codec},
        fields=fields,
    )
    report = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert report.link is not None
    return report.link


def direct(path: Path) -> dict[str, np.ndarray]:
    """The train split's fields read whole by h5py (text as ``str``)."""
    with h5py.File(path, "r") as handle:
        group = handle["train"]
        return {
            "image": group["image"][...],
            "mask": group["mask"][...],
            "filename": group["filename"].asstr()[...],
        }


def opened(link: Path, flags: dict[str, bool], path: str) -> Release:
    """A reader of ``link`` with ``flags`` set, checked to read image through ``path``."""
    reader = Release(link, "train")
    for name, value in flags.items():
        setattr(reader, name, value)
    reader.datasets()
    mapped, decoded = set(reader._maps), set(reader._stores)
    if path == "mmap":
        assert mapped == {"image", "mask"}
    elif path == "decoded":
        assert decoded == {"image", "mask"}
    else:
        assert "image" not in mapped | decoded
    return reader


def assert_slice(reader: Release, truth: dict[str, np.ndarray], start: int, stop: int) -> None:
    block = reader.read_slice(start, stop)
    wanted = len(range(LENGTH)[start:stop])
    assert {len(v) for v in block.values()} == {wanted}, (start, stop)
    for name in ("image", "mask"):
        assert block[name].shape == (wanted, *truth[name].shape[1:])
        np.testing.assert_array_equal(block[name], truth[name][start:stop], err_msg=f"{name}")
    assert block["filename"].tolist() == truth["filename"][start:stop].tolist()


@pytest.mark.parametrize(("codec", "fields", "flags", "path"), PATHS)
def test_read_slice_bounds_work_as_python_slicing_on_every_path(
    make_raw: MakeRaw,
    write_config: WriteConfig,
    tmp_path: Path,
    codec: str,
    fields: dict[str, Any],
    flags: dict[str, bool],
    path: str,
) -> None:
    link = build(make_raw, write_config, tmp_path, codec, fields)
    truth = direct(link)
    assert len(truth["image"]) == LENGTH
    with opened(link, flags, path) as reader:
        for start, stop, rows in EDGES:
            block = reader.read_slice(start, stop)
            assert {len(v) for v in block.values()} == {rows}, (start, stop)
        for start, stop in itertools.product(BOUNDS, BOUNDS):
            assert_slice(reader, truth, start, stop)


def test_read_slice_takes_numpy_integers_and_refuses_floats(
    make_raw: MakeRaw, write_config: WriteConfig, tmp_path: Path
) -> None:
    link = build(make_raw, write_config, tmp_path, "lzf", {})
    truth = direct(link)
    with Release(link, "train") as reader:
        block = reader.read_slice(np.int64(2), np.int64(6))  # type: ignore[arg-type]
        np.testing.assert_array_equal(block["image"], truth["image"][2:6])
        with pytest.raises(TypeError, match="slice indices must be integers"):
            reader.read_slice(1.5, 4)  # type: ignore[arg-type]
