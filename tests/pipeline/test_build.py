"""End to end: raw folder -> config -> build -> release, against independent expectations."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import (
    ALL_BROKEN,
    BROKEN_REASONS,
    MakeRaw,
    RawFolder,
    WriteConfig,
    centre_pad,
    dataset_digests,
    expected_image,
    expected_mask,
    read_release,
    save,
    sha256_file,
)

from h5etl import BuildFailed, ConfigError, build, load_spec
from h5etl.history.build_report import BuildReport
from h5etl.sink import small_columns


def _build(config: Path, jobs: int = 1, *, full: bool = False) -> BuildReport:
    report = build(load_spec(config), jobs=jobs, full=full)
    assert report.path is not None
    return report


def _rows_by_key(data: dict[str, np.ndarray], splits: list[str]) -> dict[str, tuple[str, int]]:
    """filename stem -> (split, row); fails if a key is written twice."""
    where: dict[str, tuple[str, int]] = {}
    for split in splits:
        for row, name in enumerate(data[f"{split}/filename"]):
            key = str(name).removesuffix(".png")
            assert key not in where, f"{key} written twice"
            where[key] = (split, row)
    return where


def _reject_lines(report: BuildReport) -> list[dict[str, Any]]:
    assert report.rejects_path is not None
    text = report.rejects_path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def broken_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> tuple[RawFolder, BuildReport]:
    raw = make_raw(tmp_path, n=11, broken=ALL_BROKEN)
    return raw, _build(write_config(tmp_path))


def test_pixels_equal_independent_expectation(broken_build: tuple[RawFolder, BuildReport]) -> None:
    raw, report = broken_build
    assert report.path is not None
    data = read_release(report.path)
    where = _rows_by_key(data, ["train", "valid"])
    assert sorted(where) == raw.keys
    for key, (split, row) in where.items():
        np.testing.assert_array_equal(data[f"{split}/image"][row], expected_image(raw.image(key)))
        np.testing.assert_array_equal(data[f"{split}/mask"][row], expected_mask(raw.mask(key)))
        lineage = [v.decode() for v in data[f"{split}/source_sha256"][row]]
        assert lineage == [sha256_file(raw.image(key)), sha256_file(raw.mask(key))]


def test_dataset_layout(broken_build: tuple[RawFolder, BuildReport]) -> None:
    _, report = broken_build
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        image, mask = handle["train/image"], handle["train/mask"]
        assert image.shape[1:] == (3, 24, 24)
        assert image.dtype == np.uint8
        assert image.chunks == (4, 3, 24, 24)
        assert image.maxshape == (None, 3, 24, 24)
        assert mask.shape[1:] == (1, 24, 24)
        assert set(np.unique(mask[...]).tolist()) == {0, 1}
        assert h5py.check_string_dtype(handle["train/filename"].dtype).encoding == "utf-8"
        assert handle["train/source_sha256"].dtype == np.dtype("S64")
        assert list(handle["train/source_sha256"].attrs["columns"]) == ["image", "mask"]
        for attr in ("name", "version", "created_at", "config", "config_sha256", "h5etl_version"):
            assert attr in handle.attrs
        assert handle.attrs["version"] == 1
        assert str(handle.attrs["created_at"]).endswith("Z")
        config = str(handle.attrs["config"])
        assert hashlib.sha256(config.encode()).hexdigest() == handle.attrs["config_sha256"]


def test_every_input_written_once_or_rejected_once(
    broken_build: tuple[RawFolder, BuildReport],
) -> None:
    raw, report = broken_build
    assert report.path is not None
    data = read_release(report.path)
    rows = len(data["train/filename"]) + len(data["valid/filename"])
    lines = _reject_lines(report)
    assert 2 * rows + len(lines) == raw.files == report.inputs
    rejected = Counter(line["path"] for line in lines)
    assert max(rejected.values()) == 1, "a file was rejected twice"
    assert {line["path"]: line["reason"] for line in lines} == raw.reasons
    for line in lines:
        assert line["stage"] in {"discover", "clean", "decode"}
        assert line["key"]


@pytest.mark.parametrize("kind", sorted(BROKEN_REASONS))
def test_each_broken_kind_gives_its_reason(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, kind: str
) -> None:
    raw = make_raw(tmp_path, n=2, broken=[kind])
    report = _build(write_config(tmp_path))
    reasons = {line["path"]: line["reason"] for line in _reject_lines(report)}
    assert reasons == raw.reasons
    assert set(reasons.values()) == {BROKEN_REASONS[kind]}
    assert sum(report.samples.values()) == 2


def test_diagnostics_count_samples_and_rejects(broken_build: tuple[RawFolder, BuildReport]) -> None:
    raw, report = broken_build
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        attrs = dict(handle["diagnostics"].attrs)
        for split in ("train", "valid"):
            assert attrs[f"samples_{split}"] == len(handle[f"{split}/image"])
        expected = Counter(raw.reasons.values())
        for reason, count in expected.items():
            assert attrs[f"rejects_{reason}"] == count
        assert attrs["rejects_total"] == sum(expected.values())
        # timings are build facts beside the file (the file is reproducible): none inside
        assert not any(key.startswith("seconds_") for key in attrs)
    facts = json.loads(report.path.with_suffix(".build.json").read_text("utf-8"))
    assert facts["seconds"]["decode_and_write"] >= 0


def _independent_digest(rows: np.ndarray, block_rows: int) -> str:
    blocks = b"".join(
        hashlib.sha256(np.ascontiguousarray(rows[i : i + block_rows]).tobytes()).digest()
        for i in range(0, len(rows), block_rows)
    )
    return hashlib.sha256(blocks).hexdigest()


def test_diagnostics_sha256_matches_the_stored_arrays(
    broken_build: tuple[RawFolder, BuildReport],
) -> None:
    _, report = broken_build
    assert report.path is not None
    digests = dataset_digests(report.path)
    data = read_release(report.path)
    for split in ("train", "valid"):
        for field in ("image", "mask"):
            rows = data[f"{split}/{field}"]
            assert digests[f"/{split}/{field}"] == _independent_digest(rows, 4)


JOBS_CASES = [
    pytest.param({}, {}, id="plain"),
    pytest.param(
        {"b1": "mask_128", "b4": "mask_colour", "b7": "mask_128", "c2": "mask_colour"},
        {},
        id="decode-rejects",
    ),
    pytest.param(
        {"b1": "mask_128", "b5": "mask_colour"},
        {"fields": {"image": {"chunks": [2, 3, 24, 24]}}},
        id="field-chunks-differ",
    ),
    pytest.param(
        {"b3": "mask_128"},
        {
            "fields": {"image": {"chunks": [3, 3, 12, 24]}, "mask": {"compression": "gzip"}},
            "storage": {"chunk_samples": 2},
        },
        id="spatial-chunks-gzip",
    ),
]


@pytest.mark.parametrize(("broken", "overrides"), JOBS_CASES)
def test_jobs_do_not_change_the_release(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    broken: dict[str, str],
    overrides: dict[str, Any],
) -> None:
    raw = make_raw(tmp_path, n=23, broken=broken)
    config = write_config(tmp_path, **overrides)
    one = _build(config, jobs=1)
    two = _build(config, jobs=2, full=True)  # decoded again, not carried from v1
    assert one.path is not None
    assert two.path is not None
    assert (one.version, two.version) == (1, 2)
    assert dataset_digests(one.path) == dataset_digests(two.path)
    first, second = read_release(one.path), read_release(two.path)
    assert first.keys() == second.keys()
    for name, array in first.items():
        np.testing.assert_array_equal(array, second[name], err_msg=name)
    assert sorted(_rows_by_key(second, ["train", "valid"])) == raw.keys
    for report in (one, two):
        # decode rejects used to leave batches short, and the writer re-cut (decompressed and
        # recompressed) every chunk after them; now reserves fill the tasks and every chunk
        # comes compressed from a worker
        assert any(v for k, v in report.chunk_paths.items() if k.endswith(":direct"))
        assert not any(v for k, v in report.chunk_paths.items() if k.endswith(":rechunked"))


def test_buffered_text_and_lineage_rows_match_per_batch_writes(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink buffers filename/lineage rows; flushing every 3 rows or at the end agrees."""
    make_raw(tmp_path, n=23, broken={"b1": "mask_128"})
    config = write_config(tmp_path, storage={"chunk_samples": 2})
    whole = _build(config, jobs=1)
    monkeypatch.setattr(small_columns, "SMALL_ROWS_PER_WRITE", 3)
    cut = _build(config, jobs=1)
    assert whole.path is not None
    assert cut.path is not None
    assert dataset_digests(whole.path) == dataset_digests(cut.path)
    first, second = read_release(whole.path), read_release(cut.path)
    for name in ("train/filename", "valid/filename", "train/source_sha256"):
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        assert len(first[name]) == len(first[name.split("/")[0] + "/image"])


def test_second_build_makes_v2_and_keeps_v1_bytes(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6, broken=["orphan_mask"])
    config = write_config(tmp_path)
    first = _build(config)
    assert first.path is not None
    assert first.link is not None
    v1_bytes, v1_stat = first.path.read_bytes(), first.path.stat()
    assert os.readlink(first.link) == "cells-v0001.h5"
    # the same inputs are up to date (tests/incremental/test_uptodate.py): --full makes a second
    # release
    second = _build(config, full=True)
    assert second.path is not None
    assert second.version == 2
    assert second.path.name == "cells-v0002.h5"
    assert os.readlink(first.link) == "cells-v0002.h5", "the link must be relative and moved"
    assert first.link.resolve() == second.path.resolve()
    assert first.path.read_bytes() == v1_bytes
    assert first.path.stat().st_mtime_ns == v1_stat.st_mtime_ns
    assert (tmp_path / "releases" / "cells-v0002.rejects.jsonl").is_file()
    assert dataset_digests(first.path) == dataset_digests(second.path)
    leftovers = [p.name for p in (tmp_path / "releases").iterdir() if p.name.startswith(".")]
    # each release's carry record (the next build's cache) is all that is hidden there
    assert sorted(leftovers) == [".cells-v0001.h5.carry.json", ".cells-v0002.h5.carry.json"]


@pytest.mark.parametrize("policy", ["crop", "resize"])
def test_oversize_policy_keeps_the_sample(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, policy: str
) -> None:
    raw = make_raw(tmp_path, n=3, broken={"big": "oversize"})
    # a wide one too, so resize has an aspect ratio to keep and padding to add
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)
    wide_mask = np.where(rng.random((30, 50)) < 0.5, 255, 0).astype(np.uint8)
    save(raw.image("wide"), wide)
    save(raw.mask("wide"), wide_mask)
    report = _build(write_config(tmp_path, pad={"oversize": policy}))
    assert report.rejects == []
    assert report.path is not None
    data = read_release(report.path)
    where = _rows_by_key(data, ["train", "valid"])
    assert sorted(where) == sorted([*raw.keys, "big", "wide"])
    for key in ("big", "wide"):
        split, row = where[key]
        image, mask = data[f"{split}/image"][row], data[f"{split}/mask"][row]
        assert image.shape == (3, 24, 24)
        assert mask.shape == (1, 24, 24)
        assert set(np.unique(mask).tolist()) <= {0, 1}
    split, row = where["wide"]
    if policy == "crop":
        # centred 24x24 window of the 30x50 source: rows 3..27, cols 13..37
        expected = wide[3:27, 13:37].transpose(2, 0, 1)
        np.testing.assert_array_equal(data[f"{split}/image"][row], expected)
        np.testing.assert_array_equal(
            data[f"{split}/mask"][row][0], (wide_mask[3:27, 13:37] == 255).astype(np.uint8)
        )
    else:
        # 30x50 fits as 14x24, centred: rows 5..18 hold pixels, the rest is fill
        image = data[f"{split}/image"][row]
        assert image[:, :5].max() == 0
        assert image[:, 19:].max() == 0
        assert image[:, 5:19].max() > 0


def test_pad_fill_is_used_for_images(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=3, sizes=[(10, 12)])
    report = _build(write_config(tmp_path, pad={"fill": 7}))
    assert report.path is not None
    data = read_release(report.path)
    for key, (split, row) in _rows_by_key(data, ["train", "valid"]).items():
        np.testing.assert_array_equal(
            data[f"{split}/image"][row], expected_image(raw.image(key), fill=7)
        )


def test_masks_pad_with_mask_fill_not_the_image_fill(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # pad.fill 7 once padded masks with 7, a label outside values [0, 1]
    make_raw(tmp_path, n=3, sizes=[(10, 12)])
    report = _build(write_config(tmp_path, pad={"fill": 7}))
    assert report.path is not None
    data = read_release(report.path)
    masks = np.concatenate([data["train/mask"], data["valid/mask"]])
    assert set(np.unique(masks).tolist()) <= {0, 1}
    assert masks[:, 0, 0, :].max() == 0  # the padded top row


def test_mask_fill_must_be_a_mask_label(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=1)
    with pytest.raises(ConfigError, match=r"pad\.mask_fill"):
        load_spec(write_config(tmp_path, pad={"mask_fill": 3}))


def test_on_error_fail_publishes_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4, broken=["mask_128"])
    config = write_config(tmp_path, on_error="fail")
    with pytest.raises(BuildFailed, match="mask_values"):
        build(load_spec(config), jobs=1)
    releases = tmp_path / "releases"
    assert not list(releases.glob("*.h5"))
    assert not [p for p in releases.iterdir() if p.name.startswith(".")]


def test_failed_build_keeps_previous_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=4)
    first = _build(write_config(tmp_path, on_error="fail"))
    assert first.path is not None
    assert first.link is not None
    before = first.path.read_bytes()
    raw.mask(raw.keys[0]).write_bytes(b"")  # now unreadable
    with pytest.raises(BuildFailed):
        build(load_spec(tmp_path / "config.yaml"), jobs=1)
    assert os.readlink(first.link) == "cells-v0001.h5"
    assert first.path.read_bytes() == before
    assert not (tmp_path / "releases" / "cells-v0002.h5").exists()


def test_max_rejects_limit(tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig) -> None:
    make_raw(tmp_path, n=4, broken=["orphan_image", "orphan_mask"])
    with pytest.raises(BuildFailed, match="max_rejects"):
        build(load_spec(write_config(tmp_path, max_rejects=1)), jobs=1)
    assert _build(write_config(tmp_path, max_rejects=2)).version == 1


def test_dry_run_writes_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4, broken=["oversize"])
    report = build(load_spec(write_config(tmp_path)), dry_run=True)
    assert report.path is None
    assert sum(report.samples.values()) == 4
    assert report.reject_counts == {"oversize": 2}
    assert not (tmp_path / "releases").exists() or not list((tmp_path / "releases").iterdir())


def test_an_empty_source_is_a_failed_build_not_an_empty_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # it published a release of zero samples and moved the link to it
    make_raw(tmp_path, n=0)
    with pytest.raises(BuildFailed, match="no sample to store: the sources matched no file"):
        build(load_spec(write_config(tmp_path)))
    assert not list((tmp_path / "releases").glob("*.h5"))


def test_unusual_inputs_end_to_end(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    """EXIF rotation, symlinked inputs, 16-bit images and odd names, through a whole build."""
    from PIL import Image

    raw = make_raw(tmp_path, n=2)
    rng = np.random.default_rng(5)
    # stored 12 high and 20 wide, shown rotated (orientation 6): 20 high, 12 wide
    stored = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(raw.image("rotated"), exif=exif.tobytes())
    shown_mask = np.where(rng.random((20, 12)) < 0.5, 255, 0).astype(np.uint8)
    save(raw.mask("rotated"), shown_mask)
    # a symlinked image: followed, and its lineage is the target's bytes
    elsewhere = tmp_path / "elsewhere.png"
    save(elsewhere, rng.integers(0, 256, (9, 9, 3), dtype=np.uint8))
    os.symlink(elsewhere, raw.image("linked"))
    save(raw.mask("linked"), np.zeros((9, 9), np.uint8))
    # a 16-bit greyscale image: v >> 8 in every channel
    deep = rng.integers(0, 65536, (8, 8)).astype(np.uint16)
    Image.fromarray(deep).save(raw.image("deep"))
    save(raw.mask("deep"), np.full((8, 8), 255, np.uint8))
    # names that need care: non-ASCII, a colon (sanitised key, filename kept as it was)
    for key in ("ünï cödé", "a:b"):
        image, mask = rng.integers(0, 256, (7, 7, 3), dtype=np.uint8), np.zeros((7, 7), np.uint8)
        save(raw.image(key), image)
        save(raw.mask(key), mask)

    report = _build(write_config(tmp_path, splits={"train": 1.0}))
    assert report.rejects == []
    assert report.path is not None
    data = read_release(report.path)
    where = _rows_by_key(data, ["train"])
    assert sorted(where) == sorted([*raw.keys, "rotated", "linked", "deep", "ünï cödé", "a:b"])

    def row(key: str, field: str) -> np.ndarray:
        return np.asarray(data[f"train/{field}"][where[key][1]])

    rotated = np.rot90(stored, k=-1)  # shown as the viewer shows it
    np.testing.assert_array_equal(row("rotated", "image"), centre_pad(rotated, 24, 24))
    np.testing.assert_array_equal(row("rotated", "mask"), centre_pad(shown_mask // 255, 24, 24))
    np.testing.assert_array_equal(row("linked", "image"), expected_image(elsewhere))
    lineage = [v.decode() for v in row("linked", "source_sha256")]
    assert lineage[0] == sha256_file(elsewhere)
    grey = (deep >> 8).astype(np.uint8)
    np.testing.assert_array_equal(
        row("deep", "image"), centre_pad(np.stack([grey] * 3, axis=2), 24, 24)
    )
    np.testing.assert_array_equal(row("a:b", "image"), expected_image(raw.image("a:b")))
    with h5py.File(report.path, "r") as handle:
        renamed = list(handle["diagnostics"].attrs["renamed_keys"])
    assert renamed == ["a:b -> a_b"]
