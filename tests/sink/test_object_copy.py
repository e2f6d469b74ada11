"""HDF5's object copy with the GIL released: the same bytes as h5py's copy, other threads run."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5etl.sink import object_copy

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def parent_file(path: Path, rows: int = 64) -> Path:
    """A file like a release's split: an lzf-chunked image array and a small column."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w", track_order=True) as handle:
        group = handle.create_group("train", track_order=True, track_times=False)
        values = rng.integers(0, 255, (rows, 3, 64, 64), dtype=np.uint8)
        values[:, :, :32] = 0  # compressible, as padded images are
        image = group.create_dataset(
            "image", data=values, chunks=(8, 3, 64, 64), maxshape=(None, 3, 64, 64),
            compression="lzf", shuffle=True, track_times=False,
        )  # fmt: skip
        image.attrs["note"] = "not copied"
        group.create_dataset("key", data=np.arange(rows), track_times=False)
    return path


def copied(source: Path, target: Path, name: str) -> None:
    with h5py.File(source, "r") as parent, h5py.File(target, "w", track_order=True) as handle:
        group = handle.create_group("train", track_order=True, track_times=False)
        object_copy.copy_object(parent[f"train/{name}"], group, name, without_attrs=True)


def test_maps_name_each_libhdf5_once(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libhdf5.so.310.4.0\n"
        "7f01-7f02 r--p 00001000 08:01 1 /usr/lib/libhdf5.so.310.4.0\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libhdf5_hl.so.310.0.4\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /opt/my libs/h5py.libs/libhdf5-9e18f0c6.so.320.0.0\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n"
        "7f05-7f06 r-xp 00000000 08:01 4 /usr/lib/libhdf5.so.old\n"
    )
    assert object_copy.loaded_libraries(str(maps)) == [
        "/usr/lib/libhdf5.so.310.4.0",
        "/opt/my libs/h5py.libs/libhdf5-9e18f0c6.so.320.0.0",
    ]
    assert object_copy.loaded_libraries(str(tmp_path / "no-such-maps")) == []


@LINUX
@pytest.mark.parametrize("name", ["image", "key"])
def test_the_copy_is_h5pys_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    source = parent_file(tmp_path / "parent.h5")
    copied(source, tmp_path / "released.h5", name)
    monkeypatch.setattr(object_copy, "_h5ocopy", lambda: None)  # h5py's own copy
    copied(source, tmp_path / "h5py.h5", name)
    assert (tmp_path / "released.h5").read_bytes() == (tmp_path / "h5py.h5").read_bytes()
    with h5py.File(source, "r") as parent, h5py.File(tmp_path / "released.h5", "r") as handle:
        theirs, ours = parent[f"train/{name}"], handle[f"train/{name}"]
        assert np.array_equal(ours[...], theirs[...])
        assert (ours.chunks, ours.compression, ours.shuffle, ours.maxshape) == (
            theirs.chunks, theirs.compression, theirs.shuffle, theirs.maxshape,
        )  # fmt: skip
        assert dict(ours.attrs) == {}  # without its attributes, as the sink asks


@LINUX
def test_other_threads_run_python_while_it_copies(tmp_path: Path) -> None:
    # an incremental build's decoders stopped for the whole copy while h5py held the GIL
    assert object_copy._h5ocopy() is not None
    source = parent_file(tmp_path / "parent.h5", rows=2048)  # ~25 MB: several ms to copy
    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    during = 0
    try:
        with h5py.File(source, "r") as parent, h5py.File(tmp_path / "out.h5", "w") as handle:
            node = parent["train/image"]
            # A few copies: on a loaded machine the spinner may find no free core during one
            # (a copy holding the GIL throughout would leave it at 0 whatever the load).
            for attempt in range(5):
                before = ticks[0]  # from here to the read below only the copy lets go of the GIL
                released = object_copy.copy_object(
                    node, handle, f"image{attempt}", without_attrs=True
                )
                during = ticks[0] - before
                assert released
                if during:
                    break
    finally:
        stop.set()
        spinner.join()
    assert during > 0


def test_a_failed_copy_raises_oserror(tmp_path: Path) -> None:
    source = parent_file(tmp_path / "parent.h5")
    with h5py.File(source, "r") as parent, h5py.File(tmp_path / "target.h5", "w") as handle:
        handle.create_dataset("image", data=[1])
        with pytest.raises(OSError, match=r"could not copy /train/image into .*target\.h5"):
            object_copy.copy_object(parent["train/image"], handle, "image", without_attrs=True)
        assert handle["image"][...].tolist() == [1]  # what was there stays
