"""An incremental build after a transform change makes only the fields it can change (issue
28 item 5): the user module beside the config counts its calls per field in a file, so each
test counts which code ran; the release is compared dataset by dataset with a ``--full``
build of the same config, and its values with what numpy makes of the PNGs here."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from conftest import SHAPE, MakeRaw, WriteConfig, add_pairs, centre_pad
from PIL import Image
from typer.testing import CliRunner

import h5etl
import h5etl.plan.tasks
from h5etl.check.health import check_release
from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.execute import local_threads
from h5etl.testing import run_killed_build

COUNTED = """
import numpy as np

LOG = {log!r}


def _count(name):
    with open(LOG, "a") as handle:
        handle.write(name + "\\n")


def brighter(value, *, by):
    _count("image")
    return np.clip(value.astype(np.int16) + by, 0, 255).astype(np.uint8)


def flipped(value, *, times):
    _count("mask")
    return value[::-1] if times % 2 else value


def grey(value, *, shift=0):
    _count("grey")
    return (value.mean(axis=2) // (1 + shift)).astype(np.uint8)


def corner(sample, *, size):
    _count("corner")
    return {{name: value[:size, :size] for name, value in sample.items()}}


def refuses(value, *, by):
    _count("image")
    if by > 5 and value.shape[0] == 24:
        raise ValueError("too bright")
    return value
"""


@pytest.fixture(autouse=True)
def _epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # created_at: the same in both


def counted_project(
    root: Path, make_raw: MakeRaw, write_config: WriteConfig, **config: Any
) -> Path:
    make_raw(root, n=8)
    (root / "prep.py").write_text(COUNTED.format(log=str(root / "calls.log")))
    return write_config(root, **config)


def calls(root: Path) -> Counter[str]:
    """The calls counted since the last look (the log is emptied)."""
    log = root / "calls.log"
    found = Counter(log.read_text().split()) if log.exists() else Counter[str]()
    log.write_text("")
    return found


def fields(by: int = 1, times: int = 0, shift: int = 0) -> dict[str, Any]:
    return {
        "image": {"transform": [{"call": "prep:brighter", "args": {"by": by}}]},
        "mask": {"transform": [{"call": "prep:flipped", "args": {"times": times}}]},
        "grey": {
            "kind": "image",
            "shape": [1, SHAPE, SHAPE],
            "derive": {"from": "image", "call": "prep:grey", "args": {"shift": shift}},
        },
    }


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    report = h5etl.build(load_spec(config), **kwargs)
    assert report.path is not None
    return report


# what names a release's place in history (its version, its parent, the change from it):
# the only file attributes an incremental release and a full build of it may differ in
HISTORY_ATTRS = (
    *("version", "parent", "parent_version", "parent_fingerprint"),
    *("change", "change_summary", "split_policy"),
)
# over the samples' keys and file digests in write order, which interleaves the splits'
# tasks: a carrying build writes each split's carried rows first (as it did before issue 28)
ORDER_ATTRS = ("source_fingerprint",)


def contents(path: Path) -> dict[str, Any]:
    """Every dataset's values and attributes, every /diagnostics attribute (statistics,
    per-dataset digests and bytes, conversions, class counts, rejects) and the file's
    attributes but its history."""
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as handle:

        def visit(name: str, node: object) -> None:
            if isinstance(node, h5py.Dataset | h5py.Group):
                attrs = repr(sorted(node.attrs.items()))
                values = node[...].tolist() if isinstance(node, h5py.Dataset) else None
                out[name] = (values, attrs)

        handle.visititems(visit)
        skip = (*HISTORY_ATTRS, *ORDER_ATTRS)
        out["/"] = {k: v for k, v in handle.attrs.items() if k not in skip}
    return out


def carry_record(path: Path) -> dict[str, Any]:
    record = json.loads(path.with_name(f".{path.name}.carry.json").read_text())
    return {k: v for k, v in record.items() if k in ("blocks", "rows", "samples", "rejected")}


def assert_as_full(incremental: Path | None, full: Path | None) -> None:
    """``incremental`` holds what ``full`` (a --full build of the same config) holds."""
    assert incremental is not None
    assert full is not None
    mine, theirs = contents(incremental), contents(full)
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        assert repr(mine[name]) == repr(theirs[name]), name
    assert carry_record(incremental) == carry_record(full)
    assert check_release(incremental, deep=True).ok


def deep_ok(path: Path | None) -> bool:
    assert path is not None
    return check_release(path, deep=True).ok


def pixels(path: Path, mode: str) -> np.ndarray:
    with Image.open(path) as image:
        array: np.ndarray = np.asarray(image.convert(mode))
    return array


def stored(path: Path | None, field: str) -> dict[str, np.ndarray]:
    assert path is not None
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            names = handle[f"{split}/filename"].asstr()[...]
            out.update(zip(names, handle[f"{split}/{field}"][...], strict=True))
    return out


def test_one_fields_changed_args_redo_that_field_and_what_derives_from_it(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = counted_project(tmp_path, make_raw, write_config, fields=fields())
    build(config)
    assert calls(tmp_path) == {"image": 8, "mask": 8, "grey": 8}
    # the image's args: the image and the grey derived from it, never the mask
    changed = build(write_config(tmp_path, fields=fields(by=2)))
    assert calls(tmp_path) == {"image": 8, "grey": 8}
    assert changed.reused == 8
    assert changed.redone == ("grey", "image")
    assert "transform changed (image, " in changed.change
    for name, row in stored(changed.path, "image").items():
        source = pixels(tmp_path / "raw/images" / name, "RGB").astype(np.int16) + 2
        expected = centre_pad(np.clip(source, 0, 255).astype(np.uint8), SHAPE, SHAPE)
        assert np.array_equal(row, expected)
    full = build(config, full=True)
    calls(tmp_path)
    assert_as_full(changed.path, full.path)
    # the mask's args: the mask only
    flipped = build(write_config(tmp_path, fields=fields(by=2, times=1)))
    assert calls(tmp_path) == {"mask": 8}
    assert flipped.redone == ("mask",)
    for name, row in stored(flipped.path, "mask").items():
        labels = (pixels(tmp_path / "raw/masks" / name, "L") == 255).astype(np.uint8)[::-1]
        assert np.array_equal(row, centre_pad(labels, SHAPE, SHAPE))
    full = build(config, full=True)
    calls(tmp_path)
    assert_as_full(flipped.path, full.path)
    # the derive's own args: the derived field only (the image is read, not transformed)
    # the derive's own args, through the CLI: the derived field only; its source's chain
    # runs to make its input, the image is copied
    done = CliRunner().invoke(app, ["build", str(write_config(tmp_path, fields=fields(2, 1, 1)))])
    assert done.exit_code == 0, done.output
    assert calls(tmp_path) == {"image": 8, "grey": 8}
    assert "carried: 8 samples" in done.output
    assert "made again for those samples (their transform changed): grey\n" in done.output
    assert "transform changed (grey, " in done.output


def test_a_transform_added_then_removed_makes_its_field_again(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = counted_project(tmp_path, make_raw, write_config)  # no transform at all
    build(config)
    added = build(write_config(tmp_path, fields={"image": fields()["image"]}))
    assert calls(tmp_path) == {"image": 8}
    assert (added.reused, added.redone) == (8, ("image",))
    removed = build(write_config(tmp_path))  # the image decoded again, no code runs
    assert calls(tmp_path) == {}
    assert (removed.reused, removed.redone) == (8, ("image",))
    full = build(config, full=True)
    assert_as_full(removed.path, full.path)


def test_a_sample_call_redoes_its_fields_and_a_new_file_is_decoded_whole(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    def crop(size: int) -> list[dict[str, Any]]:
        return [{"call": "prep:corner", "fields": ["image", "mask"], "args": {"size": size}}]

    config = counted_project(tmp_path, make_raw, write_config, fields=fields(), transforms=crop(8))
    build(config)
    calls(tmp_path)
    add_pairs(tmp_path, ["new"], seed=3)
    for side in ("images", "masks"):
        (tmp_path / "raw" / side / "s003.png").unlink()
    changed = build(write_config(tmp_path, fields=fields(), transforms=crop(6)))
    # image and mask again (the crop sees both), the grey from the image; the new pair and
    # the block the removed one was in decoded whole: every sample once
    assert calls(tmp_path) == {"corner": 8, "image": 8, "mask": 8, "grey": 8}
    assert changed.redone == ("grey", "image", "mask")
    assert changed.reused >= 2
    assert sum(changed.samples.values()) == 8
    assert "s003.png" not in stored(changed.path, "image")
    images, masks = stored(changed.path, "image"), stored(changed.path, "mask")
    for name in images:
        brighter = pixels(tmp_path / "raw/images" / name, "RGB").astype(np.int16) + 1
        labels = (pixels(tmp_path / "raw/masks" / name, "L") == 255).astype(np.uint8)
        image = np.clip(brighter, 0, 255).astype(np.uint8)[:6, :6]
        assert np.array_equal(images[name], centre_pad(image, SHAPE, SHAPE)), name
        assert np.array_equal(masks[name], centre_pad(labels[:6, :6], SHAPE, SHAPE)), name
    assert deep_ok(changed.path)


def test_a_sample_the_new_code_rejects_decodes_every_sample(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    def refusing(by: int) -> dict[str, Any]:
        return {"image": {"transform": [{"call": "prep:refuses", "args": {"by": by}}]}}

    config = counted_project(tmp_path, make_raw, write_config, fields=refusing(1))
    build(config)
    report = build(write_config(tmp_path, fields=refusing(9), max_shrink=0.5), jobs=2)
    # the write that met the rejects was given up; the samples left were split again
    # (settle), and that write carries the blocks the rejected samples were not in
    assert any("the changed transform rejected a carried sample" in w for w in report.warnings)
    # the two 24-pixel samples (of the 5 sizes make_raw cycles through) are rejected
    assert sorted(r.key for r in report.rejects if r.reason == "transform_error") == [
        "s001",
        "s001",
        "s006",
        "s006",
    ]
    assert sum(report.samples.values()) == 6
    full = build(config, full=True)  # its rows in another order: carried rows come first
    for field in ("image", "mask"):
        mine, theirs = stored(report.path, field), stored(full.path, field)
        assert sorted(mine) == sorted(theirs)
        assert all(np.array_equal(mine[name], theirs[name]) for name in mine)
    assert deep_ok(report.path)


def test_a_killed_redo_build_resumes_to_the_same_release(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    config = counted_project(tmp_path, make_raw, write_config, fields=fields())
    make_raw(tmp_path, n=16)
    build(config)
    write_config(tmp_path, fields=fields(by=3))
    assert run_killed_build(config, after=4) == -signal.SIGKILL
    resumed = build(config, resume=True)
    assert resumed.version == 2
    assert resumed.redone == ("grey", "image")
    full = build(config, full=True)
    assert_as_full(resumed.path, full.path)


@pytest.mark.parametrize(("jobs", "where"), [(1, "this process"), (2, "workers")])
def test_workers_make_the_same_release(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    jobs: int,
    where: str,
) -> None:
    # tasks of 8 of 19 and 5 carried samples: the last task of a round defers the partial
    # block at its end to the next round (the parent split's last, carried too)
    monkeypatch.setattr(h5etl.plan.tasks, "TASK_SAMPLES", 8)
    monkeypatch.setattr(local_threads, "START_SECONDS", 0.0)  # -j2: worker processes
    config = counted_project(tmp_path, make_raw, write_config, fields=fields())
    make_raw(tmp_path, n=24)
    build(config)
    changed = build(write_config(tmp_path, fields=fields(by=2)), jobs=jobs)
    assert changed.redone == ("grey", "image")
    assert changed.path is not None
    facts = json.loads(changed.path.with_name("cells-v0002.build.json").read_text())
    assert facts["decoded_in"] == where
    assert calls(tmp_path)["mask"] == 24  # the first build's
    full = build(config, full=True, jobs=jobs)
    assert_as_full(changed.path, full.path)
