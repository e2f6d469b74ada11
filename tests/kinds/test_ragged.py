"""Ragged storage columns and kinds of several columns, end to end, through a tiny test-only
kind (``ragged_kind.NpyRecording``: an ``.npy`` recording of (n, 3) float32 per sample).

Expectations are computed here, from the ``.npy`` files with numpy, never from the product.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import dataset_digests, read_release
from ragged_kind import use_npy_recording

import h5etl
from h5etl.check.health import check_release
from h5etl.format import contract as fileformat
from h5etl.testing import run_killed_build

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

LENGTHS = (7, 0, 13, 1, 4, 9, 4, 22, 3, 5, 16, 2)  # 0: an empty recording is a sample too
CONFIG = """\
name: rec
output: releases
sources:
  rec: {dir: raw/rec, glob: "*.npy"}
splits: {train: 0.75, valid: 0.25}
storage: {chunk_samples: 2}
fields:
  rec: {kind: image, shape: [1, 4, 4], mode: L}
max_rejects: null  # bad.npy is broken on purpose: 1 of 13 is past the default share
"""


def make_recordings(root: Path, lengths: tuple[int, ...] = LENGTHS) -> dict[str, np.ndarray]:
    """``raw/rec/r<i>.npy`` of (n, 3) float32, plus ``bad.npy`` holding a NaN; the arrays by
    file name, and the config beside them."""
    rng = np.random.default_rng(3)
    folder = root / "raw" / "rec"
    folder.mkdir(parents=True, exist_ok=True)
    truth = {}
    for i, n in enumerate(lengths):
        array = rng.normal(size=(n, 3)).astype(np.float32)
        np.save(folder / f"r{i:02d}.npy", array)
        truth[f"r{i:02d}.npy"] = array
    bad = rng.normal(size=(5, 3)).astype(np.float32)
    bad[3, 2] = np.nan
    np.save(folder / "bad.npy", bad)
    (root / "config.yaml").write_text(CONFIG, "utf-8")
    return truth


def samples_of(path: Path, split: str, values: str = "rec") -> dict[str, np.ndarray]:
    """Each sample's values by file name, sliced by the offsets with h5py."""
    with h5py.File(path, "r") as handle:
        names = [n.decode() for n in handle[f"{split}/filename"][...]]
        data = handle[f"{split}/{values}"][...]
        offsets = handle[f"{split}/{values}_offsets"][...]
    return {n: data[offsets[i] : offsets[i + 1]] for i, n in enumerate(names)}


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, np.ndarray]]:
    truth = make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec")
    report = h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"))
    assert [(Path(r.path).name, r.reason) for r in report.rejects] == [("bad.npy", "nonfinite")]
    return tmp_path / "releases" / "rec.h5", truth


def test_ragged_values_and_offsets_round_trip(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, truth = built
    found = {**samples_of(path, "train"), **samples_of(path, "valid")}
    assert sorted(found) == sorted(truth)
    for name, array in truth.items():
        np.testing.assert_array_equal(found[name], array, err_msg=name)
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            offsets = handle[f"{split}/rec_offsets"]
            values = handle[f"{split}/rec"]
            assert offsets.dtype == np.int64
            assert offsets[0] == 0
            assert offsets[-1] == len(values)
            assert len(offsets) == len(handle[f"{split}/filename"]) + 1
            assert values.chunks == (5, 3)
            assert values.compression == "gzip"
            assert values.attrs["rate_hz"] == 100.0
            assert values.attrs["units"] == "g"
            names = [n.decode() for n in handle[f"{split}/filename"][...]]
            lengths = [len(truth[n]) for n in names]
            np.testing.assert_array_equal(np.diff(offsets[...]), lengths)
            np.testing.assert_array_equal(handle[f"{split}/rec_length"][...], lengths)
            firsts = [truth[n][0] if len(truth[n]) else np.zeros(3, np.float32) for n in names]
            np.testing.assert_array_equal(handle[f"{split}/rec_first"][...], np.stack(firsts))
            words = [w.decode() for w in handle[f"{split}/rec_word"][...]]
            assert words == [f"n={n}" for n in lengths]


def test_ragged_statistics_per_last_axis(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, truth = built
    with h5py.File(path, "r") as handle:
        names = [n.decode() for n in handle["train/filename"][...]]
        values = np.concatenate([truth[n] for n in names]).astype(np.float64)
        attrs = handle["train/rec"].attrs
        np.testing.assert_allclose(attrs["mean"], values.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(attrs["std"], values.std(axis=0), rtol=1e-9)
        np.testing.assert_array_equal(attrs["min"], values.min(axis=0))
        np.testing.assert_array_equal(attrs["count"], [len(values)] * 3)
        lengths = np.array([len(truth[n]) for n in names], dtype=np.float64)
        assert handle["train/rec_length"].attrs["mean"] == pytest.approx(lengths.mean())


def test_layout_record_lists_the_columns(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = built
    with h5py.File(path, "r") as handle:
        record = fileformat.read_layout(handle)
        raw = json.loads(handle.attrs[fileformat.LAYOUT_ATTR])
    assert raw["format"] == 2
    rec = record.fields["rec"]
    assert (rec.kind, rec.column, rec.dtype, rec.shape) == ("npyrec", "ragged", "float32", (3,))
    assert rec.extra["rate_hz"] == 100.0
    assert list(rec.columns) == ["rec_head", "rec_first", "rec_length", "rec_word"]
    storage = record.storage
    assert [storage[n].column for n in ("rec", "rec_first", "rec_length", "rec_word")] == [
        "ragged",
        "fixed",
        "fixed",
        "text",
    ]
    assert storage["rec_first"].shape == (3,)
    assert record.field_of("rec_first") == "rec"
    assert record.field_of("rec") == "rec"
    assert record.paths("train")["rec_word"] == "/train/rec_word"


def test_check_deep_passes_and_lists_offsets(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = built
    report = check_release(path, deep=True)
    assert report.ok, report.problems
    text = "\n".join(report.lines)
    assert "rec_offsets: (" in text
    assert "rec stats: mean [" in text
    with h5py.File(path, "r") as handle:
        nodes = handle[fileformat.DIAGNOSTICS_DATASETS]
        assert "train.rec_offsets" in nodes
        assert "train.rec" in nodes
        # one digest per block of chunk rows of values
        assert len(nodes["train.rec"][fileformat.BLOCK_DIGESTS]) == -(
            -len(handle["train/rec"]) // 5
        )


def test_check_finds_broken_offsets(
    built: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    path, _ = built
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())
    with h5py.File(copy, "r+") as handle:
        offsets = handle["train/rec_offsets"]
        offsets[2], offsets[3] = offsets[3] + 1, offsets[2]
    report = check_release(copy)
    assert any("rec_offsets: decreases after sample" in p for p in report.problems)
    deep = check_release(copy, deep=True)
    assert any("/train/rec_offsets: SHA-256 mismatch" in p for p in deep.problems)


def test_a_field_without_a_main_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    truth = make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec", main=False, chunk_rows=3, codec="lzf")
    h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"))
    path = tmp_path / "releases" / "rec.h5"
    with h5py.File(path, "r") as handle:
        record = fileformat.read_layout(handle)
        assert "rec" not in handle["train"]
        assert handle["train/rec_values"].chunks == (3, 3)
    assert record.fields["rec"].column == "none"
    assert "rec" not in record.storage
    assert "rec_values" in record.storage
    found = {**samples_of(path, "train", "rec_values"), **samples_of(path, "valid", "rec_values")}
    for name, array in truth.items():
        np.testing.assert_array_equal(found[name], array)
    assert check_release(path, deep=True).ok


def test_same_file_for_any_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_npy_recording(monkeypatch, "rec")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    files = []
    for jobs in (1, 2):
        root = tmp_path / f"j{jobs}"
        make_recordings(root)
        h5etl.build(h5etl.load_spec(root / "config.yaml"), jobs=jobs)
        files.append(root / "releases" / "rec.h5")
    assert dataset_digests(files[0]) == dataset_digests(files[1])
    assert files[0].read_bytes() == files[1].read_bytes()
    first, second = read_release(files[0]), read_release(files[1])
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def prelude(chunk_rows: int) -> str:
    """The killed build's first lines: this test-only kind in place, as in this process."""
    return f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
import ragged_kind
ragged_kind.install("rec", chunk_rows={chunk_rows})
"""


@pytest.mark.parametrize(
    ("jobs", "chunk_rows"),
    [pytest.param(1, 5, id="j1-carry"), pytest.param(2, 5, id="j2-carry"), (2, 1)],
)
def test_resume_after_a_kill_ends_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int, chunk_rows: int
) -> None:
    from h5etl.plan import tasks

    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # then the very same bytes
    use_npy_recording(monkeypatch, "rec", chunk_rows=chunk_rows)
    truth = make_recordings(tmp_path)
    config = h5etl.load_spec(tmp_path / "config.yaml")
    reference = h5etl.build(config, jobs=1)
    assert reference.path is not None
    expected = dataset_digests(reference.path)
    reference_bytes = reference.path.read_bytes()
    reference.path.unlink()
    (reference.path.parent / "rec.h5").unlink()

    killed = run_killed_build(tmp_path / "config.yaml", 5, jobs, prelude(chunk_rows))
    assert killed == -signal.SIGKILL
    journals = list((tmp_path / "releases").glob("*.journal"))
    deltas = [json.loads(line) for line in journals[0].read_text("utf-8").splitlines()[1:]]
    carried = [c["carry_rows"] for d in deltas for c in d.get("ragged", {}).values()]
    # with chunks of several rows, some checkpoint held values between chunks (the carry)
    assert any(carried) == (chunk_rows > 1)
    resumed = h5etl.build(config, jobs=jobs, resume=True)

    assert resumed.path is not None
    assert 0 < resumed.resumed < sum(resumed.samples.values())
    assert dataset_digests(resumed.path) == expected
    assert resumed.path.read_bytes() == reference_bytes
    found = {**samples_of(resumed.path, "train"), **samples_of(resumed.path, "valid")}
    for name, array in truth.items():
        np.testing.assert_array_equal(found[name], array)
    report = check_release(resumed.path, deep=True)
    assert report.ok, report.problems


def _by_name(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {str(n): batch["rec"][i] for i, n in enumerate(batch["filename"])}


def test_release_reads_one_array_per_sample(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    from h5etl.readers import Release

    path, truth = built
    with Release(path, "train") as release:
        assert set(release.fields) >= {"rec", "rec_first", "rec_length", "rec_word", "filename"}
        assert release.chunk_rows == 4  # rec_head's chunks, not the values' (5 rows)
        whole = release.read_slice(0, len(release))
        assert whole["rec"].dtype == object
        assert whole["rec"].shape == (len(release),)
        picked = release.read([3, 0, 3, -1])
        assert release.stats["rec"]["mean"].shape == (3,)
    for name, array in _by_name(whole).items():
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, truth[name])
    names = [str(n) for n in whole["filename"]]
    for position, index in enumerate([3, 0, 3, len(names) - 1]):
        np.testing.assert_array_equal(picked["rec"][position], truth[names[index]])
        assert picked["rec_length"][position] == len(truth[names[index]])
    assert release.read_slice(2, 2)["rec"].shape == (0,)


def test_release_reads_a_field_of_columns_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h5etl.readers import iter_batches

    truth = make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec", main=False)
    h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"))
    path = tmp_path / "releases" / "rec.h5"
    seen = {}
    for split in ("train", "valid"):
        for batch in iter_batches(path, split, 3, fields=["rec", "filename"], shuffle=True):
            assert set(batch) == {
                "rec_values",
                "rec_head",
                "rec_first",
                "rec_length",
                "rec_word",
                "filename",
            }
            for i, name in enumerate(batch["filename"]):
                seen[str(name)] = batch["rec_values"][i]
    assert sorted(seen) == sorted(truth)
    for name, array in truth.items():
        np.testing.assert_array_equal(seen[name], array)


def test_torch_dataset_gives_per_sample_arrays(built: tuple[Path, dict[str, np.ndarray]]) -> None:
    import torch.utils.data

    from h5etl.readers.torch import H5Dataset

    path, truth = built

    def collate(samples: list[dict[str, object]]) -> dict[str, object]:
        # what a ragged collate does: pad to the longest, keep the lengths
        arrays = [np.asarray(s["rec"]) for s in samples]
        longest = max(len(a) for a in arrays)
        padded = np.zeros((len(arrays), longest, 3), np.float32)
        for i, a in enumerate(arrays):
            padded[i, : len(a)] = a
        return {
            "rec": torch.from_numpy(padded),
            "lengths": torch.tensor([len(a) for a in arrays]),
            "filename": [s["filename"] for s in samples],
        }

    dataset = H5Dataset(path, "train", fields=["rec", "filename"])
    item = dataset[1]
    np.testing.assert_array_equal(item["rec"], truth[item["filename"]])
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=collate)
    for batch in loader:
        for i, name in enumerate(batch["filename"]):
            n = int(batch["lengths"][i])
            np.testing.assert_array_equal(batch["rec"][i, :n].numpy(), truth[name])
            assert not batch["rec"][i, n:].any()
    dataset.close()


def test_keras_needs_a_transform_for_ragged_columns(
    built: tuple[Path, dict[str, np.ndarray]],
) -> None:
    from h5etl.errors import ReaderError
    from h5etl.readers.keras import KerasDataset

    path, _ = built
    plain = KerasDataset(path, "train", x="rec", y="rec_length", batch_size=3, shuffle=False)
    with pytest.raises(ReaderError, match=r"rec: a ragged column .* pass transform="):
        plain[0]

    def crop(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fixed = np.zeros((len(batch["rec"]), 2, 3), np.float32)
        for i, sample in enumerate(batch["rec"]):
            fixed[i, : min(2, len(sample))] = sample[:2]
        return {**batch, "rec": fixed}

    cropped = KerasDataset(
        path, "train", x="rec", y="rec_length", batch_size=3, shuffle=False, transform=crop
    )
    x, y = cropped[0]
    assert x.shape == (3, 2, 3)
    assert y.dtype == np.int64


@pytest.mark.parametrize("jobs", [1, 2])
def test_one_row_per_chunk_is_compressed_in_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    truth = make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec", chunk_rows=1, codec="zstd")
    report = h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"), jobs=jobs)
    assert report.path is not None
    # every sample starts a chunk: the writer stores what the workers compressed
    assert report.chunk_paths["/train/rec:rechunked"] == 0
    rows = sum(len(truth[n]) for n in samples_of(report.path, "train"))
    assert report.chunk_paths["/train/rec:direct"] == rows
    found = {**samples_of(report.path, "train"), **samples_of(report.path, "valid")}
    for name, array in truth.items():
        np.testing.assert_array_equal(found[name], array)
    with h5py.File(report.path, "r") as handle:
        assert handle["train/rec"].chunks == (1, 3)
        assert handle["train/rec"].id.get_num_chunks() == rows
    assert check_release(report.path, deep=True).ok


def test_a_fixed_column_of_fewer_rows_is_padded_and_its_stats_skip_the_padding(
    built: tuple[Path, dict[str, np.ndarray]],
) -> None:
    from ragged_kind import HEAD

    path, truth = built
    with h5py.File(path, "r") as handle:
        names = [n.decode() for n in handle["train/filename"][...]]
        head = handle["train/rec_head"]
        assert head.shape == (len(names), HEAD, 3)
        assert head.chunks == (4, HEAD, 3)
        for i, name in enumerate(names):
            n = min(HEAD, len(truth[name]))
            np.testing.assert_array_equal(head[i, :n], truth[name][:n])
            assert (head[i, n:] == -1.0).all()  # the column's fill
        kept = np.concatenate([truth[n][:HEAD] for n in names]).astype(np.float64)
        np.testing.assert_allclose(head.attrs["mean"], kept.mean(axis=0), rtol=1e-12)
        np.testing.assert_array_equal(head.attrs["count"], [len(kept)] * 3)


def test_preview_draws_a_kind_through_its_drawer(
    built: tuple[Path, dict[str, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ragged_kind

    from h5etl.config.fields.registry import REGISTRY
    from h5etl.preview.sheet import render_preview

    path, truth = built
    with pytest.raises(h5etl.errors.ReaderError, match="nor a field of a kind that draws"):
        render_preview(path, split="train")
    entries = REGISTRY.entries
    assert isinstance(entries, dict)
    monkeypatch.setitem(entries, "npyrec", ragged_kind.ENTRY)  # registered, as a plugin's is
    ragged_kind.DRAWN.clear()
    picture = render_preview(path, split="train", n=4)
    assert picture.width > 4 * 12
    with h5py.File(path, "r") as handle:
        names = [n.decode() for n in handle["train/filename"][:4]]
    assert [(f, i) for f, i, _ in ragged_kind.DRAWN] == [("rec", i) for i in range(4)]
    for (_, _, row), name in zip(ragged_kind.DRAWN, names, strict=True):
        array = truth[name]
        expected = array[len(array) // 2 : len(array) // 2 + 1]
        np.testing.assert_array_equal(row, expected)


def test_a_file_size_limit_while_writing_ragged_values(tmp_path: Path) -> None:
    """Values re-cut by the writer and written past a file-size limit (EFBIG): one line,
    exit 1, no release and no temp file left."""
    make_recordings(tmp_path, lengths=tuple(3000 + 17 * i for i in range(40)))  # ~1.5 MiB
    limit = 2**19
    script = prelude(5) + textwrap.dedent(
        """
        import runpy
        sys.argv = ["h5etl", "build", sys.argv[1], "--quiet", "--jobs", "2"]
        runpy.run_module("h5etl", run_name="__main__")
        """
    )

    def file_size_limit() -> None:  # in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        soft = limit if hard == resource.RLIM_INFINITY or limit <= hard else hard
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "config.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=file_size_limit,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback
    assert "file too large" in lines[0]
    left = sorted(p.name for p in (tmp_path / "releases").iterdir())
    assert [n for n in left if n.endswith((".h5", ".journal"))] == [], left


def test_a_worker_crash_costs_only_its_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    import ragged_kind

    from h5etl.execute import schedule

    truth = make_recordings(tmp_path)
    use_npy_recording(monkeypatch, "rec", chunk_rows=3)
    worker = functools.partial(ragged_kind.decode_or_die, parent=os.getpid())
    monkeypatch.setattr(schedule, "run_tasks", functools.partial(schedule.run_tasks, worker=worker))
    report = h5etl.build(h5etl.load_spec(tmp_path / "config.yaml"), jobs=2)
    assert report.path is not None
    crashed = {Path(r.path).name for r in report.rejects if r.reason == "worker_crashed"}
    assert crashed == {"r03.npy"}
    found = {**samples_of(report.path, "train"), **samples_of(report.path, "valid")}
    assert sorted(found) == sorted(set(truth) - {"r03.npy"})
    for name, array in found.items():
        np.testing.assert_array_equal(array, truth[name])
    assert check_release(report.path, deep=True).ok


class _Columns:
    """A field model's one method the path rule reads: the datasets the field stores."""

    def __init__(self, *names: str):
        self.names = names

    def dataset_names(self, field_name: str) -> tuple[str, ...]:
        return self.names


@pytest.mark.parametrize(
    ("layout", "clash"),
    [("{split}/{field}", "/train/ct_offsets"), ("{field}_{split}", None)],
)
def test_the_path_rule_places_offsets_where_the_sink_does(layout: str, clash: str | None) -> None:
    from types import SimpleNamespace

    from h5etl.config.storage_rules import path_problems

    # ct's offsets are ct's path + "_offsets": /train/ct_offsets, or /ct_train_offsets beside
    # /ct_train; a field named ct_offsets takes /train/ct_offsets, or /ct_offsets_train
    spec = SimpleNamespace(
        fields={"ct": _Columns("ct", "ct_offsets"), "ct_offsets": _Columns("ct_offsets")},
        splits={"train": 1.0},
        layout=layout,
    )
    problems = path_problems(spec)
    if clash is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert f"both at {clash}" in problems[0].message
        assert "field ct's column ct_offsets of split train" in problems[0].message
