"""sink: the single writer round trip (write, reopen read-only, compare arrays and attrs)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import cast

import h5py
import numpy as np
import pytest

from h5etl.config.sections import Compression
from h5etl.dataflow import BatchResult, DecodeTask, EncodedRows
from h5etl.errors import SinkError
from h5etl.format import digest
from h5etl.format.codec import ChunkLayout, decode_block, encode_block
from h5etl.kinds.columns import ArrayColumn, TextColumn
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink

CHUNK = 4
IMAGE = ChunkLayout((3, 5, 6), "uint8", (CHUNK, 3, 5, 6), Compression(codec="lzf"), True)
MASK = ChunkLayout((1, 5, 6), "uint8", (CHUNK, 1, 3, 6), Compression(codec="gzip"), True)
LAYOUT = SinkLayout(
    ("train", "valid"),
    {"image": ArrayColumn(IMAGE, 0), "mask": ArrayColumn(MASK, 0), "filename": TextColumn()},
    ("image", "mask"),
)


def _batch(split: str, start: int, count: int, *, encoded: bool = False) -> BatchResult:
    """``count`` accepted rows whose pixels encode their split and row, so order is checkable."""
    rng = np.random.default_rng(start + (1000 if split == "valid" else 0))
    task = DecodeTask(split, start, (), CHUNK, CHUNK)
    result = BatchResult(task, count)
    for name, layout in (("image", IMAGE), ("mask", MASK)):
        rows = rng.integers(0, 256, (count, *layout.shape), dtype=np.uint8)
        if encoded:
            result.columns[name] = EncodedRows(
                [encode_block(layout, rows)], [digest.block_digest(rows)]
            )
        else:
            result.columns[name] = rows
    result.keys = [f"{split}-{start + i}" for i in range(count)]
    result.columns["filename"] = [f"{key}.png" for key in result.keys]
    result.lineage = [
        (hashlib.sha256(k.encode()).hexdigest(), hashlib.sha256(k[::-1].encode()).hexdigest())
        for k in result.keys
    ]
    return result


def _rows(result: BatchResult, name: str) -> np.ndarray:
    layout = IMAGE if name == "image" else MASK
    rows = result.columns[name]
    if isinstance(rows, np.ndarray):
        return rows
    assert isinstance(rows, EncodedRows)
    return np.concatenate([decode_block(layout, block) for block in rows.blocks])


def _write(path: Path, batches: list[BatchResult]) -> dict[str, dict[str, object]]:
    with Sink(path, LAYOUT) as sink:
        for batch in batches:
            sink.write(batch)
        return sink.finish({"name": "t", "version": 1}, {"samples_train": sink.counts["train"]})


BATCHES = [
    pytest.param([("train", 3, False), ("train", 5, False), ("train", 1, False)], id="raw-uneven"),
    pytest.param([("train", 4, True), ("train", 4, True), ("valid", 2, False)], id="encoded"),
    pytest.param(
        [("train", 3, False), ("train", 4, True), ("train", 4, True), ("valid", 4, True)],
        id="encoded-after-drift",
    ),
    pytest.param([("train", 0, False), ("valid", 0, False)], id="empty"),
]


@pytest.mark.parametrize("plan", BATCHES)
def test_round_trip(tmp_path: Path, plan: list[tuple[str, int, bool]]) -> None:
    starts: dict[str, int] = {"train": 0, "valid": 0}
    batches = []
    for split, count, encoded in plan:
        batches.append(_batch(split, starts[split], count, encoded=encoded))
        starts[split] += count
    report = _write(tmp_path / "r.h5", batches)
    with h5py.File(tmp_path / "r.h5", "r") as handle:
        assert handle.attrs["name"] == "t"
        assert handle["diagnostics"].attrs["samples_train"] == starts["train"]
        for split in ("train", "valid"):
            mine = [b for b in batches if b.task.split == split]
            for name, layout in (("image", IMAGE), ("mask", MASK)):
                dataset = handle[f"{split}/{name}"]
                assert dataset.chunks == layout.chunks
                assert dataset.maxshape == (None, *layout.shape)
                expected = np.concatenate(
                    [_rows(b, name) for b in mine] or [np.zeros((0, *layout.shape), np.uint8)]
                )
                np.testing.assert_array_equal(dataset[...], expected)
                sha, _ = digest.array_digest(expected, CHUNK)
                info = report[f"/{split}/{name}"]
                assert info["sha256"] == sha
                node = handle[f"diagnostics/datasets/{split}.{name}"]
                assert node.attrs["sha256"] == sha
                assert node.attrs["raw_bytes"] == expected.nbytes
                assert len(node["block_sha256"]) == -(-len(expected) // CHUNK)
            names = [v.decode() for v in handle[f"{split}/filename"][...]]
            assert names == [f for b in mine for f in cast(list[str], b.columns["filename"])]
            lineage = handle[f"{split}/source_sha256"][...]
            assert lineage.shape == (len(names), 2)
            assert [tuple(v.decode() for v in row) for row in lineage] == [
                row for b in mine for row in b.lineage
            ]
            assert list(handle[f"{split}/source_sha256"].attrs["columns"]) == ["image", "mask"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    path.write_bytes(b"precious")
    with pytest.raises(SinkError, match="cannot create"), Sink(path, LAYOUT):
        pass
    assert path.read_bytes() == b"precious"


def test_closes_on_error(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    with pytest.raises(RuntimeError), Sink(path, LAYOUT) as sink:
        raise RuntimeError("boom")
    assert sink.file is None
    with h5py.File(path, "r"):  # closed, so it opens again
        pass


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed")
def test_old_hdf5_tools_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "r.h5"
    _write(path, [_batch("train", 0, 5)])
    result = subprocess.run(
        ["h5dump", "-H", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert 'DATASET "image"' in result.stdout


@pytest.mark.parametrize(
    ("planned", "rows"),
    [
        pytest.param(None, {"filename": 4096, "source_sha256": 512}, id="by-bytes"),
        pytest.param(100_000, {"filename": 4096, "source_sha256": 512}, id="a-large-split"),
        pytest.param(700, {"filename": 1024, "source_sha256": 512}, id="no-more-than-planned"),
        pytest.param(5, {"filename": 64, "source_sha256": 64}, id="a-tiny-split"),
    ],
)
def test_small_columns_are_chunked_by_bytes(
    tmp_path: Path, planned: int | None, rows: dict[str, int]
) -> None:
    # a release without array fields chunked them one row a chunk: 100k offsets were 4.5 MB
    # and read whole in 0.86 s instead of 0.8 MB and 1 ms
    import dataclasses

    layout = dataclasses.replace(LAYOUT, planned={} if planned is None else {"train": planned})
    path = tmp_path / "r.h5"
    with Sink(path, layout) as sink:
        sink.write(_batch("train", 0, 6))
        sink.finish({"name": "t", "version": 1}, {})
    with h5py.File(path, "r") as handle:
        for name, row_bytes in (("filename", 16), ("source_sha256", 2 * 64)):
            chunks = handle[f"train/{name}"].chunks
            assert chunks[0] == rows[name], name
            assert chunks[0] * row_bytes <= 64 * 1024  # at most 64 KiB a chunk
            if planned is None or planned >= 100_000:
                assert chunks[0] * row_bytes > 32 * 1024  # the most rows that fit
        assert list(handle["train/filename"].asstr()[...]) == [f"train-{i}.png" for i in range(6)]
