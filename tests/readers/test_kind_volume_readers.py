"""Reading volume releases: whole cases, slices, patches, torch Datasets, preview; compared
with the arrays the cases were written from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_kind_volume import build, ct_config, make_ct

from h5etl.errors import ReaderError
from h5etl.preview.sheet import render_preview
from h5etl.readers.volume_patches import PatchSampler
from h5etl.readers.volumes import SliceSampler, Volumes, Window


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("volumes")
    truth = make_ct(root, cases=5, seed=2)
    report = build(ct_config(root, splits={"train": 1.0}), jobs=1)
    assert report.path is not None
    return report.path, truth


def by_uid(truth: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {case["uid"]: case for case in truth.values()}


def test_whole_cases_come_back_as_written(release: tuple[Path, dict[str, Any]]) -> None:
    path, truth = release
    expected = by_uid(truth)
    with Volumes(path, "train", "ct", mask="mask") as cases:
        assert len(cases) == 5
        seen = set()
        for case in cases:
            want = expected[case["series_uid"]]
            assert np.array_equal(case["image"], want["ct"])
            assert np.array_equal(case["mask"], want["mask"])
            assert case["spacing"].tolist() == [2.5, 0.8, 0.7]
            seen.add(case["series_uid"])
    assert seen == set(expected)


def test_every_slice_once_per_epoch_in_another_order_each_epoch(
    release: tuple[Path, dict[str, Any]],
) -> None:
    path, truth = release
    expected = by_uid(truth)
    sampler = SliceSampler(path, "train", "ct", mask="mask", seed=3)
    with Volumes(path, "train", "ct") as cases:
        uids = cases.series_uid
    orders = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = [(item["case"], item["z"]) for item in sampler]
        orders.append(got)
        assert sorted(got) == sorted(
            (c, z) for c in range(5) for z in range(len(expected[uids[c]]["ct"]))
        )
    assert orders[0] != orders[1]
    for item in SliceSampler(path, "train", "ct", mask="mask"):
        want = expected[uids[item["case"]]]
        assert np.array_equal(item["image"], want["ct"][item["z"]])
        assert np.array_equal(item["mask"], want["mask"][item["z"]])


def test_patches_hold_the_voxels_of_the_case_padded_outside(
    release: tuple[Path, dict[str, Any]],
) -> None:
    path, truth = release
    expected = by_uid(truth)
    with Volumes(path, "train", "ct") as cases:
        uids = cases.series_uid
    size = (4, 10, 12)
    sampler = PatchSampler(path, "train", "ct", patch_size=size, foreground=0, length=30, fill=-7)
    for patch in sampler:
        volume = expected[uids[patch["case"]]]["ct"]
        padded = np.full(np.add(volume.shape, 2 * np.array(size)), -7, dtype=np.int16)
        padded[size[0] : size[0] + volume.shape[0], size[1] : size[1] + volume.shape[1], size[2] :][
            :, :, : volume.shape[2]
        ] = volume
        z, y, x = (s + p for s, p in zip(patch["start"], size, strict=True))
        assert np.array_equal(
            patch["image"], padded[z : z + size[0], y : y + size[1], x : x + size[2]]
        )


def test_foreground_patches_are_centred_on_a_label(release: tuple[Path, dict[str, Any]]) -> None:
    path, _ = release
    size = (2, 4, 4)
    sampler = PatchSampler(
        path, "train", "ct", mask="mask", patch_size=size, foreground=1.0, length=40, seed=5
    )
    labels_seen = set()
    for patch in sampler:
        assert patch["foreground"]
        centre = patch["mask"][size[0] // 2, size[1] // 2, size[2] // 2]
        assert centre > 0  # nnU-Net's rule: the patch is centred on a labelled voxel
        labels_seen.add(int(centre))
    assert labels_seen == {1, 2}  # labels drawn uniformly, not by their voxel counts


def test_no_foreground_without_a_mask_is_refused(release: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="mask="):
        PatchSampler(release[0], "train", "ct", foreground=0.5)


def test_window_is_a_read_time_transform(release: tuple[Path, dict[str, Any]]) -> None:
    path, truth = release
    expected = by_uid(truth)
    window = Window(level=40, width=400)
    with Volumes(path, "train", "ct") as cases:
        uids = cases.series_uid
    for item in SliceSampler(path, "train", "ct", transform=window, shuffle=False):
        raw = expected[uids[item["case"]]]["ct"][item["z"]].astype(np.float32)
        assert np.allclose(item["image"], np.clip((raw + 160) / 400, 0, 1))
        break


def test_torch_datasets_collate_and_share_out_between_workers(
    release: tuple[Path, dict[str, Any]],
) -> None:
    import torch

    from h5etl.readers.volume_torch import (
        VolumeCaseDataset,
        VolumePatchDataset,
        VolumeSliceDataset,
    )

    path, truth = release
    total_slices = sum(len(c["ct"]) for c in truth.values())
    slices = VolumeSliceDataset(path, "train", "ct", mask="mask")
    loader: Any = torch.utils.data.DataLoader(slices, batch_size=4, num_workers=2)
    count = 0
    for batch in loader:
        assert batch["image"].dtype == torch.float32
        assert batch["image"].shape[1:] == (1, 16, 16)
        assert batch["mask"].dtype == torch.int64
        count += len(batch["image"])
    assert count == total_slices  # each slice once, whatever the workers
    patches = VolumePatchDataset(
        path, "train", "ct", mask="mask", patch_size=(2, 8, 8), length=10, transform=Window(40, 400)
    )
    batches = list(torch.utils.data.DataLoader(patches, batch_size=5, num_workers=2))
    assert sum(len(b["image"]) for b in batches) == 10
    assert batches[0]["image"].shape == (5, 1, 2, 8, 8)
    assert float(batches[0]["image"].max()) <= 1.0
    cases = VolumeCaseDataset(path, "train", "ct", mask="mask")
    item = cases[0]
    assert item["image"].shape[0] == 1
    assert item["affine"].shape == (4, 4)


def test_a_field_that_is_no_volume_is_a_reader_error(release: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(ReaderError, match="volume fields: ct, mask"):
        Volumes(release[0], "train", "case")
    with pytest.raises(ReaderError, match="no split"):
        Volumes(release[0], "test", "ct")


def test_preview_shows_the_middle_slice_of_each_case(release: tuple[Path, dict[str, Any]]) -> None:
    picture = render_preview(release[0], n=4)
    assert picture.width > 0
    pixels = np.asarray(picture)
    assert (pixels != 255).any()  # drawn, not blank


def test_every_volume_reader_names_its_case(release: tuple[Path, dict[str, Any]]) -> None:
    # the readers gave a case's index only: a loss could not be reported by case
    import torch

    from h5etl.readers.volume_torch import VolumeCaseDataset, VolumeSliceDataset

    path, truth = release  # truth: by case name (the folder case_N), as the keys are
    with Volumes(path, "train", "ct", mask="mask") as cases:
        assert sorted(cases.keys) == sorted(truth)
        for case in cases:
            assert np.array_equal(case["image"], truth[case["key"]]["ct"])
            assert cases.keys[case["case"]] == case["key"]
    for item in SliceSampler(path, "train", "ct", mask="mask"):
        assert np.array_equal(item["mask"], truth[item["key"]]["mask"][item["z"]])
    size = (2, 4, 4)
    for patch in PatchSampler(path, "train", "ct", patch_size=size, foreground=0, length=8):
        z, y, x = patch["start"]
        want = truth[patch["key"]]["ct"][z : z + size[0], y : y + size[1], x : x + size[2]]
        assert np.array_equal(patch["image"][: len(want), : want.shape[1], : want.shape[2]], want)
    dataset = VolumeCaseDataset(path, "train", "ct")
    assert {dataset[i]["key"] for i in range(len(dataset))} == set(truth)
    slices = VolumeSliceDataset(path, "train", "ct", shuffle=False)
    batch = next(iter(torch.utils.data.DataLoader(slices, batch_size=3)))
    assert set(batch["key"]) <= set(truth)  # a batch's names: a list of str
    for key, z, image in zip(batch["key"], batch["z"], batch["image"], strict=True):
        assert np.array_equal(image[0].numpy(), truth[key]["ct"][int(z)].astype(np.float32))


def test_preview_captions_a_case_by_its_name(release: tuple[Path, dict[str, Any]]) -> None:
    # preview captioned a case by its DICOM SeriesInstanceUID, a column of the ct field
    import dataclasses

    import h5py

    from h5etl.format import contract as fileformat
    from h5etl.preview.sheet import caption_fields
    from h5etl.readers import Release

    path, truth = release
    with h5py.File(path, "r") as handle:
        layout = fileformat.read_layout(handle)
    assert caption_fields(layout) == ("case",)  # the recipe's text field: the case's name
    without = dataclasses.replace(
        layout, fields={n: f for n, f in layout.fields.items() if n != "case"}
    )
    assert caption_fields(without) == (fileformat.SAMPLE_KEY,)  # else its sample key
    with Release(path, "train", fields=[fileformat.SAMPLE_KEY]) as keys:
        assert set(keys.read_slice(0, len(keys))[fileformat.SAMPLE_KEY]) == set(truth)


def test_small_columns_of_a_volume_release_are_chunked_by_bytes(
    release: tuple[Path, dict[str, Any]],
) -> None:
    # a volume release has no array field whose chunk rows its small columns followed: they
    # were stored one row a chunk (100k offsets: 4.5 MB, 0.86 s to read whole)
    import h5py

    from h5etl.format import contract as fileformat

    path, truth = release
    with h5py.File(path, "r") as handle:
        layout = fileformat.read_layout(handle)
        small = [
            *(layout.path("train", n) for n in ("ct_spacing", "ct_affine", "ct_series_uid")),
            fileformat.offsets_path(layout.path("train", "ct")),
            layout.path("train", "case"),
            layout.lineage_path("train"),
            *layout.sample_paths("train").values(),
        ]
        for name in small:
            dataset = handle[name]
            item = 16 if h5py.check_vlen_dtype(dataset.dtype) else dataset.dtype.itemsize
            rows = dataset.chunks[0]
            assert rows >= 64, name  # never a row a chunk
            assert rows >= len(dataset), name  # a small split: one chunk
            assert rows * item * int(np.prod(dataset.shape[1:])) <= 64 * 1024, name
    assert len(truth) == 5
