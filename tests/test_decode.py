"""decode: worker results for hand-made tasks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from conftest import MakeRaw, WriteConfig, centre_pad, save

from h5etl import decode, pipeline
from h5etl.config import load_spec
from h5etl.records import DecodeTask, Sample, SourceFile


def planned(root: Path, key: str) -> Sample:
    files = tuple(
        SourceFile(source, str(root / "raw" / folder), f"{key}.png")
        for source, folder in (("image", "images"), ("mask", "masks"))
    )
    return Sample.of(key, files)


def test_a_rejected_sample_leaves_no_pixels_in_the_next_ones_padding(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a sample whose image was placed before its mask failed left its pixels in the row,
    # and the next (smaller) sample in that row kept them as "padding"
    make_raw(tmp_path, n=0)
    big = np.full((24, 24, 3), 200, np.uint8)
    bad_mask = np.zeros((24, 24), np.uint8)
    bad_mask[0, 0] = 128
    save(tmp_path / "raw" / "images" / "big.png", big)
    save(tmp_path / "raw" / "masks" / "big.png", bad_mask)
    small = np.full((6, 6, 3), 50, np.uint8)
    save(tmp_path / "raw" / "images" / "small.png", small)
    save(tmp_path / "raw" / "masks" / "small.png", np.zeros((6, 6), np.uint8))
    spec = load_spec(write_config(tmp_path))
    recipe = decode.DecodeRecipe.from_spec(spec, pipeline.layouts_of(spec))
    task = DecodeTask("train", 0, (planned(tmp_path, "big"), planned(tmp_path, "small")), 4)

    result = decode.decode_batch(task, recipe)

    assert result.accepted == 1
    assert {r.reason for r in result.rejects} == {"mask_values"}
    np.testing.assert_array_equal(result.raw["image"][0], centre_pad(small, 24, 24))


def _crash_in_workers(item: tuple[int, int]) -> int:
    """Squares the number; kills any process but the test's own (a decoder segfaulting)."""
    value, parent = item
    if os.getpid() != parent:
        os._exit(3)
    return value * value


def _square(value: int) -> int:
    return value * value


def test_map_in_workers_keeps_order_and_survives_dead_workers() -> None:
    assert list(decode.map_in_workers(_square, range(50), jobs=2, window=3)) == [
        v * v for v in range(50)
    ]
    items = [(v, os.getpid()) for v in range(5)]
    assert list(decode.map_in_workers(_crash_in_workers, items, jobs=2)) == [0, 1, 4, 9, 16]
