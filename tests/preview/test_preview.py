"""preview: the contact sheet shows the stored pixels, the mask over them and the names."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image, ImageFont
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.preview.sheet import (
    ALPHA,
    GAP,
    PALETTE,
    _fit,
    display_size,
    overlay,
    render_preview,
    write_preview,
)
from h5etl.readers import ReaderError


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seven 24x24 samples (two splits) with a square mask each; returns the link."""
    root = tmp_path_factory.mktemp("preview")
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (root / "raw" / folder).mkdir(parents=True)
    for index in range(7):
        image = rng.integers(0, 256, size=(24, 24, 3), dtype=np.uint8)
        mask = np.zeros((24, 24), dtype=np.uint8)
        mask[4:14, 6:18] = 255
        name = f"a_rather_long_sample_name_{index:02d}.png"
        Image.fromarray(image).save(root / "raw" / "images" / name)
        Image.fromarray(mask).save(root / "raw" / "masks" / name)
    config = {
        "name": "cells",
        "pipeline": "segmentation",
        "output": "releases",
        "sources": {"image": {"dir": "raw/images"}, "mask": {"dir": "raw/masks"}},
        "splits": {"train": 0.75, "valid": 0.25},
        "fields": {
            "image": {"shape": [3, 24, 24], "mode": "RGB"},
            "mask": {"shape": [1, 24, 24], "mode": "L", "values": [0, 1]},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": 2},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    report = h5etl.build(h5etl.load_spec(root / "config.yaml"), jobs=1)
    assert report.link is not None
    return report.link


def test_overlay_tints_inside_outlines_the_edge_and_leaves_the_rest() -> None:
    image = np.full((3, 8, 8), 100, dtype=np.uint8)
    mask = np.zeros((1, 8, 8), dtype=np.uint8)
    mask[0, 2:6, 2:6] = 1
    out = overlay(image, mask)
    green = PALETTE[0]
    np.testing.assert_array_equal(out[0, 0], [100, 100, 100])  # outside: untouched
    np.testing.assert_array_equal(out[2, 2], green.astype(np.uint8))  # the outline: opaque
    inside = ((1 - ALPHA) * 100 + ALPHA * green).astype(np.uint8)
    np.testing.assert_array_equal(out[3, 3], inside)  # the interior: blended


def test_big_samples_shrink_and_small_ones_grow_by_whole_pixels() -> None:
    assert display_size(24, 12) == (192, 96)
    assert display_size(128, 100) == (128, 100)
    assert display_size(1024, 512) == (192, 96)


def test_overlay_shows_grey_images_and_no_mask() -> None:
    grey = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    out = overlay(grey, None)
    assert out.shape == (4, 4, 3)
    np.testing.assert_array_equal(out[..., 0], grey[0])
    np.testing.assert_array_equal(out[..., 2], grey[0])


def test_sheet_holds_the_stored_pixels_with_the_mask_over_them(release: Path) -> None:
    sheet = np.asarray(render_preview(release, split="train", n=4))
    with h5py.File(release, "r") as handle:
        image, mask = handle["train/image"][0], handle["train/mask"][0]
    scale = 192 // 24  # small images are blown up by whole pixels, the mask drawn after
    assert display_size(24, 24) == (24 * scale, 24 * scale)
    grow = np.ones((1, scale, scale), np.uint8)
    expected = overlay(np.kron(image, grow), np.kron(mask, grow))
    top = 16 + 2 * GAP
    tile = sheet[top : top + 24 * scale, GAP : GAP + 24 * scale]
    np.testing.assert_array_equal(tile, expected)
    outline = expected[4 * scale + 1, 6 * scale + 1 : 18 * scale - 1]  # one display pixel
    assert not (outline == PALETTE[0].astype(np.uint8)).all(axis=-1).any()  # thin, not 8 px


def test_sheet_is_a_grid_with_a_label_under_each_sample(release: Path) -> None:
    sheet = np.asarray(render_preview(release, split="train"))  # n=16 > the 5 samples there
    columns, cell = 3, 192
    assert sheet.shape[1] >= columns * (cell + GAP) + GAP
    top = 16 + 2 * GAP
    label_rows = [top + cell + 2, top + cell + 16]
    for index in range(6):
        x = GAP + (index % columns) * (cell + GAP)
        y = label_rows[0] + (index // columns) * (cell + 16 + GAP)
        band = sheet[y : y + 14, x : x + cell]
        inked = bool((band < 128).any())
        assert inked == (index < 5), f"label band {index}"


def test_long_names_are_shortened_in_the_middle() -> None:
    font = ImageFont.load_default(size=12)
    name = "a_rather_long_sample_name_that_goes_on_00.png"
    short = _fit(name, font, 120)
    assert font.getlength(short) <= 120
    assert short.startswith("a_rather")
    assert short.endswith("00.png")
    assert "…" in short
    assert _fit("a.png", font, 120) == "a.png"


def test_write_preview_saves_a_png(release: Path, tmp_path: Path) -> None:
    out = write_preview(release, tmp_path / "sub" / "grid.png", n=2)
    with Image.open(out) as picture:
        assert picture.format == "PNG"
        assert picture.mode == "RGB"


def test_unknown_split_is_a_reader_error(release: Path) -> None:
    with pytest.raises(ReaderError, match="no split 'test'; the release has: train, valid"):
        render_preview(release, split="test")


def test_cli_preview_writes_the_png(release: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(
        app, ["preview", str(release), "--split", "valid", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.exists()
    assert str(out) in result.output


def test_cli_preview_of_a_non_release_is_one_line_in_our_words(tmp_path: Path) -> None:
    # it printed HDF5's "file signature not found", with exit 2 where check gives 1
    bogus = tmp_path / "not.h5"
    bogus.write_text("hello")
    result = CliRunner().invoke(app, ["preview", str(bogus), "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line == f"h5etl: error: {bogus}: not an HDF5 file (h5etl releases are HDF5)"
    missing = CliRunner().invoke(app, ["preview", str(tmp_path / "no.h5"), "--out", "x.png"])
    assert missing.exit_code == 2
    assert "no such file" in missing.output


def test_check_prints_mask_value_histograms_and_the_ratio(release: Path) -> None:
    from h5etl.check.health import check_release

    report = check_release(release)
    lines = "\n".join(report.lines)
    with h5py.File(release, "r") as handle:
        masks = handle["train/mask"][...]
    ones = int(np.count_nonzero(masks == 1))
    assert f"mask values: 0 {100 * (masks.size - ones) / masks.size:.2f}%" in lines
    assert f"1 {100 * ones / masks.size:.2f}% ({ones:,} px); 0 of 5 samples all 0" in lines
    assert "compression: " in lines
    assert report.ok


def test_check_flags_mask_values_outside_the_declared_set(release: Path, tmp_path: Path) -> None:
    from h5etl.check.health import check_release

    copy = tmp_path / "copy.h5"
    copy.write_bytes(release.resolve().read_bytes())
    with h5py.File(copy, "r+") as handle:
        handle["valid/mask"][0, 0, 0, 0] = 7  # a mask value the config never allowed
    report = check_release(copy)
    assert not report.ok
    assert any("values [7] outside the declared [0, 1]" in p for p in report.problems)
