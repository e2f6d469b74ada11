"""sink, ragged columns: whatever the lengths, the batches and the chunk rows, the values
dataset is the samples end to end in whole chunks, the offsets their running ends, and the
block digests those of every chunk_rows rows (a property test of the chunk-cutting rule)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5etl.dataflow import BatchResult, DecodeTask, RaggedRows
from h5etl.decode.gather import _encoded_rows
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.format.codec import Codec
from h5etl.kinds.columns import RaggedColumn, ScalarColumn
from h5etl.sink.small_columns import SinkLayout
from h5etl.sink.writer import Sink


def _column(chunk_rows: int, trailing: tuple[int, ...], codec: str) -> RaggedColumn:
    level = 1 if codec == "gzip" else None
    return RaggedColumn.of(
        "int16", trailing, chunk_rows, compression=Codec(codec, level, "lz4", "byte")
    )


def _write(
    path: Path, column: RaggedColumn, batches: list[list[np.ndarray]], *, encoded: bool
) -> None:
    layout = SinkLayout(("train",), {"sig": column, "sig_length": ScalarColumn("int64")}, ("sig",))
    with Sink(path, layout) as sink:
        for number, samples in enumerate(batches):
            task = DecodeTask("train", number, (), 1, 1, final=number == len(batches) - 1)
            lengths = np.array([len(s) for s in samples], dtype=np.int64)
            values = (
                _encoded_rows(samples, column)
                if encoded
                else np.concatenate([np.empty((0, *column.trailing), np.int16), *samples])
            )
            result = BatchResult(task, len(samples))
            result.columns = {"sig": RaggedRows(values, lengths), "sig_length": lengths}
            result.keys = [f"{number}-{i}" for i in range(len(samples))]
            result.lineage = [(hashlib.sha256(k.encode()).hexdigest(),) for k in result.keys]
            sink.write(result)
        sink.finish({"name": "t"}, {})


batches_strategy = st.lists(st.lists(st.integers(0, 9), max_size=5), min_size=1, max_size=6)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=batches_strategy,
    chunk_rows=st.integers(1, 5),
    trailing=st.sampled_from([(), (2,), (3, 2)]),
    codec=st.sampled_from(["lzf", "gzip", "none"]),
)
def test_values_offsets_and_digests_for_any_cut(
    tmp_path_factory: pytest.TempPathFactory,
    lengths: list[list[int]],
    chunk_rows: int,
    trailing: tuple[int, ...],
    codec: str,
) -> None:
    rng = np.random.default_rng(len(lengths) * 7 + chunk_rows)
    batches = [
        [rng.integers(-500, 500, (n, *trailing)).astype(np.int16) for n in batch]
        for batch in lengths
    ]
    column = _column(chunk_rows, trailing, codec)
    samples = [s for batch in batches for s in batch]
    expected = np.concatenate([np.empty((0, *trailing), np.int16), *samples])
    ends = np.cumsum([0, *(len(s) for s in samples)])
    for encoded in (False, True) if chunk_rows == 1 else (False,):
        path = tmp_path_factory.mktemp("sink") / "t.h5"
        _write(path, column, batches, encoded=encoded)
        with h5py.File(path, "r") as handle:
            values, offsets = handle["train/sig"], handle["train/sig_offsets"]
            np.testing.assert_array_equal(offsets[...], ends)
            np.testing.assert_array_equal(values[...], expected)
            assert values.chunks == (chunk_rows, *trailing)
            assert values.id.get_num_chunks() == -(-len(expected) // chunk_rows)
            for i, sample in enumerate(samples):
                np.testing.assert_array_equal(values[offsets[i] : offsets[i + 1]], sample)
            node = handle[fileformat.DIAGNOSTICS_DATASETS]["train.sig"]
            blocks = [
                hashlib.sha256(expected[i : i + chunk_rows].tobytes()).hexdigest()
                for i in range(0, len(expected), chunk_rows)
            ]
            assert [b.decode() for b in node[fileformat.BLOCK_DIGESTS][...]] == blocks
            assert node.attrs["sha256"] == digest.combine([bytes.fromhex(b) for b in blocks])
            assert node.attrs["raw_bytes"] == expected.nbytes
            stream = handle[fileformat.DIAGNOSTICS_DATASETS]["train.sig_offsets"]
            assert stream.attrs["sha256"] == digest.combine(
                [hashlib.sha256(ends.astype(np.int64).tobytes()).digest()]
            )
