"""User transforms in real builds (issue 28): per field, per sample, derived fields, each
failure kind, config errors at validate, random transforms across --jobs and threads, the
layout record, check, diff and incremental builds. User modules are written beside the config
in tmp_path; expectations are computed here from the PNGs with Pillow, not by h5etl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import SHAPE, MakeRaw, WriteConfig, centre_pad, read_release
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.errors import ConfigError
from h5etl.format import contract as fileformat

runner = CliRunner()

PREP = '''
import numpy as np


def invert(value):
    return 255 - value


def noise(value, *, scale, rng):
    drawn = rng.integers(-scale, scale + 1, value.shape)
    return np.clip(value.astype(np.int16) + drawn, 0, 255).astype(np.uint8)


def corner(sample, *, size):
    """image and mask cropped together to their top-left size x size."""
    return {name: value[:size, :size] for name, value in sample.items()}


def grey(value):
    return value.mean(axis=2).astype(np.uint8)


def masked_grey(sample):
    return (sample["image"].mean(axis=2) * sample["mask"]).astype(np.uint8)


def fails_on_big(value):
    if value.shape[0] > 20:
        raise ValueError(f"too big: {value.shape[0]} rows")
    return value


def as_float(value):
    return value.astype(np.float32) if value.shape[0] > 20 else value


def labels_of_two(value):
    return value * 2 if value.shape[0] > 20 else value
'''


def cli(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def setup(root: Path, make_raw: MakeRaw, write_config: WriteConfig, **config: Any) -> Path:
    make_raw(root, n=6)
    (root / "prep.py").write_text(PREP)
    return write_config(root, **config)


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    report = h5etl.build(load_spec(config), **kwargs)
    assert report.path is not None
    return report


def release(report: h5etl.BuildReport) -> Path:
    assert report.path is not None
    return report.path


def rows(path: Path | None, field: str) -> dict[str, np.ndarray]:
    """Stored rows by file name (the raw PNG's), every split."""
    assert path is not None
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            if f"{split}/{field}" not in handle:
                continue
            names = handle[f"{split}/filename"].asstr()[...]
            out.update(zip(names, handle[f"{split}/{field}"][...], strict=True))
    return out


def rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        array: np.ndarray = np.asarray(image.convert("RGB"))
    return array


def mask01(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        grey: np.ndarray = np.asarray(image.convert("L"))
    labels: np.ndarray = (grey == 255).astype(np.uint8)
    return labels


def layout(path: Path | None) -> fileformat.LayoutRecord:
    assert path is not None
    with h5py.File(path, "r") as handle:
        return fileformat.read_layout(handle)


def rejects(report: h5etl.BuildReport) -> list[dict[str, str]]:
    assert report.path is not None
    lines = report.path.with_name(report.path.name.replace(".h5", ".rejects.jsonl"))
    return [json.loads(line) for line in lines.read_text().splitlines()]


# --- per field, per sample, derived ---------------------------------------------------------


def test_a_field_chain_runs_after_decode_before_padding(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = setup(
        tmp_path, make_raw, write_config, fields={"image": {"transform": [{"call": "prep:invert"}]}}
    )
    report = build(config)
    stored, masks = rows(report.path, "image"), rows(report.path, "mask")
    for name, row in stored.items():
        source = tmp_path / "raw/images" / name
        # inverted first, then padded with the field's fill (0): the padding is not inverted
        assert np.array_equal(row, centre_pad(255 - rgb(source), SHAPE, SHAPE))
        expected_mask = centre_pad(mask01(tmp_path / "raw/masks" / name), SHAPE, SHAPE)
        assert np.array_equal(masks[name], expected_mask)
    record = layout(report.path)
    entry = record.fields["image"].extra[fileformat.TRANSFORMS_KEY]
    assert [c["call"] for c in entry["calls"]] == ["prep:invert"]
    assert entry["calls"][0]["source_sha256"] == hashlib.sha256(PREP.encode()).hexdigest()
    assert fileformat.TRANSFORMS_KEY not in record.fields["mask"].extra  # untouched: as ever


def test_a_sample_call_crops_image_and_mask_together(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = setup(
        tmp_path,
        make_raw,
        write_config,
        transforms=[{"call": "prep:corner", "fields": ["image", "mask"], "args": {"size": 8}}],
    )
    report = build(config, jobs=2)
    images, masks = rows(report.path, "image"), rows(report.path, "mask")
    assert len(images) == 6
    for name in images:
        image = rgb(tmp_path / "raw/images" / name)[:8, :8]
        mask = mask01(tmp_path / "raw/masks" / name)[:8, :8]
        assert np.array_equal(images[name], centre_pad(image, SHAPE, SHAPE))
        assert np.array_equal(masks[name], centre_pad(mask, SHAPE, SHAPE))
    code, out = cli("check", report.path)
    assert code == 0
    assert 'transforms: image: prep:corner (sample: image+mask) {"size":8}' in out
    assert "transforms: mask: prep:corner (sample: image+mask)" in out


def test_a_derived_field_is_computed_by_a_user_function(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    edges = {
        "kind": "image",
        "shape": [1, SHAPE, SHAPE],
        "derive": {"from": "image", "call": "prep:grey"},
    }
    config = setup(
        tmp_path,
        make_raw,
        write_config,
        fields={
            "image": {"transform": [{"call": "prep:invert"}]},
            "grey": edges,
            "masked": {
                "kind": "image",
                "shape": [1, SHAPE, SHAPE],
                "derive": {"from": ["image", "mask"], "call": "prep:masked_grey"},
            },
        },
    )
    report = build(config)
    for name, row in rows(report.path, "grey").items():
        inverted = 255 - rgb(tmp_path / "raw/images" / name)  # it sees the image's chain
        expected = inverted.mean(axis=2).astype(np.uint8)
        assert np.array_equal(row, centre_pad(expected, SHAPE, SHAPE))
    for name, row in rows(report.path, "masked").items():
        inverted = 255 - rgb(tmp_path / "raw/images" / name)
        grey = (inverted.mean(axis=2) * mask01(tmp_path / "raw/masks" / name)).astype(np.uint8)
        assert np.array_equal(row, centre_pad(grey, SHAPE, SHAPE))
    entry = layout(report.path).fields["grey"].extra[fileformat.TRANSFORMS_KEY]
    assert entry["calls"][0]["step"] == "derive"
    assert layout(report.path).fields["grey"].extra["derived_from"] == ["image"]


# --- failures ------------------------------------------------------------------------------


def test_user_code_that_raises_rejects_the_sample_with_its_frame(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = setup(
        tmp_path,
        make_raw,
        write_config,
        fields={"image": {"transform": [{"call": "prep:fails_on_big"}]}},
    )
    report = build(config, jobs=2)
    big = {f"{k}.png" for k, size in make_raw_sizes().items() if size[0] > 20}
    assert set(rows(report.path, "image")) == {f"s{i:03d}.png" for i in range(6)} - big
    found = [r for r in rejects(report) if r["reason"] == "transform_error"]
    assert {Path(r["path"]).name for r in found} == big  # the image and the mask of each
    image = next(r for r in found if "/images/" in r["path"])
    assert image["detail"].startswith("image: prep:fails_on_big: ValueError: too big: 24 rows")
    line = PREP.splitlines().index('        raise ValueError(f"too big: {value.shape[0]} rows")')
    assert image["frame"] == f"{tmp_path / 'prep.py'}:{line + 1} in fails_on_big"


def make_raw_sizes() -> dict[str, tuple[int, int]]:
    """make_raw's sizes for n=6 (conftest.DEFAULT_SIZES cycled)."""
    from conftest import DEFAULT_SIZES

    return {f"s{i:03d}": DEFAULT_SIZES[i % len(DEFAULT_SIZES)] for i in range(6)}


@pytest.mark.parametrize(
    ("field", "call", "words"),
    [
        ("image", "prep:as_float", "image: expected uint8 at most (24 x 24 x 3), got float32"),
        ("mask", "prep:labels_of_two", "mask: expected mask values in [0, 1], got 2"),
    ],
)
def test_a_result_the_field_cannot_store_is_transform_output(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    field: str,
    call: str,
    words: str,
) -> None:
    config = setup(
        tmp_path, make_raw, write_config, fields={field: {"transform": [{"call": call}]}}
    )
    report = build(config)
    big = {k for k, size in make_raw_sizes().items() if size[0] > 20}
    assert set(rows(report.path, field)) == {f"s{i:03d}.png" for i in range(6)} - {
        f"{k}.png" for k in big
    }
    found = rejects(report)
    assert {r["key"] for r in found} == big
    assert {r["reason"] for r in found} == {"transform_output"}
    image = [r for r in found if f"/{field}s/" in r["path"]]
    assert image
    assert all(r["detail"].startswith(words) for r in image)


@pytest.mark.parametrize(
    ("transform", "words"),
    [
        ({"call": "nosuchmodule_h5etl:f"}, "no module 'nosuchmodule_h5etl'"),
        ({"call": "prep:missing"}, "has no 'missing'"),
        ({"call": "prep:noise", "args": {"scael": 3}}, "do not fit"),
        ({"call": "crop", "args": {"size": [0, 2]}}, "crop"),
        ({"call": "broken:f"}, "running"),
    ],
)
def test_a_call_that_cannot_run_is_one_config_line_before_any_work(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    transform: dict[str, Any],
    words: str,
) -> None:
    config = setup(tmp_path, make_raw, write_config, fields={"image": {"transform": [transform]}})
    (tmp_path / "broken.py").write_text("raise RuntimeError('at import')\n")
    code, out = cli("validate", config)
    assert code == 2
    line = out.strip()
    assert "\n" not in line
    assert "fields.image.transform[0]" in line
    assert words in line
    with pytest.raises(ConfigError, match=r"fields\.image\.transform\[0\]"):
        h5etl.build(load_spec(config))
    assert not (tmp_path / "releases").exists()  # nothing was made


def test_validate_says_the_config_runs_code_and_which_modules(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = setup(
        tmp_path, make_raw, write_config, fields={"image": {"transform": [{"call": "prep:invert"}]}}
    )
    code, out = cli("validate", config)
    assert code == 0
    assert f"runs the modules prep ({tmp_path / 'prep.py'})" in out
    plain = write_config(tmp_path, config_name="plain.yaml")
    assert "runs" not in cli("validate", plain)[1]


# --- randomness ----------------------------------------------------------------------------


def expected_noise(seed: int, key: str, value: np.ndarray, scale: int) -> np.ndarray:
    """The documented rule, written out: SHA-256 of canonical JSON [seed, key, site]."""
    text = json.dumps([seed, key, "image[0]"], separators=(",", ":"))
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "little")
    )
    drawn = rng.integers(-scale, scale + 1, value.shape)
    noisy: np.ndarray = np.clip(value.astype(np.int16) + drawn, 0, 255).astype(np.uint8)
    return noisy


def test_a_random_transform_stores_the_same_bytes_for_any_jobs(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    noisy: dict[str, Any] = {"image": {"transform": [{"call": "prep:noise", "args": {"scale": 9}}]}}
    config = setup(tmp_path, make_raw, write_config, fields=noisy, output="one")
    one = build(config, jobs=1)
    two = build(write_config(tmp_path, fields=noisy, output="two"), jobs=2)
    # in-process threads: an incremental build of a few samples decodes there (its parent
    # says what a sample costs); scale 8 then back to 9, each making every sample's image
    # again (the rest carried)
    noisy["image"]["transform"][0]["args"]["scale"] = 8
    build(write_config(tmp_path, fields=noisy, output="one"), jobs=2)
    noisy["image"]["transform"][0]["args"]["scale"] = 9
    threads = build(write_config(tmp_path, fields=noisy, output="one"), jobs=2)
    assert (threads.reused, threads.redone) == (6, ("image",))
    first = read_release(release(one))
    for other in (two, threads):
        found = read_release(release(other))
        assert found.keys() == first.keys()
        for name, data in found.items():
            assert np.array_equal(data, first[name]), name
    for name, row in rows(one.path, "image").items():
        value = rgb(tmp_path / "raw/images" / name)
        assert np.array_equal(row, centre_pad(expected_noise(0, name[:-4], value, 9), SHAPE, SHAPE))


# --- versioned: incremental, diff ----------------------------------------------------------


def test_an_incremental_build_redoes_what_the_transform_change_can_change(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    chain: dict[str, Any] = {"image": {"transform": [{"call": "prep:noise", "args": {"scale": 3}}]}}
    config = setup(tmp_path, make_raw, write_config, fields=chain)
    first = build(config)
    again = h5etl.build(load_spec(config))
    assert again.up_to_date  # nothing changed: nothing redone
    # another transform's args: every sample of the field is made again, the rest carried
    chain["image"]["transform"][0]["args"] = {"scale": 4}
    changed = build(write_config(tmp_path, fields=chain))
    assert (changed.reused, changed.redone) == (6, ("image",))
    assert changed.change.startswith("major")
    assert "transform changed (image, " in changed.change
    _code, out = cli("diff", release(first), release(changed))
    assert "transform changed (image, " in out
    # an edit of the module beside the config (no config change): the same
    (tmp_path / "prep.py").write_text(PREP + "\n# an edit\n")
    edited = build(config)
    assert (edited.reused, edited.redone) == (6, ("image",))
    assert "transform changed (image, " in edited.change
    # a new sample only: the others are carried
    make_raw(tmp_path, n=7)
    grown = build(config)
    assert grown.reused >= 4  # whole blocks of the parent's rows
    assert sum(grown.samples.values()) == 7


@pytest.mark.parametrize("edited", [False, True])
def test_a_resume_after_an_edit_of_the_module_starts_again(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig, edited: bool
) -> None:
    from h5etl.testing.kill import run_killed_build
    from h5etl.testing.kinds import pinned

    make_raw(tmp_path, n=12)
    (tmp_path / "prep.py").write_text(PREP)
    config = write_config(tmp_path, fields={"image": {"transform": [{"call": "prep:invert"}]}})
    with pinned():
        assert run_killed_build(config, after=4) != 0
        if edited:
            (tmp_path / "prep.py").write_text(PREP.replace("return 255 - value", "return value"))
        report = h5etl.build(load_spec(config), jobs=2, resume=True, checkpoint_seconds=0)
    if not edited:
        assert report.resumed > 0  # the same code: the killed build's samples are kept
        return
    assert report.resumed == 0  # nothing stored by the old code is kept
    for name, row in rows(report.path, "image").items():
        assert np.array_equal(row, centre_pad(rgb(tmp_path / "raw/images" / name), SHAPE, SHAPE))


@pytest.mark.parametrize(
    ("derive", "key", "words"),
    [
        ({"from": "filename", "call": "prep:grey"}, "derive.from", "text field"),
        ({"from": "grey", "call": "prep:grey"}, "derive.from", "derived from itself"),
        ({"from": "image", "call": "prep:nothing"}, "derive.call", "has no 'nothing'"),
        ({"from": ["image", "mask"]}, "derive.from", "need a call"),
    ],
)
def test_a_derive_call_that_cannot_run_is_a_config_error(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    derive: dict[str, Any],
    key: str,
    words: str,
) -> None:
    grey = {"kind": "image", "shape": [1, SHAPE, SHAPE], "derive": derive}
    config = setup(tmp_path, make_raw, write_config, fields={"grey": grey})
    code, out = cli("validate", config)
    assert code == 2
    assert f"fields.grey.{key}" in out
    assert words in out
