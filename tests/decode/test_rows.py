"""rows: a task's array rows, gathered block by block as they fill, hold what the task's rows
compressed at once held: the same chunks, digests and statistics, in one block of buffer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeRaw, WriteConfig, centre_pad, save
from PIL import Image

from h5etl.config.load import load_spec
from h5etl.dataflow import DecodeTask, EncodedRows, Sample, SourceFile
from h5etl.decode import rows as task_rows
from h5etl.decode import task as decode
from h5etl.execute import assembly
from h5etl.format.codec import decode_block
from h5etl.plan import admit, discover

SIDE = 24
FILL = 9  # pad.fill: a smaller image after a larger one in the same buffer row shows a stale row
KEYS = ("a", "b", "c", "d", "e", "f")
SIZES = {"a": (24, 24), "b": (10, 14), "c": (24, 20), "d": (8, 8), "e": (24, 24), "f": (13, 7)}


def _sample(root: Path, key: str) -> Sample:
    files = tuple(
        SourceFile(source, str(root / "raw" / folder), f"{key}.png")
        for source, folder in (("image", "images"), ("mask", "masks"))
    )
    return Sample.of(key, files)


def _raw(root: Path, bad: set[str]) -> None:
    """A pair per key; the masks of ``bad`` hold a 7, so their pairs are rejected."""
    rng = np.random.default_rng(31)
    for key in KEYS:
        height, width = SIZES[key]
        mask = np.where(rng.random((height, width)) < 0.4, 255, 0).astype(np.uint8)
        if key in bad:
            mask[0, 0] = 7
        save(
            root / "raw" / "images" / f"{key}.png",
            rng.integers(0, 256, (height, width, 3), np.uint8),
        )
        save(root / "raw" / "masks" / f"{key}.png", mask)


def _expected(root: Path, keys: list[str]) -> dict[str, np.ndarray]:
    """The rows of ``keys``, decoded with Pillow and padded here, not by h5etl."""
    images, masks = [], []
    for key in keys:
        with Image.open(root / "raw" / "images" / f"{key}.png") as image:
            images.append(centre_pad(np.asarray(image.convert("RGB")), SIDE, SIDE, FILL))
        with Image.open(root / "raw" / "masks" / f"{key}.png") as mask:
            masks.append(centre_pad((np.asarray(mask) == 255).astype(np.uint8), SIDE, SIDE, 0))
    return {"image": np.stack(images), "mask": np.stack(masks)}


@pytest.mark.parametrize(
    ("bad", "rows", "final", "kept", "deferred"),
    [
        # c rejected: d takes its row; a final task keeps its last, partial block [f]
        pytest.param({"c"}, 6, True, ["a", "b", "d", "e", "f"], [], id="final-partial-block"),
        # b and c rejected, more than the reserves: [a, d] is stored, e is queued again
        pytest.param({"b", "c"}, 4, False, ["a", "d"], [4], id="whole-blocks-only"),
    ],
)
def test_a_task_gathered_block_by_block_stores_its_rows_chunks_digests_and_statistics(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    bad: set[str],
    rows: int,
    final: bool,
    kept: list[str],
    deferred: list[int],
) -> None:
    make_raw(tmp_path, n=0)
    _raw(tmp_path, bad)
    storage = {"chunk_samples": 2, "compression": {"codec": "blosc", "cname": "lz4"}}
    spec = load_spec(write_config(tmp_path, storage=storage, pad={"fill": FILL}))
    plan = admit.plan(spec, discover.find_samples(spec).samples)
    recipe = assembly.recipe_of(plan)
    samples = tuple(_sample(tmp_path, key) for key in KEYS)
    samples = samples[:5] if not final else samples
    task = DecodeTask("train", 0, samples, rows, 2, final=final)

    result = decode.decode_batch(task, recipe)

    assert result.keys == kept
    assert result.deferred == deferred
    expected = _expected(tmp_path, kept)
    layouts = {name: column.layout for _, name, column in recipe.arrays}
    for name, want in expected.items():
        stored = result.columns[name]
        assert isinstance(stored, EncodedRows)
        for start, chunks in zip(range(0, len(want), 2), stored.blocks, strict=True):
            block = want[start : start + 2]
            got = decode_block(layouts[name], chunks)[: len(block)]
            np.testing.assert_array_equal(got, block)
        assert stored.digests == [
            hashlib.sha256(want[i : i + 2].tobytes()).digest() for i in range(0, len(want), 2)
        ]
    # the statistics are those of the unpadded pixels of the samples kept, block by block
    images = [np.asarray(Image.open(tmp_path / "raw" / "images" / f"{k}.png")) for k in kept]
    stats = result.stats["image"]
    assert stats.total == tuple(sum(int(i[..., c].sum()) for i in images) for c in range(3))
    assert stats.count == (sum(i.shape[0] * i.shape[1] for i in images),) * 3
    for tally, start in zip(result.blocks, range(0, len(kept), 2), strict=True):
        part = images[start : start + 2]
        assert tally.stats["image"].minimum == tuple(
            float(min(int(i[..., c].min()) for i in part)) for c in range(3)
        )


def test_a_worker_holds_one_block_of_rows_not_its_tasks(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # the task's 25 MB of rows left the caches before its blocks were compressed (blosc-lz4
    # and SHA-256 cost 55 us a sample more); a block's rows are reused for the next block
    make_raw(tmp_path, n=0)
    _raw(tmp_path, set())
    spec = load_spec(write_config(tmp_path, storage={"chunk_samples": 2}))
    recipe = assembly.recipe_of(admit.plan(spec, discover.find_samples(spec).samples))
    task = DecodeTask("train", 0, tuple(_sample(tmp_path, k) for k in KEYS), 6, 2, final=True)
    task_rows.drop_buffers()

    result = decode.decode_batch(task, recipe)

    assert result.accepted == 6
    assert {name: len(rows) for name, rows in task_rows._BUFFERS.arrays.items()} == {
        "image": 2,
        "mask": 2,
    }
    task_rows.drop_buffers()
