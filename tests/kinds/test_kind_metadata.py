"""The ``value`` and ``text`` kinds end to end: metadata from a sidecar CSV and from one JSON
sidecar per sample, row-aligned with the images; broken values and sidecars; statistics;
determinism, check, resume and the readers. Expectations are computed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import pytest
import yaml
from conftest import save
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.readers import iter_batches
from h5etl.testing import Broken, KindContractTests

runner = CliRunner()
N = 12
BROKEN = {"s06": "no_value", "s07": "no_value", "s08": "bad_value", "s09": "bad_sidecar"}


def make_meta(root: Path) -> dict[str, dict[str, Any]]:
    """Images ``raw/images/s<i>.png``, sidecars ``raw/meta/s<i>.json`` and ``meta.csv``; the
    values every good sample must come back with (``s06``..``s09`` are broken, see BROKEN)."""
    rng = np.random.default_rng(5)
    truth: dict[str, dict[str, Any]] = {}
    rows = ["file;age;site;smoker"]  # a European-locale CSV: semicolons
    for i in range(N):
        key = f"s{i:02d}"
        save(root / "raw" / "images" / f"{key}.png", rng.integers(0, 256, (8, 8, 3), np.uint8))
        scan: dict[str, Any] = {"model": f"M-{i % 3}", "slices": 10 + i}
        if key == "s06":
            del scan["slices"]
        document = {"scanner": scan, "contrast": i % 2 == 0, "weight": 60.25 + i}
        text = json.dumps(document) if key != "s09" else '{"scanner": {"model": '
        (root / "raw" / "meta").mkdir(parents=True, exist_ok=True)
        (root / "raw" / "meta" / f"{key}.json").write_text(text, "utf-8")
        age = {"s07": "", "s08": "old"}.get(key, f"{30 + i * 1.5}")
        site = f"site {'ÄB'[i % 2]}"
        smoker = ["yes", "true", "0", "false"][i % 4].replace("yes", "1")
        rows.append(f"{key if i % 2 else key + '.png'};{age};{site};{smoker}")
        truth[key] = {
            "age": 30 + i * 1.5,
            "site": site,
            "smoker": smoker in {"1", "true"},
            "model": f"M-{i % 3}",
            "slices": 10 + i,
            "contrast": i % 2 == 0,
            "weight": 60.25 + i,
        }
    (root / "meta.csv").write_text("\n".join(rows) + "\n", "utf-8")
    return {k: v for k, v in truth.items() if k not in BROKEN}


def meta_config(root: Path, **fields: Any) -> Path:
    table = str(root / "meta.csv")

    def column(name: str) -> dict[str, str]:
        return {"table": table, "key": "file", "column": name}

    data: dict[str, Any] = {
        "name": "scans",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "meta": {"dir": "raw/meta", "glob": "*.json"},
        },
        "splits": {"train": 0.5, "valid": 0.5},
        "fields": {
            "image": {"kind": "image", "shape": [3, 8, 8], "mode": "RGB"},
            "filename": {"kind": "text"},
            "age": {"kind": "value", "dtype": "float64", "from": column("age")},
            "site": {"kind": "text", "from": column("site")},
            "smoker": {"kind": "value", "dtype": "bool", "from": column("smoker")},
            "model": {"kind": "text", "from": {"json": "meta", "key": "scanner.model"}},
            "slices": {
                "kind": "value",
                "dtype": "int64",
                "from": {"json": "meta", "key": "scanner.slices"},
            },
            "contrast": {
                "kind": "value",
                "dtype": "bool",
                "from": {"json": "meta", "key": "contrast"},
            },
            "weight": {"kind": "value", "from": {"json": "meta", "key": "weight"}},
            **fields,
        },
        "storage": {"chunk_samples": 2},
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        "allow_empty": True,  # a tiny split whose one sample is broken on purpose
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


DTYPES = {
    "age": "float64",
    "smoker": "bool",
    "slices": "int64",
    "contrast": "bool",
    "weight": "float64",
}
TEXTS = ("site", "model")


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(h5etl.load_spec(config), **kwargs)


def stored(path: Path) -> dict[str, dict[str, Any]]:
    """Every good sample's stored metadata by key (from its filename row)."""
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            group = handle[split]
            for row, name in enumerate(group["filename"][...]):
                key = name.decode().removesuffix(".png")
                out[key] = {f: group[f][row].item() for f in DTYPES}
                out[key].update({f: group[f][row].decode() for f in TEXTS})
    return out


@pytest.fixture
def meta(tmp_path: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    return meta_config(tmp_path), make_meta(tmp_path)


def test_metadata_is_row_aligned_typed_and_rejected_when_broken(
    meta: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    config, truth = meta
    report = build(config, jobs=2)

    assert report.path is not None
    got = {(Path(r.path).stem, Path(r.path).parent.name, r.reason) for r in report.rejects}
    assert got == {(k, folder, why) for k, why in BROKEN.items() for folder in ("images", "meta")}
    assert stored(report.path) == truth
    with h5py.File(report.path, "r") as handle:
        record = json.loads(handle.attrs["layout"])["fields"]
        for split in ("train", "valid"):
            keys = [n.decode().removesuffix(".png") for n in handle[split]["filename"][...]]
            for name, dtype in DTYPES.items():
                dataset = handle[split][name]
                assert dataset.dtype == np.dtype(dtype), name
                assert record[name]["kind"] == "value"
                assert record[name]["dtype"] == dtype
                values = np.array([truth[k][name] for k in keys], dtype=np.float64)
                assert dataset.attrs["count"].tolist() == [len(keys)]
                np.testing.assert_allclose(dataset.attrs["mean"], [values.mean()])
                np.testing.assert_allclose(dataset.attrs["std"], [values.std()], atol=1e-12)
                assert dataset.attrs["min"].tolist() == [values.min()]
                assert dataset.attrs["max"].tolist() == [values.max()]
            for name in TEXTS:
                assert record[name]["kind"] == "text"


def test_reject_details_name_the_field_and_the_file(
    meta: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    config, _ = meta
    report = build(config, jobs=1)
    details = {(Path(r.path).stem, r.reason): r.detail for r in report.rejects}

    assert "slices" in details["s06", "no_value"]
    assert "age" in details["s07", "no_value"]
    assert "default" in details["s07", "no_value"]
    assert "'old'" in details["s08", "bad_value"]
    assert "JSON" in details["s09", "bad_sidecar"]
    sidecar = [r for r in report.rejects if r.reason == "bad_sidecar"]
    assert {Path(r.path).name for r in sidecar} == {"s09.png", "s09.json"}


def test_a_default_keeps_samples_without_a_value(tmp_path: Path) -> None:
    truth = make_meta(tmp_path)
    table = {"table": str(tmp_path / "meta.csv"), "key": "file", "column": "age"}
    config = meta_config(
        tmp_path,
        age={"kind": "value", "from": table, "default": -1},
        slices={
            "kind": "value",
            "dtype": "int64",
            "default": 0,
            "from": {"json": "meta", "key": "scanner.slices"},
        },
    )

    report = build(config, jobs=1)

    assert report.path is not None
    assert sorted((Path(r.path).stem, r.reason) for r in report.rejects) == sorted(
        [("s08", "bad_value")] * 2 + [("s09", "bad_sidecar")] * 2
    )
    got = stored(report.path)
    assert got["s07"]["age"] == -1.0
    assert got["s06"]["slices"] == 0
    assert {k: v for k, v in got.items() if k not in BROKEN} == truth


def test_the_dry_run_finds_table_rejects_and_decode_finds_sidecar_rejects(
    meta: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    config, _ = meta
    code, plan = _cli("build", config, "--dry-run", "--jobs", "1")
    assert code == 0, plan
    assert "s07.png: no_value" in plan
    assert "s08.png: bad_value" in plan
    assert "bad_sidecar" not in plan  # JSON sidecars are read when decoding

    code, decoded = _cli("build", config, "--dry-run", "--decode", "--jobs", "1")
    assert code == 0, decoded
    assert "s09.json: bad_sidecar" in decoded
    assert "s06.json: no_value" in decoded
    assert "rejects: 8 files (bad_sidecar 2, bad_value 2, no_value 4)" in decoded


def _cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def one_field_build(
    root: Path, field: dict[str, Any], documents: dict[str, str]
) -> h5etl.BuildReport:
    for key, text in documents.items():
        save(root / "raw" / "images" / f"{key}.png", np.zeros((8, 8, 3), np.uint8))
        (root / "raw" / "meta").mkdir(parents=True, exist_ok=True)
        (root / "raw" / "meta" / f"{key}.json").write_text(text, "utf-8")
    data = {
        "name": "one",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "meta": {"dir": "raw/meta", "glob": "*.json"},
        },
        "fields": {
            "image": {"kind": "image", "shape": [3, 8, 8], "mode": "RGB"},
            "filename": {"kind": "text"},
            "v": {**field, "from": {"json": "meta", "key": "v"}},
        },
        "max_rejects": None,  # broken on purpose: past the default share (test_publish_guard)
        "allow_empty": True,  # a tiny split whose one sample is broken on purpose
    }
    (root / "config.yaml").write_text(yaml.safe_dump(data), "utf-8")
    return build(root / "config.yaml", jobs=1)


def _outcomes(report: h5etl.BuildReport) -> dict[str, Any]:
    out: dict[str, Any] = {Path(r.path).stem: r.reason for r in report.rejects}
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        for split in (s for s in handle if s != "diagnostics"):  # wherever the split put it
            names, values = handle[f"{split}/filename"][...], handle[f"{split}/v"][...]
            for name, value in zip(names, values, strict=True):
                out[name.decode().removesuffix(".png")] = (
                    value.decode() if isinstance(value, bytes) else value.item()
                )
    return out


def test_json_values_are_numbers_not_booleans_or_objects(tmp_path: Path) -> None:
    documents = {
        "a": '{"v": 41}',
        "b": '{"v": "2.5"}',
        "c": '{"v": true}',
        "d": '{"v": [1]}',
        "e": '{"v": null}',
        "f": "[1, 2]",
        "g": '{"v": 1e400}',
    }
    report = one_field_build(tmp_path, {"kind": "value", "dtype": "float64"}, documents)

    assert _outcomes(report) == {
        "a": 41.0,
        "b": 2.5,
        "c": "bad_value",
        "d": "bad_value",
        "e": "no_value",
        "f": "bad_sidecar",
        "g": "bad_value",
    }


def test_json_booleans_and_integers(tmp_path: Path) -> None:
    documents = {"a": '{"v": true}', "b": '{"v": 0}', "c": '{"v": "False"}', "d": '{"v": 2}'}
    report = one_field_build(tmp_path, {"kind": "value", "dtype": "bool"}, documents)
    assert _outcomes(report) == {"a": True, "b": False, "c": False, "d": "bad_value"}

    other = tmp_path / "ints"
    documents = {"a": '{"v": 3}', "b": '{"v": 3.0}', "c": '{"v": 3.5}', "d": '{"v": 1e30}'}
    report = one_field_build(other, {"kind": "value", "dtype": "int64"}, documents)
    assert _outcomes(report) == {"a": 3, "b": 3, "c": "bad_value", "d": "bad_value"}


def test_json_texts_are_written_as_json_writes_them(tmp_path: Path) -> None:
    documents = {
        "a": '{"v": "Siemens"}',
        "b": '{"v": 41}',
        "c": '{"v": true}',
        "d": '{"v": 2.5}',
        "e": '{"v": {"x": 1}}',
        "f": '{"v": null}',
    }
    report = one_field_build(tmp_path, {"kind": "text"}, documents)
    assert _outcomes(report) == {
        "a": "Siemens",
        "b": "41",
        "c": "true",
        "d": "2.5",
        "e": "bad_value",
        "f": "no_value",
    }


def test_check_deep_prints_the_statistics(meta: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    # --jobs 1 = 2, check --deep passing and resume: TestTextContract, TestValueContract
    config, _ = meta
    report = build(config, jobs=2)

    assert report.path is not None
    code, output = _cli("check", report.path, "--deep")
    assert code == 0, output
    assert "age stats: " in output


def test_readers_return_values_in_their_dtype_and_texts(
    meta: tuple[Path, dict[str, dict[str, Any]]],
) -> None:
    config, truth = meta
    report = build(config, jobs=1)
    assert report.path is not None

    got: dict[str, dict[str, Any]] = {}
    for split in ("train", "valid"):
        for batch in iter_batches(report.path, split, 3, shuffle=True):
            for name, dtype in DTYPES.items():
                assert batch[name].dtype == np.dtype(dtype)
            for i, file in enumerate(batch["filename"]):
                row = {f: batch[f][i].item() for f in DTYPES}
                row.update({f: batch[f][i] for f in TEXTS})
                assert all(isinstance(row[f], str) for f in TEXTS)
                got[file.removesuffix(".png")] = row
    assert got == truth


def test_torch_loader_gives_typed_metadata(meta: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    config, truth = meta
    report = build(config, jobs=1)
    assert report.path is not None
    dataset = H5Dataset(report.path, "train", batch_size=2)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=dataset.batch_sampler(2))
    seen = 0
    for batch in loader:
        assert batch["slices"].dtype == torch.int64
        assert batch["age"].dtype == torch.float64
        assert batch["contrast"].dtype == torch.bool
        for i, file in enumerate(batch["filename"]):
            key = file.removesuffix(".png")
            assert batch["model"][i] == truth[key]["model"]
            assert batch["weight"][i].item() == truth[key]["weight"]
            seen += 1
    dataset.close()
    assert seen == report.samples["train"]


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


class MetadataCase(KindContractTests):
    """``make_meta``'s images with JSON sidecars and a CSV (``BROKEN`` rejected throughout);
    a field read from the sidecars, whose expectation this reads with ``json``."""

    key: ClassVar[str]  # the sidecar key the field reads

    def make_raw(self, root: Path) -> Path:
        make_meta(root)
        return meta_config(root)

    def expected(self, root: Path) -> dict[str, Any]:
        out = {}
        for sidecar in (root / "raw" / "meta").glob("*.json"):
            if sidecar.stem not in BROKEN:
                value: Any = json.loads(sidecar.read_text("utf-8"))
                for part in self.key.split("."):
                    value = value[part]
                out[sidecar.stem] = value
        return out

    def spoil(self, root: Path, key: str, value: Any) -> Path:
        """Set (None: delete) ``self.key`` of sample ``key``'s sidecar; its path."""
        path = root / "raw" / "meta" / f"{key}.json"
        document = json.loads(path.read_text("utf-8"))
        *parents, last = self.key.split(".")
        inner = document
        for part in parents:
            inner = inner[part]
        if value is None:
            del inner[last]
        else:
            inner[last] = value
        path.write_text(json.dumps(document), "utf-8")
        return path


class TestTextContract(MetadataCase):
    field, key = "model", "scanner.model"

    def break_input(self, root: Path) -> Broken:
        return Broken("s03", self.spoil(root, "s03", None), "no_value")


class TestValueContract(MetadataCase):
    field, key = "slices", "scanner.slices"

    def break_input(self, root: Path) -> Broken:
        return Broken("s03", self.spoil(root, "s03", "many"), "bad_value")
