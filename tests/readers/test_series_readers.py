"""Reading a series release: per-sample dicts, the padding collate (numpy and torch), preview."""

from __future__ import annotations

import ast
import io
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image
from test_kind_series import ACCEL_HZ, LENGTHS, build, make_recordings, series_config

from h5etl.errors import ReaderError
from h5etl.readers.series import SeriesReader, collate, collate_torch


@pytest.fixture(scope="module")
def release(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("series")
    expected = make_recordings(root, LENGTHS)
    report = build(series_config(root), jobs=1)
    assert report.path is not None
    return report.path, expected


def _name(path: Path, index: int) -> str:
    with h5py.File(path, "r") as handle:
        return Path(handle["train/filename"][index].decode()).name


def test_a_sample_is_a_dict_of_its_channels(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    path, expected = release
    reader = SeriesReader(path, "train")
    assert len(reader) == len(LENGTHS)
    assert set(reader.channels) == {"rec_accel", "rec_volts", "rec_temp"}
    assert reader.channels["rec_accel"].rate_hz == ACCEL_HZ
    assert reader.channels["rec_accel"].trailing == (3,)
    assert reader.channels["rec_temp"].units == "degC"
    for index in range(len(reader)):
        want = expected[_name(path, index)]
        sample = reader[index]
        np.testing.assert_array_equal(sample["rec_accel"], want["accel"])
        np.testing.assert_array_equal(sample["rec_volts"], want["volts"])
        np.testing.assert_array_equal(sample["rec_temp_time"], want["time"] - want["time"][0])
        assert float(sample["rec_start_time"]) == want["time"][0]
    np.testing.assert_array_equal(reader[-1]["rec_accel"], reader[len(reader) - 1]["rec_accel"])
    with pytest.raises(IndexError):
        reader[len(reader)]
    copy = pickle.loads(pickle.dumps(reader))  # a DataLoader worker gets a recipe, not a handle
    np.testing.assert_array_equal(copy[0]["rec_accel"], reader[0]["rec_accel"])
    reader.close()


def test_collate_pads_each_channel_and_returns_lengths(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    path, _ = release
    with SeriesReader(path) as reader:
        samples = [reader[i] for i in range(3)]
    batch, lengths = collate(samples, pad_value=-7.0)
    longest = max(len(s["rec_accel"]) for s in samples)
    assert batch["rec_accel"].shape == (3, longest, 3)
    assert batch["rec_start_time"].shape == (3,)
    for row, sample, n in zip(batch["rec_accel"], samples, lengths["rec_accel"], strict=True):
        assert n == len(sample["rec_accel"])
        np.testing.assert_array_equal(row[:n], sample["rec_accel"])
        assert (row[n:] == -7.0).all()
    assert lengths["rec_temp_time"].dtype == np.int64
    shortest = lengths["rec_temp_time"].argmin()
    assert np.isnan(batch["rec_temp_time"][shortest, -1])  # times pad with NaN


def test_collate_torch_gives_tensors_for_a_dataloader(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    torch = pytest.importorskip("torch")
    path, _ = release
    loader = torch.utils.data.DataLoader(SeriesReader(path), batch_size=4, collate_fn=collate_torch)
    batches = list(loader)
    assert sum(len(lengths["rec_accel"]) for _, lengths in batches) == len(LENGTHS)
    batch, lengths = batches[0]
    assert batch["rec_accel"].dtype == torch.float32
    assert batch["rec_accel"].shape[0] == 4
    assert lengths["rec_accel"].dtype == torch.int64


def test_a_release_without_that_split_or_field_is_a_reader_error(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    path, _ = release
    with pytest.raises(ReaderError, match="no split 'test'"):
        SeriesReader(path, "test")
    with pytest.raises(ReaderError, match="no series field 'x'"):
        SeriesReader(path, "train", "x")


def test_preview_draws_a_line_plot_per_channel(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]], tmp_path: Path
) -> None:
    from h5etl.preview.sheet import write_preview

    path, _ = release
    out = write_preview(path, tmp_path / "p.png", n=3)
    with Image.open(out) as image:
        pixels = np.asarray(image.convert("RGB"))
    blue = (pixels == (31, 119, 180)).all(axis=2)  # the first component's line colour
    red = (pixels == (214, 39, 40)).all(axis=2)  # the second: accel's y, in its own band
    assert blue.sum() > 300
    assert red.sum() > 100
    rows = np.flatnonzero(blue.any(axis=1))
    assert rows.max() - rows.min() > 100  # three tiles of stacked channel plots, not one line


def test_a_preview_tile_plots_each_channel(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    import h5py

    from h5etl.format import contract as fileformat
    from h5etl.preview.drawn import PreviewSample
    from h5etl.preview.series import PLOT_H, TITLE, draw

    path, _ = release
    with h5py.File(path, "r") as handle:
        tile = draw(PreviewSample(handle, fileformat.read_layout(handle), "train", 0), "rec")
    assert tile.height == 3 * (PLOT_H + TITLE)  # accel, volts, temp


def test_npy_headers_are_parsed_under_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPython 3.11 raised SystemError ("AST constructor recursion depth mismatch") in a series
    # build whose header probes ran in threads: numpy parses the header with ast.literal_eval
    from h5etl.inputs import channels as series
    from h5etl.inputs.volumes.slices import decode_slice

    held: list[bool] = []
    real = ast.literal_eval

    def spy(text: str) -> object:
        held.append(series.NPY_HEADER_LOCK.locked())
        return real(text)

    monkeypatch.setattr(ast, "literal_eval", spy)  # numpy's header parse, however it is reached
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((20, 3), np.uint16))
    assert series.npy_header(buffer.getvalue(), "a.npy")[:2] == ((20, 3), np.dtype(np.uint16))
    assert decode_slice(buffer.getvalue(), "slice.npy").shape == (20, 3)  # np.load's parse
    assert held == [True, True]


def test_series_reader_and_release_name_every_column_alike(
    release: tuple[Path, dict[str, dict[str, np.ndarray]]],
) -> None:
    # SeriesReader said "accel" where Release (and the file) said "rec_accel"
    from h5etl.readers import Release

    path, _ = release
    with SeriesReader(path, "train") as reader, Release(path, "train", fields=["rec"]) as rows:
        assert set(reader[0]) == set(rows.fields)
        assert set(reader.channels) <= set(rows.fields)
        for index in range(len(reader)):
            batch = rows.read([index])
            for name, value in reader[index].items():
                np.testing.assert_array_equal(value, batch[name][0], err_msg=name)
