"""The ``label`` kind end to end: class folders, a label table, declared classes, stratified
splits; through the real build and CLI, read back with h5py and the readers, expectations
computed here (Pillow decodes, our own sort, our own split hash)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from conftest import dataset_digests, exact_splits, save
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl.check.health import check_release
from h5etl.cli.app import app
from h5etl.readers import iter_batches
from h5etl.testing import Broken, KindContractTests

os.environ.setdefault("KERAS_BACKEND", "torch")  # before anything imports keras

runner = CliRunner()
PETS = {"cat": 5, "dog": 7, "bird": 4}  # class -> files; sorted: bird 0, cat 1, dog 2
SIZE = 8


def _cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def make_pets(root: Path, counts: dict[str, int] = PETS, *, extras: bool = True) -> Path:
    """``root/raw/pets/<class>/<class>_<i>.png``; with ``extras`` also an empty class folder,
    a file nested one folder deeper and a file directly in the root."""
    pets = root / "raw" / "pets"
    rng = np.random.default_rng(7)
    for name, n in counts.items():
        for i in range(n):
            save(pets / name / f"{name}_{i}.png", rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    if extras:
        (pets / "empty").mkdir(parents=True)
        save(pets / "cat" / "deep" / "x.png", rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
        save(pets / "top.png", rng.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    return pets


def pets_config(root: Path, **over: Any) -> Path:
    label = {"kind": "label", "source": "image", "from": "folder", **over.pop("label", {})}
    data: dict[str, Any] = {
        "name": "pets",
        "sources": {"image": {"dir": "raw/pets", "glob": over.pop("glob", "*/*.png")}},
        "splits": over.pop("splits", {"train": 0.75, "valid": 0.25}),
        "seed": 3,
        "fields": {
            "image": {"kind": "image", "shape": [3, SIZE, SIZE], "mode": "RGB"},
            "label": label,
            "filename": {"kind": "text"},
        },
        "storage": {"chunk_samples": 2, "compression": "lzf"},
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        **over,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(h5etl.load_spec(config), **kwargs)


def stored(path: Path) -> dict[str, dict[str, Any]]:
    """Per split: filenames, labels (with dtype), images, and the label dataset's attrs."""
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as handle:
        record = json.loads(handle.attrs["layout"])
        for split in record["splits"]:
            group = handle[split]
            out[split] = {
                "files": [v.decode() for v in group["filename"][...]],
                "labels": group["label"][...],
                "images": group["image"][...],
                "attrs": dict(group["label"].attrs),
            }
        out["_"] = {"record": record, "diagnostics": dict(handle["diagnostics"].attrs)}
    return out


def expected_row(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB")).transpose(2, 0, 1)
    out = np.zeros((3, SIZE, SIZE), np.uint8)
    top, left = (SIZE - rgb.shape[1]) // 2, (SIZE - rgb.shape[2]) // 2
    out[:, top : top + rgb.shape[1], left : left + rgb.shape[2]] = rgb
    return out


# --- class folders ---------------------------------------------------------------------------


def test_class_folders_label_every_file_and_report_the_classes(tmp_path: Path) -> None:
    pets = make_pets(tmp_path)
    config = pets_config(tmp_path)
    classes = sorted(PETS)

    code, output = _cli("build", config, "--jobs", "1")

    assert code == 0, output
    release = tmp_path / "releases" / "pets.h5"
    data = stored(release)
    counts: dict[str, Counter[str]] = {}
    seen = []
    for split in ("train", "valid"):
        part = data[split]
        assert part["labels"].dtype == np.int64
        assert list(part["attrs"]["classes"]) == classes
        for file, label, image in zip(part["files"], part["labels"], part["images"], strict=True):
            name = file.split("/")[0]
            assert label == classes.index(name), file
            np.testing.assert_array_equal(image, expected_row(pets / file))
        counts[split] = Counter(f.split("/")[0] for f in part["files"])
        seen.extend(part["files"])
        values, numbers = np.unique(part["labels"], return_counts=True)
        assert list(part["attrs"]["histogram_values"]) == values.tolist()
        assert list(part["attrs"]["histogram_counts"]) == numbers.tolist()
        shown = ", ".join(f"{c} {counts[split][c]}" for c in classes)
        assert f"classes: {split}/label: {shown}" in output
    # the glob */*.png matches no deeper file and no file in the root: they are no inputs
    assert sorted(seen) == sorted(f"{c}/{c}_{i}.png" for c, n in PETS.items() for i in range(n))
    assert "of 16 input files" in output
    assert data["_"]["record"]["fields"]["label"]["classes"] == classes
    assert data["_"]["record"]["fields"]["label"]["dtype"] == "int64"
    diagnostics = json.loads(data["_"]["diagnostics"]["class_counts"])
    assert diagnostics == {s: {"label": {c: counts[s][c] for c in classes}} for s in counts}
    assert "warning: fields.label: class folder 'empty' is empty" in output

    code, checked = _cli("check", release, "--deep")
    assert code == 0, checked
    for split in ("train", "valid"):
        shown = ", ".join(f"{c} {counts[split][c]}" for c in classes)
        assert f"label classes: {shown}" in checked
    assert checked.rstrip().endswith("OK")


def test_files_outside_class_folders_are_no_label_rejects(tmp_path: Path) -> None:
    pets = make_pets(tmp_path)
    config = pets_config(tmp_path, glob="**/*.png")  # now the deep and the root file match

    code, dry = _cli("build", config, "--dry-run", "--jobs", "1")
    assert code == 0, dry
    for path in (pets / "cat" / "deep" / "x.png", pets / "top.png"):
        assert f"reject: {path}: no_label:" in dry
    assert "rejects: 2 files (no_label 2)" in dry

    report = build(config, jobs=1)
    assert sorted((r.reason, Path(r.path).name) for r in report.rejects) == [
        ("no_label", "top.png"),
        ("no_label", "x.png"),
    ]
    assert sum(report.samples.values()) == 16


def test_declared_classes_keep_their_order_and_reject_other_folders(tmp_path: Path) -> None:
    make_pets(tmp_path, extras=False)
    config = pets_config(tmp_path, label={"classes": ["dog", "cat"]})

    report = build(config, jobs=1)

    assert report.path is not None
    rejected = {Path(r.path).name for r in report.rejects}
    assert rejected == {f"bird_{i}.png" for i in range(PETS["bird"])}
    assert {r.reason for r in report.rejects} == {"unknown_class"}
    assert "'bird'" in report.rejects[0].detail
    assert "dog, cat" in report.rejects[0].detail
    data = stored(report.path)
    for split in ("train", "valid"):
        expected = [["dog", "cat"].index(f.split("/")[0]) for f in data[split]["files"]]
        assert data[split]["labels"].tolist() == expected
        assert list(data[split]["attrs"]["classes"]) == ["dog", "cat"]
    assert data["_"]["record"]["fields"]["label"]["classes"] == ["dog", "cat"]


def test_a_class_folder_without_matching_files_is_reported_empty(tmp_path: Path) -> None:
    # the label builder once lost the source's glob: a folder of notes counted as a class
    pets = make_pets(tmp_path, extras=False)
    (pets / "lizard").mkdir()
    (pets / "lizard" / "notes.txt").write_text("no pictures yet\n", "utf-8")

    report = build(pets_config(tmp_path), jobs=1)

    assert report.warnings == ["fields.label: class folder 'lizard' is empty: no samples of it"]


@pytest.mark.parametrize(
    ("values", "classes"),
    [
        pytest.param([2, 10, 2, 10, 10, 2], ["2", "10"], id="integers-by-value"),
        pytest.param([True, False, True, True, False, True], ["false", "true"], id="booleans"),
    ],
)
def test_labels_of_a_json_table_are_named_as_json_writes_them(
    tmp_path: Path, values: list[Any], classes: list[str]
) -> None:
    _, truth = make_flat(tmp_path, n=6)
    labels = dict(zip(truth, values, strict=True))
    table = tmp_path / "labels.json"
    table.write_text(json.dumps([{"file": f, "label": v} for f, v in labels.items()]), "utf-8")

    report = build(table_config(tmp_path, str(table)), jobs=1)

    assert report.path is not None
    assert report.rejects == []
    data = stored(report.path)
    assert list(data["train"]["attrs"]["classes"]) == classes
    names = [classes[v] for v in data["train"]["labels"]]
    assert names == [json.dumps(labels[f]) for f in data["train"]["files"]]


# --- a label table ---------------------------------------------------------------------------


def make_flat(root: Path, n: int = 10) -> tuple[Path, dict[str, str]]:
    """``raw/images/p<i>.png`` and the class each one should get (``a`` or ``b``)."""
    images = root / "raw" / "images"
    rng = np.random.default_rng(1)
    truth = {}
    for i in range(n):
        save(images / f"p{i}.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        truth[f"p{i}.png"] = "ab"[i % 3 == 0]
    return images, truth


def table_config(root: Path, table: str, **over: Any) -> Path:
    data: dict[str, Any] = {
        "name": "pets",
        "sources": {"image": {"dir": "raw/images", "glob": "*.png"}},
        "splits": {"train": 1.0},
        "fields": {
            "image": {"kind": "image", "shape": [3, SIZE, SIZE], "mode": "RGB"},
            "label": {"kind": "label", "from": {"table": table, "key": "file", "column": "label"}},
            "filename": {"kind": "text"},
        },
        "storage": {"chunk_samples": 2},
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        **over,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def write_table(path: Path, truth: dict[str, str], missing: str) -> None:
    rows = ["file,label,note"]
    for i, (file, label) in enumerate(truth.items()):
        if file != missing:  # every other row without its suffix
            rows.append(f"{file if i % 2 else file.removesuffix('.png')},{label},x")
    path.write_text("\n".join(rows) + "\n", "utf-8")


def test_labels_from_a_table_by_name_with_and_without_suffix(tmp_path: Path) -> None:
    _, truth = make_flat(tmp_path)
    table = tmp_path / "labels.csv"
    write_table(table, truth, missing="p4.png")
    config = table_config(tmp_path, str(table))

    code, dry = _cli("build", config, "--dry-run", "--jobs", "1")
    assert code == 0, dry
    assert "no_label" in dry
    assert "p4.png" in dry

    report = build(config, jobs=2)

    assert [(Path(r.path).name, r.reason) for r in report.rejects] == [("p4.png", "no_label")]
    assert "labels.csv" in report.rejects[0].detail
    assert report.path is not None
    data = stored(report.path)
    files, labels = data["train"]["files"], data["train"]["labels"]
    assert sorted(files) == sorted(f for f in truth if f != "p4.png")
    assert labels.dtype == np.int64
    assert [["a", "b"][v] for v in labels] == [truth[f] for f in files]
    assert list(data["train"]["attrs"]["classes"]) == ["a", "b"]


def test_table_rows_that_match_no_file_are_a_warning(tmp_path: Path) -> None:
    # a row for a file that is not there (a typo, a deleted image) went unmentioned
    _, truth = make_flat(tmp_path)
    table = tmp_path / "labels.csv"
    write_table(table, truth, missing="")
    with table.open("a", encoding="utf-8") as handle:
        handle.write("p999.png,a,x\n")
    code, out = _cli("build", table_config(tmp_path, str(table)), "--jobs", "1")
    assert code == 0, out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert any("1 rows of" in line and "p999.png" in line for line in warnings), out


def test_a_relative_table_path_is_relative_to_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, truth = make_flat(tmp_path / "project")
    write_table(tmp_path / "project" / "labels.csv", truth, missing="")
    config = table_config(tmp_path / "project", "labels.csv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.samples == {"train": len(truth)}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("file,label\np0.png,a\np1.png,b\np0.png,b\n", "line 4", id="duplicate-key"),
        pytest.param("file,class\np0.png,a\n", "'label'", id="missing-column"),
        pytest.param("name,label\np0.png,a\n", "'file'", id="missing-key-column"),
    ],
)
def test_a_broken_table_is_one_config_error_line(tmp_path: Path, text: str, words: str) -> None:
    make_flat(tmp_path, n=3)
    table = tmp_path / "labels.csv"
    table.write_text(text, "utf-8")
    config = table_config(tmp_path, str(table))

    for args in (("--dry-run",), ()):
        code, output = _cli("build", config, "--jobs", "1", *args)

        assert code == 2, output
        lines = output.strip().splitlines()
        assert len(lines) == 1, output
        assert "labels.csv" in lines[0]
        assert words in lines[0]
    assert not (tmp_path / "releases" / "pets.h5").exists()


# --- stratified splits -----------------------------------------------------------------------

STRATA = {"cat": 13, "dog": 7, "bird": 5, "fish": 1}
FRACTIONS = {"train": 0.6, "valid": 0.3, "test": 0.1}


def _assignment(path: Path) -> dict[str, str]:
    data = stored(path)
    return {f: split for split in FRACTIONS for f in data[split]["files"]}


def test_stratified_splits_hold_each_class_in_the_fractions(tmp_path: Path) -> None:
    make_pets(tmp_path, STRATA, extras=False)
    config = pets_config(tmp_path, splits=FRACTIONS, stratify="label")

    first = build(config, jobs=1)
    second = build(config, jobs=2)

    assert first.path is not None
    assert second.path is not None
    assignment = _assignment(first.path)
    assert assignment == _assignment(second.path)
    assert dataset_digests(first.path) == dataset_digests(second.path)
    assert len(assignment) == sum(STRATA.values())
    per_class = Counter((f.split("/")[0], s) for f, s in assignment.items())
    for name, size in STRATA.items():
        for split, fraction in FRACTIONS.items():
            assert abs(per_class[name, split] - fraction * size) < 1, (name, split)
    totals = Counter(assignment.values())
    for split, fraction in FRACTIONS.items():
        assert abs(totals[split] - fraction * sum(STRATA.values())) < 1
    report = check_release(first.path, deep=True)
    assert report.ok, report.problems


def test_without_stratify_the_split_is_the_exact_seeded_rule(tmp_path: Path) -> None:
    make_pets(tmp_path, STRATA, extras=False)
    config = pets_config(tmp_path, splits=FRACTIONS)

    report = build(config, jobs=1)

    assert report.path is not None
    assignment = _assignment(report.path)
    expected = exact_splits([f.removesuffix(".png") for f in assignment], FRACTIONS, 3)
    assert assignment == {f: expected[f.removesuffix(".png")] for f in assignment}


# --- determinism, check, resume, readers -----------------------------------------------------


@pytest.fixture
def pets_release(tmp_path: Path) -> Path:
    make_pets(tmp_path)
    report = build(pets_config(tmp_path, splits={"train": 1.0}), jobs=1)
    assert report.path is not None
    return report.path


def _truth(path: Path) -> dict[str, int]:
    data = stored(path)
    return dict(zip(data["train"]["files"], data["train"]["labels"].tolist(), strict=True))


def test_numpy_reader_gives_int64_labels_and_the_classes(pets_release: Path) -> None:
    truth = _truth(pets_release)
    got: dict[str, int] = {}
    for batch in iter_batches(pets_release, "train", 5, shuffle=True, seed=1):
        assert batch["label"].dtype == np.int64
        assert batch["image"].shape[1:] == (3, SIZE, SIZE)
        got.update(zip(batch["filename"], batch["label"].tolist(), strict=True))
    assert got == truth
    with h5etl.readers.Release(pets_release, "train") as reader:
        assert reader.classes == {"label": tuple(sorted(PETS))}


def test_torch_loader_gives_int64_label_tensors(pets_release: Path) -> None:
    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    dataset = H5Dataset(pets_release, "train", batch_size=4)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=dataset.batch_sampler(4, shuffle=True, seed=0), num_workers=2
    )
    got: dict[str, int] = {}
    for batch in loader:
        assert batch["label"].dtype == torch.int64
        assert tuple(batch["image"].shape[1:]) == (3, SIZE, SIZE)
        got.update(zip(batch["filename"], batch["label"].tolist(), strict=True))
    dataset.close()
    assert got == _truth(pets_release)


def test_keras_dataset_gives_int64_labels(pets_release: Path) -> None:
    pytest.importorskip("keras")
    from h5etl.readers import KerasDataset

    truth = _truth(pets_release)
    files = list(truth)
    dataset = KerasDataset(pets_release, "train", x="image", y="label", batch_size=4, shuffle=False)
    _, target = dataset[0]
    dataset.close()
    assert target.dtype == np.int64
    assert target.tolist() == [truth[f] for f in files[:4]]
    # by default x and y come from the layout record: the image, and (no mask) the label
    default = KerasDataset(pets_release, "train", batch_size=4, shuffle=False)
    assert (default.x, default.y) == ("image", "label")
    _, target = default[0]
    default.close()
    assert target.tolist() == [truth[f] for f in files[:4]]


def test_labels_chunked_by_bytes_do_not_widen_the_reading_unit(pets_release: Path) -> None:
    # labels are chunked by bytes (hundreds of rows a chunk): the sampler's unit and Keras's
    # default batch stay one chunk of the image
    pytest.importorskip("keras")
    from h5etl.readers import KerasDataset

    with h5py.File(pets_release, "r") as handle:
        image_rows = handle["train/image"].chunks[0]
        assert handle["train/label"].chunks[0] > image_rows
    with h5etl.readers.Release(pets_release, "train") as reader:
        assert reader.chunk_rows == image_rows
    dataset = KerasDataset(pets_release, "train", shuffle=False)
    assert dataset.batch_size == image_rows
    dataset.close()


class TestLabelContract(KindContractTests):
    """The kind checklist (h5etl.testing): class folders, the label the folder's index."""

    field = "label"

    def make_raw(self, root: Path) -> Path:
        make_pets(root, {"cat": 3, "dog": 3, "bird": 2}, extras=False)
        return pets_config(root)

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "pets" / "dog" / "dog_1.png"
        path.write_text("not a PNG\n", encoding="utf-8")
        return Broken("dog/dog_1", path, "unreadable")

    def expected(self, root: Path) -> dict[str, int]:
        classes = sorted(p.name for p in (root / "raw" / "pets").iterdir())
        return {
            f"{png.parent.name}/{png.stem}": classes.index(png.parent.name)
            for png in (root / "raw" / "pets").glob("*/*.png")
        }
