"""The layout record: readers, ``check`` and ``preview`` follow what a release records.

Release files are written here by hand with h5py, the way ``h5etl.format.contract`` says a build
writes them (root attrs with the ``layout`` JSON, datasets at the template's paths, one
``/diagnostics/datasets`` node per dataset with digests computed as the sink computes them),
for both templates: two image fields of different shapes, a mask, an int64 label with its
class names and a text field. Releases of today's build (no record) keep working too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

import h5py
import numpy as np
import pytest
import yaml
from conftest import MakeRaw, WriteConfig

import h5etl
from h5etl.check.health import check_release
from h5etl.format import contract as fileformat
from h5etl.format import digest
from h5etl.format.contract import FieldRecord, LayoutRecord
from h5etl.preview import sheet as preview
from h5etl.readers import ReaderError, Release, iter_batches

SPLITS = {"train": 6, "valid": 3}
CLASSES = ("cat", "dog", "owl")
LABELS = {"train": [0, 2, 1, 0, 2, 2], "valid": [1, 0, 2]}
ROWS = 4  # rows per chunk of every dataset
TEMPLATES = [pytest.param(t, id=t.replace("/", "|")) for t in fileformat.TEMPLATES]


@dataclass
class Column:
    """One field as the helper writes it: its record and its rows per split."""

    record: FieldRecord
    rows: dict[str, Any]  # split -> array of rows, or list of str for a text field


def columns(seed: int = 0, *, label_dtype: str = "int64") -> dict[str, Column]:
    """low (3, 8, 8), high (3, 32, 32), mask (1, 32, 32), label (int64, classes), name."""
    rng = np.random.default_rng(seed)

    def pixels(shape: tuple[int, ...], top: int) -> dict[str, np.ndarray]:
        return {s: rng.integers(0, top, (n, *shape), dtype=np.uint8) for s, n in SPLITS.items()}

    names = {s: [f"{s}_{i:02d}.png" for i in range(n)] for s, n in SPLITS.items()}
    return {
        "low": Column(FieldRecord("image", "fixed", "uint8", (3, 8, 8)), pixels((3, 8, 8), 256)),
        "high": Column(
            FieldRecord("image", "fixed", "uint8", (3, 32, 32)), pixels((3, 32, 32), 256)
        ),
        "mask": Column(
            FieldRecord("mask", "fixed", "uint8", (1, 32, 32), {"values": [0, 1, 2]}),
            pixels((1, 32, 32), 3),
        ),
        "label": Column(
            FieldRecord("label", "fixed", label_dtype, (), {"classes": list(CLASSES)}),
            {s: np.array(v, dtype=label_dtype) for s, v in LABELS.items()},
        ),
        "name": Column(FieldRecord("text", "text", "str", ()), names),
    }


def _stats_attrs(record: FieldRecord, rows: np.ndarray) -> dict[str, Any]:
    """What the build stores on a dataset: per-channel statistics, or a value histogram."""
    if record.kind == "image":
        axes = (0, *range(2, rows.ndim))
        return {
            "mean": rows.mean(axis=axes, dtype=np.float64),
            "std": rows.std(axis=axes, dtype=np.float64),
            "min": rows.min(axis=axes).astype(np.float64),
            "max": rows.max(axis=axes).astype(np.float64),
            "count": rows.size // rows.shape[1],
        }
    if record.kind in ("mask", "label"):
        values, counts = np.unique(rows, return_counts=True)
        return {"histogram_values": values.astype(np.int64), "histogram_counts": counts}
    return {}


def _create(handle: h5py.File, path: str, column: Column, split: str) -> tuple[list[bytes], int]:
    """Store one column at ``path``; return its block digests and block rows as the sink does."""
    rows = column.rows[split]
    record = column.record
    if record.column == "text":
        handle.create_dataset(
            path,
            data=np.array(rows, dtype=object),
            dtype=h5py.string_dtype("utf-8"),
            chunks=(ROWS,),
            maxshape=(None,),
        )
        return [hashlib.sha256(digest.text_rows_bytes(rows)).digest()], 0
    if not record.shape:  # a scalar column: appended like text, hashed as one stream
        dataset = handle.create_dataset(path, data=rows, chunks=(ROWS,), maxshape=(None,))
        dataset.attrs.update(_stats_attrs(record, rows))
        return [digest.block_digest(rows)], 0
    dataset = handle.create_dataset(
        path,
        data=rows,
        chunks=(ROWS, *record.shape),
        maxshape=(None, *record.shape),
        compression="lzf",
        shuffle=True,
    )
    dataset.attrs.update(_stats_attrs(record, rows))
    return digest.array_digest(rows, ROWS)[1], ROWS


def write_release(
    path: Path,
    cols: dict[str, Column],
    *,
    template: str = fileformat.DEFAULT_TEMPLATE,
) -> Path:
    """A release file as the contract lays it out, written with h5py alone."""
    record = LayoutRecord(template, tuple(SPLITS), {n: c.record for n, c in cols.items()})
    config = yaml.safe_dump(
        {
            "name": "hand",
            "layout": template,
            "fields": {n: {"kind": c.record.kind} for n, c in cols.items()},
        }
    )
    reports: dict[str, tuple[list[bytes], int, int]] = {}
    with h5py.File(path, "w", track_order=True) as handle:
        for split in SPLITS:
            for name, column in cols.items():
                where = record.path(split, name)
                blocks, block_rows = _create(handle, where, column, split)
                dataset = handle[where]
                if column.record.kind == "label":
                    dataset.attrs[fileformat.CLASSES_ATTR] = list(CLASSES)
                raw = (
                    sum(len(r.encode()) for r in column.rows[split])
                    if column.record.column == "text"
                    else column.rows[split].nbytes
                )
                reports[where] = (blocks, block_rows, raw)
            lineage = np.array(
                [
                    [hashlib.sha256(f"{split}{i}{k}".encode()).hexdigest() for k in "ab"]
                    for i in range(SPLITS[split])
                ],
                dtype="S64",
            )
            where = record.lineage_path(split)
            handle.create_dataset(where, data=lineage, chunks=(ROWS, 2), maxshape=(None, 2))
            handle[where].attrs[fileformat.LINEAGE_COLUMNS_ATTR] = ["high", "mask"]
            reports[where] = ([digest.block_digest(lineage)], 0, lineage.nbytes)
        handle.attrs.update(
            {
                "name": "hand",
                "version": 1,
                "created_at": "2024-01-01T00:00:00Z",
                "config": config,
                "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
                "source_fingerprint": "0" * 64,
                "h5etl_version": h5etl.__version__,
                fileformat.LAYOUT_ATTR: record.to_json(),
            }
        )
        group = handle.create_group(fileformat.DIAGNOSTICS)
        group.attrs["rejects_total"] = 0
        for split, count in SPLITS.items():
            group.attrs[f"samples_{split}"] = count
        nodes = handle.create_group(fileformat.DIAGNOSTICS_DATASETS)
        for where, (blocks, block_rows, raw) in reports.items():
            node = nodes.create_group(fileformat.diagnostics_node(where))
            stored = int(handle[where].id.get_storage_size())
            node.attrs.update(
                {
                    "dataset": where,
                    "sha256": digest.combine(blocks),
                    "raw_bytes": raw,
                    "stored_bytes": stored,
                    "ratio": round(raw / stored, 4) if stored else 0.0,
                    "block_rows": block_rows,
                }
            )
            node.create_dataset(
                fileformat.BLOCK_DIGESTS, data=np.array([b.hex() for b in blocks], dtype="S64")
            )
    return path


@pytest.fixture(params=TEMPLATES)
def hand(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, Column]]:
    cols = columns()
    return write_release(tmp_path / "hand.h5", cols, template=request.param), cols


def _set_layout(path: Path, change: Any) -> None:
    with h5py.File(path, "r+") as handle:
        data = json.loads(handle.attrs[fileformat.LAYOUT_ATTR])
        handle.attrs[fileformat.LAYOUT_ATTR] = json.dumps(change(data))


# --- the readers ---------------------------------------------------------------------------


def test_datasets_sit_at_the_template_paths(hand: tuple[Path, dict[str, Column]]) -> None:
    path, _ = hand
    with h5py.File(path, "r") as handle:
        record = fileformat.read_layout(handle)
        assert not record.inferred
        for split in SPLITS:
            for name in ("low", "high", "label", "name"):
                assert isinstance(handle.get(record.path(split, name)), h5py.Dataset)
        flat = record.template == "{field}_{split}"
        assert ("low_train" in handle) == flat
        assert ("train" in handle) == (not flat)


def test_release_reads_every_field_the_record_lists(hand: tuple[Path, dict[str, Column]]) -> None:
    path, cols = hand
    for split, count in SPLITS.items():
        with Release(path, split) as reader:
            assert reader.fields == ("low", "high", "mask", "label", "name")  # no lineage
            assert len(reader) == count
            batch = reader.read_slice(0, count)
            picked = reader.read([count - 1, 0])
        for name in ("low", "high", "mask", "label"):
            np.testing.assert_array_equal(batch[name], cols[name].rows[split])
            np.testing.assert_array_equal(picked[name], cols[name].rows[split][[count - 1, 0]])
        assert list(batch["name"]) == cols["name"].rows[split]
        assert batch["label"].dtype == np.int64
        assert batch["label"].shape == (count,)
        assert batch["low"].shape[1:] == (3, 8, 8)
        assert batch["high"].shape[1:] == (3, 32, 32)


def test_iter_batches_gives_both_image_shapes_in_one_batch(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, cols = hand
    seen: list[str] = []
    for batch in iter_batches(path, "train", 3, fields=["high", "low", "label", "name"]):
        assert list(batch) == ["high", "low", "label", "name"]
        assert batch["high"].shape == (len(batch["name"]), 3, 32, 32)
        assert batch["low"].shape == (len(batch["name"]), 3, 8, 8)
        assert batch["label"].dtype == np.int64
        for row, name in enumerate(batch["name"]):
            index = cols["name"].rows["train"].index(name)
            np.testing.assert_array_equal(batch["low"][row], cols["low"].rows["train"][index])
            np.testing.assert_array_equal(batch["high"][row], cols["high"].rows["train"][index])
            assert batch["label"][row] == LABELS["train"][index]
            seen.append(name)
    assert sorted(seen) == cols["name"].rows["train"]


def test_release_exposes_layout_classes_and_statistics(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, cols = hand
    with Release(path, "train") as reader:
        assert reader.layout.fields["label"].kind == "label"
        assert reader.classes == {"label": CLASSES}
        high = cols["high"].rows["train"]
        np.testing.assert_allclose(reader.stats["high"]["mean"], high.mean(axis=(0, 2, 3)))
        np.testing.assert_allclose(reader.stats["high"]["std"], high.std(axis=(0, 2, 3)))
        assert set(reader.stats["low"]) == set(fileformat.STAT_ATTRS)
        assert reader.stats["name"] == {}
        values, counts = np.unique(LABELS["train"], return_counts=True)
        np.testing.assert_array_equal(reader.stats["label"]["histogram_values"], values)
        np.testing.assert_array_equal(reader.stats["label"]["histogram_counts"], counts)


def test_flat_names_x_y(tmp_path: Path) -> None:
    cols = columns(label_dtype="uint8")  # a label stored narrow still reads as int64
    flat = {"x": cols["low"], "y": cols["label"]}
    path = write_release(tmp_path / "xy.h5", flat, template="{field}_{split}")
    with h5py.File(path, "r") as handle:
        assert {"x_train", "y_train", "x_valid", "y_valid"} <= set(handle)
    with Release(path, "valid") as reader:
        assert reader.fields == ("x", "y")
        batch = reader.read([2, 0, 1])
    np.testing.assert_array_equal(batch["x"], cols["low"].rows["valid"][[2, 0, 1]])
    assert batch["y"].dtype == np.int64
    assert batch["y"].tolist() == [2, 1, 0]
    assert check_release(path, deep=True).ok


def test_unknown_split_or_field_names_what_the_record_has(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, _ = hand
    with pytest.raises(ReaderError, match="no split 'test'; the release has: train, valid"):
        Release(path, "test")
    with pytest.raises(ReaderError, match="no field age; it has: low, high, mask, label, name"):
        Release(path, "train", fields=["low", "age"])


def test_a_dataset_the_record_lists_but_the_file_lacks_is_a_reader_error(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, _ = hand
    with h5py.File(path, "r+") as handle:
        missing = fileformat.read_layout(handle).path("train", "high")
        del handle[missing]
    with pytest.raises(ReaderError, match=f"{missing}.*missing"):
        Release(path, "train")
    with Release(path, "train", fields=["low"]) as reader:  # the other fields still read
        assert len(reader) == SPLITS["train"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(lambda d: {**d, "format": 99}, "newer than this h5etl", id="newer"),
        pytest.param(lambda d: {**d, "template": "{nope}"}, "layout record", id="template"),
        pytest.param(lambda d: {"fields": {}}, "layout record", id="no-template"),
    ],
)
def test_a_damaged_or_newer_record_is_one_reader_error(
    hand: tuple[Path, dict[str, Column]], change: Any, message: str
) -> None:
    path, _ = hand
    _set_layout(path, change)
    with pytest.raises(ReaderError, match=message) as caught:
        Release(path, "train")
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_torch_loader_gives_int64_labels_and_both_shapes(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    path, cols = hand
    dataset = H5Dataset(path, "train", batch_size=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=dataset.batch_sampler(4, shuffle=False), num_workers=2
    )
    labels = []
    for batch in loader:
        assert batch["label"].dtype == torch.int64
        assert tuple(batch["low"].shape[1:]) == (3, 8, 8)
        assert tuple(batch["high"].shape[1:]) == (3, 32, 32)
        labels.extend(batch["label"].tolist())
    assert labels == LABELS["train"]
    sample = dataset[1]
    assert isinstance(sample["name"], str)
    np.testing.assert_array_equal(sample["high"], cols["high"].rows["train"][1])
    dataset.close()


def test_keras_dataset_gives_int64_labels(hand: tuple[Path, dict[str, Column]]) -> None:
    pytest.importorskip("keras")
    from h5etl.readers import KerasDataset

    path, cols = hand
    dataset = KerasDataset(path, "train", x=("low", "high"), y="label", batch_size=4, shuffle=False)
    inputs, target = dataset[0]
    assert target.dtype == np.int64
    assert target.tolist() == LABELS["train"][:4]
    np.testing.assert_array_equal(inputs["high"], cols["high"].rows["train"][:4])
    assert inputs["low"].shape == (4, 3, 8, 8)
    dataset.close()


def test_todays_build_without_a_record_still_reads(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=6)
    built = h5etl.build(h5etl.load_spec(write_config(tmp_path, splits={"train": 1.0})), jobs=1)
    assert built.path is not None
    with h5py.File(built.path, "r+") as handle:  # as an older release: no record
        if fileformat.LAYOUT_ATTR in handle.attrs:
            del handle.attrs[fileformat.LAYOUT_ATTR]
        truth = handle["train/image"][...]
    with Release(built.path, "train") as reader:
        assert reader.layout.inferred
        assert reader.fields == ("image", "mask", "filename")
        assert reader.classes == {}
        np.testing.assert_array_equal(reader.read_slice(0, 6)["image"], truth)
    report = check_release(built.path, deep=True)
    assert report.ok, report.problems
    assert any(line.startswith("  mask values: ") for line in report.lines)
    assert preview.render_preview(built.path, n=2).width > 0


# --- check -----------------------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    report = check_release(path, deep=True)
    assert report.ok, report.problems
    return report.lines


def test_check_passes_a_release_laid_out_by_its_record(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, cols = hand
    lines = _lines(path)
    text = "\n".join(lines)
    assert "all SHA-256 digests equal" in text
    assert "  label classes: cat 2, dog 1, owl 3" in lines
    assert "  label classes: cat 1, dog 1, owl 1" in lines
    mean = cols["high"].rows["train"].mean(axis=(0, 2, 3))
    high = next(line for line in lines if line.startswith("  high stats: "))  # train's
    assert f"mean [{mean[0]:.4g}, {mean[1]:.4g}, {mean[2]:.4g}]" in high
    for word in ("std [", "min [", "max ["):
        assert word in high
    histogram = next(line for line in lines if line.startswith("  label histogram: "))
    assert histogram == "  label histogram: 0 2, 1 1, 2 3"
    assert any(line.startswith("  mask histogram (unpadded pixels): 0 ") for line in lines)
    assert any(line.startswith("  mask values: 0 ") for line in lines)
    assert not any(line.startswith("  name stats") for line in lines)


def test_check_flags_a_label_outside_its_classes(hand: tuple[Path, dict[str, Column]]) -> None:
    path, _ = hand
    with h5py.File(path, "r+") as handle:
        where = fileformat.read_layout(handle).path("valid", "label")
        handle[where][1] = 5
    report = check_release(path)
    assert report.problems == [f"{where}: label values [5] outside 0..2 (classes cat, dog, owl)"], (
        report.problems
    )


def test_check_flags_a_mask_value_the_record_does_not_declare(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, _ = hand
    with h5py.File(path, "r+") as handle:
        where = fileformat.read_layout(handle).path("train", "mask")
        handle[where][0, 0, 0, 0] = 7
    problems = check_release(path).problems
    assert problems == [f"{where}: values [7] outside the declared [0, 1, 2]"], problems


def test_check_flags_a_dataset_the_record_lists_but_the_file_lacks(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, _ = hand
    with h5py.File(path, "r+") as handle:
        where = fileformat.read_layout(handle).path("train", "label")
        del handle[where]
    problems = check_release(path).problems
    assert [p for p in problems if where in p] == [
        f"{where}: field 'label' of split 'train' is in the layout record, missing from the file"
    ], problems


def test_check_flags_a_split_the_record_lists_but_the_file_lacks(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, _ = hand
    with h5py.File(path, "r+") as handle:
        record = fileformat.read_layout(handle)
        for where in [*record.paths("valid").values(), record.lineage_path("valid")]:
            del handle[where]
        if "valid" in handle:
            del handle["valid"]
    problems = check_release(path).problems
    split_lines = [p for p in problems if "'valid'" in p and "layout record" in p]
    assert split_lines == ["split 'valid' is in the layout record, missing from the file"], problems


@pytest.mark.parametrize(
    ("change", "word"),
    [
        pytest.param(lambda d: {**d, "format": 99}, "upgrade h5etl", id="newer"),
        pytest.param(lambda d: [1, 2], "damaged", id="damaged"),
    ],
)
def test_check_says_a_damaged_or_newer_record_in_one_line(
    tmp_path: Path, change: Any, word: str
) -> None:
    path = write_release(tmp_path / "hand.h5", columns())  # {split}/{field}: groups to read
    _set_layout(path, change)
    report = check_release(path)
    record_problems = [p for p in report.problems if "layout record" in p]
    assert len(record_problems) == 1, report.problems
    assert word in record_problems[0]
    assert "\n" not in record_problems[0]


# --- preview ---------------------------------------------------------------------------------


def test_preview_roles_come_from_the_record(hand: tuple[Path, dict[str, Column]]) -> None:
    path, _ = hand
    with h5py.File(path, "r") as handle:
        roles = preview.roles(fileformat.read_layout(handle))
    # high: 3 channels and the mask's size; low is first but the mask would not fit it
    assert roles == preview.Roles(image="high", mask="mask", captions=("label", "name"))


def test_preview_draws_the_mask_over_the_image_and_names_the_class(
    hand: tuple[Path, dict[str, Column]],
) -> None:
    path, cols = hand
    sheet = np.asarray(preview.render_preview(path, split="train", n=2))
    scale = 192 // 32
    grow = np.ones((1, scale, scale), np.uint8)
    expected = preview.overlay(
        np.kron(cols["high"].rows["train"][0], grow), np.kron(cols["mask"].rows["train"][0], grow)
    )
    top = 16 + 2 * preview.GAP
    tile = sheet[top : top + 32 * scale, preview.GAP : preview.GAP + 32 * scale]
    np.testing.assert_array_equal(tile, expected)
    with Release(path, "train") as reader:
        batch = reader.read_slice(0, 2)
        captions = preview.captions(batch, preview.roles(reader.layout), reader.classes, 2)
    assert captions == ["cat · train_00.png", "owl · train_01.png"]


def test_preview_of_an_image_only_flat_release(tmp_path: Path) -> None:
    cols = columns()
    path = write_release(tmp_path / "x.h5", {"x": cols["low"]}, template="{field}_{split}")
    with h5py.File(path, "r") as handle:
        assert preview.roles(fileformat.read_layout(handle)) == preview.Roles("x", None, ())
    picture = preview.render_preview(path, split="valid")
    assert picture.width > 0
