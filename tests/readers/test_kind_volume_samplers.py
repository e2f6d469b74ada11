"""The volume samplers' pure rules: where a patch starts, where labels are, window/level."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.readers.volume_patches import label_locations, patch_start
from h5etl.readers.volumes import Window

sizes = st.tuples(*(st.integers(1, 40) for _ in range(3)))


@settings(max_examples=200, deadline=None)
@given(shape=sizes, size=sizes, seed=st.integers(0, 1000), centred=st.booleans())
def test_a_patch_lies_inside_the_case_or_is_centred_where_the_case_is_smaller(
    shape: tuple[int, int, int], size: tuple[int, int, int], seed: int, centred: bool
) -> None:
    rng = np.random.default_rng(seed)
    centre = [int(rng.integers(n)) for n in shape] if centred else None
    start = patch_start(shape, size, rng, centre)
    for axis, (n, p, s) in enumerate(zip(shape, size, start, strict=True)):
        if n >= p:
            assert 0 <= s <= n - p  # never padded where it need not be
            if centre is not None:
                # the label voxel is inside the patch
                assert s <= centre[axis] < s + p
        else:
            assert s == (n - p) // 2  # centred, padded on both sides as nnU-Net pads


def test_label_locations_find_only_voxels_of_each_label() -> None:
    labels = np.zeros((70, 9, 8), dtype=np.uint8)  # more than one slab of 32
    labels[3, 4, 5] = 1
    labels[40:60, 2:5, 1:3] = 2
    found = label_locations(labels, 0, len(labels), np.random.default_rng(0), keep=50)
    assert sorted(found) == [1, 2]
    assert found[1].tolist() == [[3, 4, 5]]
    assert len(found[2]) == 50
    for z, y, x in found[2].tolist():
        assert labels[z, y, x] == 2


def test_label_locations_are_relative_to_the_case_start() -> None:
    flat = np.zeros((10, 4, 4), dtype=np.uint8)
    flat[7, 1, 2] = 3  # case 2 spans rows 6..9 of the split's slices
    found = label_locations(flat, 6, 10, np.random.default_rng(0))
    assert found == {3: found[3]}
    assert found[3].tolist() == [[1, 1, 2]]


def test_label_locations_weigh_slabs_by_their_voxels() -> None:
    # one voxel in the first slab, 3000 in the second: draws follow the voxel counts
    labels = np.zeros((64, 60, 60), dtype=np.uint8)
    labels[0, 0, 0] = 1
    labels[40, :50, :60] = 1
    found = label_locations(labels, 0, 64, np.random.default_rng(1), keep=1000)
    first_slab = int(np.count_nonzero(found[1][:, 0] < 32))
    assert first_slab <= 5  # about 1000 / 3001 of a voxel expected


def test_window_maps_the_window_to_zero_one() -> None:
    hu = np.array([-1000, -160, 40, 240, 3000], dtype=np.int16)
    out = Window(level=40, width=400)(hu)
    assert out.dtype == np.float32
    assert out.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]
