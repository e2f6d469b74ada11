"""The honest work limit (``honest_limit.py``) does h5etl's work without h5etl: the same stored
bytes, the same thread limits, the same counts, and no module of h5etl in its processes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from h5etl.execute.pool import NATIVE_THREAD_LIMITS
from h5etl.format.codec import ChunkLayout, Codec, encode_block

BENCH = Path(__file__).parent  # the scripts beside these tests


@pytest.fixture(scope="module")
def honest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_honest", BENCH / "honest_limit.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H5ETL_CODECS = {  # the corpus configs' storage, as h5etl's config resolves it
    "lzf": Codec("lzf", None, "lz4", "byte"),
    "blosc-lz4": Codec("blosc", 5, "lz4", "byte"),
}


@pytest.mark.parametrize("codec", ["lzf", "blosc-lz4"])
@pytest.mark.parametrize("channels", [3, 1])
def test_blocks_are_stored_as_h5etl_stores_them(
    honest: ModuleType, codec: str, channels: int
) -> None:
    # the limit would be cheaper than h5etl's work with another level, shuffle or typesize
    rng = np.random.default_rng(30)
    rows = np.zeros((32, channels, 224, 224), np.uint8)
    rows[:, :, 40:180, 30:200] = rng.integers(0, 40, (32, channels, 140, 170), np.uint8)
    layout = ChunkLayout(
        (channels, 224, 224), "uint8", (32, channels, 224, 224), H5ETL_CODECS[codec], True
    )
    (chunk,) = encode_block(layout, rows)
    assert chunk.filter_mask == 0
    assert bytes(honest.encode(codec, rows)) == bytes(chunk.data)


def test_workers_get_h5etls_thread_limits(honest: ModuleType) -> None:
    assert honest.THREAD_LIMITS == NATIVE_THREAD_LIMITS


def test_refuses_to_run_beside_h5etl(honest: ModuleType) -> None:
    with pytest.raises(RuntimeError, match=r"imported h5etl modules: \['h5etl'"):
        honest.no_h5etl("test")  # this process imported h5etl


def _corpus(root: Path) -> tuple[int, int, int]:
    """Three pairs of sizes up to 224 (a 0/255 mask, a 0/1 mask); their pixel sum, their
    pixel sum inverted (255 - value, as ``--invert`` does) and the masks' ones."""
    rng = np.random.default_rng(5)
    image_sum = inverted = ones = 0
    for kind in ("images", "masks"):
        (root / kind).mkdir(parents=True)
    for i, (height, width) in enumerate([(224, 224), (64, 100), (150, 81)]):
        rgb = rng.integers(0, 256, (height, width, 3), np.uint8)
        mask = (rng.random((height, width)) < 0.3).astype(np.uint8)
        image_sum += int(rgb.sum(dtype=np.int64))
        inverted += int((255 - rgb).sum(dtype=np.int64))
        ones += int(mask.sum())
        Image.fromarray(rgb).save(root / "images" / f"s{i}.png")
        Image.fromarray(mask * (255 if i != 1 else 1)).save(root / "masks" / f"s{i}.png")
    return image_sum, inverted, ones


def test_does_the_work_in_workers_that_import_no_h5etl(tmp_path: Path) -> None:
    image_sum, inverted, ones = _corpus(tmp_path)
    script = BENCH / "honest_limit.py"
    written = tmp_path / "written"
    written.mkdir()
    for codec, invert in (("lzf", False), ("blosc-lz4", False), ("lzf", True)):
        args = ["--corpus", str(tmp_path), "--codec", codec, "--jobs", "2"]
        args += ["--invert"] if invert else []
        args += ["--write", str(written)] if codec == "blosc-lz4" else []
        done = subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr  # no_h5etl held in the process and workers
        info = json.loads(done.stdout)
        pixels = inverted if invert else image_sum
        stored = info.pop("written_bytes")
        assert info == {"samples": 3, "mask_ones": ones, "image_sum": pixels, "h5etl_modules": 0}
        if codec == "blosc-lz4":  # one block of 32 rows per field: two chunks, each compressed
            assert 0 < stored < 32 * 4 * 224 * 224
            assert not list(written.iterdir())  # fsynced, then removed
        else:
            assert stored == 0
