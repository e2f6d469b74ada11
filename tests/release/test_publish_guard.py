"""The loss guards (issue 25, item 1) and up to date whatever the rejects (item 14).

Real folders of PNGs built through the library and the CLI: a build that rejects past
``max_rejects``, leaves a split or a class empty, or stores far fewer samples than its parent
publishes nothing (exit 1, one line with the counts, the link untouched, the per-file reasons
written); ``--allow-loss`` publishes it; ``check`` flags an empty split or class. A build
whose only news are rejects publishes nothing either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from conftest import MakeRaw, RawFolder, WriteConfig, exact_splits, random_pair, save
from typer.testing import CliRunner, Result

import h5etl
from h5etl.check.health import check_release
from h5etl.cli.app import app
from h5etl.errors import BuildFailed

CLASSES = ("ant", "bee", "cat", "dog")


def cli(*args: object) -> Result:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def refused(config: Path, *args: object) -> str:
    """``h5etl build``: exit 1, one line, no traceback; that line."""
    result = cli("build", "-j", 1, "-q", config, *args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("h5etl: error: "), lines
    assert "Traceback" not in result.output
    return lines[0]


def defaults(write_config: WriteConfig, root: Path, **over: Any) -> Path:
    """``write_config`` with the loss guards at their defaults (conftest's base config
    lifts two of them for its tiny broken folders); ``None`` deletes a key."""
    return write_config(root, **{"max_rejects": None, "allow_empty": None, **over})


def releases(config: Path) -> list[str]:
    """The release files of the config's output folder (its link excluded)."""
    return sorted(p.name for p in (config.parent / "releases").glob("*-v*.h5"))


def link_target(config: Path, name: str = "cells") -> str | None:
    link = config.parent / "releases" / f"{name}.h5"
    return os.readlink(link) if link.is_symlink() else None


def stored_names(path: Path) -> dict[str, list[str]]:
    with h5py.File(path, "r") as handle:
        return {s: sorted(handle[s]["filename"].asstr()[...]) for s in ("train", "valid")}


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def failed_report(config: Path, name: str = "cells") -> list[dict[str, Any]]:
    path = config.parent / "releases" / f"{name}.failed.rejects.jsonl"
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


# --- rejects past max_rejects --------------------------------------------------------------


def test_a_build_rejecting_most_inputs_publishes_nothing_unless_allowed(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # 62 of 85 images truncated published a release of 23, exit 0, and check said OK
    raw = make_raw(tmp_path, n=20)
    for key in raw.keys[:12]:
        truncate(raw.image(key))
    config = defaults(write_config, tmp_path)

    line = refused(config)

    assert "of 40 input files rejected" in line
    assert "over max_rejects 0.05" in line
    assert "--allow-loss" in line
    assert releases(config) == []
    assert link_target(config) is None
    assert {Path(r["path"]).name for r in failed_report(config)} <= {
        f"{k}.png" for k in raw.keys[:12]
    }
    assert "of 40 input files rejected" in refused(config, "--dry-run", "--decode")

    result = cli("build", "-j", 1, "-q", "--allow-loss", config)

    assert result.exit_code == 0, result.output
    assert "warning: --allow-loss: 24 of 40 input files rejected (60%)" in result.output
    assert releases(config) == ["cells-v0001.h5"]
    facts = json.loads((config.parent / "releases" / "cells-v0001.build.json").read_text())
    assert facts["allowed_losses"] == [
        "--allow-loss: 24 of 40 input files rejected (60%), over max_rejects 0.05 (truncated 24)"
    ]
    names = stored_names(config.parent / "releases" / "cells-v0001.h5")
    assert sorted(names["train"] + names["valid"]) == [f"{k}.png" for k in raw.keys[12:]]


def test_an_incremental_build_past_max_rejects_leaves_the_link(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=20)
    config = defaults(write_config, tmp_path, max_rejects=0.1, max_shrink=None)
    assert h5etl.build(h5etl.load_spec(config), jobs=1).version == 1
    for key in raw.keys[:3]:  # 6 of 40 files: 15 %
        truncate(raw.image(key))

    with pytest.raises(BuildFailed, match=r"of 40 input files rejected .*over max_rejects 0\.1"):
        h5etl.build(h5etl.load_spec(config), jobs=1)

    assert releases(config) == ["cells-v0001.h5"]
    assert link_target(config) == "cells-v0001.h5"


# --- empty classes and splits --------------------------------------------------------------


def make_classes(root: Path, per_class: int = 5, **over: Any) -> Path:
    """``root/raw/<class>/<class>_<i>.png`` for CLASSES, and a class-folder config."""
    rng = np.random.default_rng(3)
    for name in CLASSES:
        for i in range(per_class):
            image = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
            save(root / "raw" / name / f"{name}_{i}.png", image)
    data: dict[str, Any] = {
        "name": "pets",
        "sources": {"image": {"dir": "raw", "glob": "*/*.png"}},
        "splits": {"train": 0.75, "valid": 0.25},
        "fields": {
            "image": {"kind": "image", "shape": [3, 8, 8], "mode": "RGB"},
            "label": {"kind": "label", "source": "image", "from": "folder"},
            "filename": {"kind": "text"},
        },
        "storage": {"chunk_samples": 2, "compression": "lzf"},
        **over,
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def test_a_class_whose_every_file_is_rejected_fails_a_first_build(tmp_path: Path) -> None:
    # 45 of 60 class-folder files rejected, two classes empty: published, exit 0
    config = make_classes(tmp_path, max_rejects=None)
    for name in ("ant", "bee"):
        for path in (tmp_path / "raw" / name).iterdir():
            truncate(path)

    line = refused(config)

    assert "class 'ant' of field 'label' is empty" in line
    assert "class 'bee' of field 'label' is empty" in line
    assert "cat" not in line.split("; no release")[0]
    assert releases(config) == []
    assert link_target(config, "pets") is None
    assert len(failed_report(config, "pets")) == 10
    dry = cli("build", "-j", 1, "-q", "--dry-run", "--decode", config)
    assert dry.exit_code == 1
    assert "class 'ant' of field 'label' is empty" in dry.stderr

    published = cli("build", "-j", 1, "-q", "--allow-loss", config)

    assert published.exit_code == 0, published.output
    assert "warning: --allow-loss: class 'ant' of field 'label' is empty" in published.output
    release = config.parent / "releases" / "pets-v0001.h5"
    with h5py.File(release, "r") as handle:
        labels = np.concatenate([handle[s]["label"][...] for s in ("train", "valid")])
        assert list(handle["train"]["label"].attrs["classes"]) == list(CLASSES)
    assert sorted(np.bincount(labels, minlength=4).tolist()) == [0, 0, 5, 5]
    report = check_release(release)
    assert [p for p in report.problems if "class" in p] == [
        f"field label: class {c!r} has 0 samples in every split (all of its inputs were "
        "rejected, or none was found)"
        for c in ("ant", "bee")
    ]
    assert cli("check", release).exit_code == 1


def test_allow_empty_publishes_an_empty_class_with_a_warning(tmp_path: Path) -> None:
    config = make_classes(tmp_path, max_rejects=None, allow_empty=True)
    for path in (tmp_path / "raw" / "ant").iterdir():
        truncate(path)

    report = h5etl.build(h5etl.load_spec(config), jobs=1)

    assert report.version == 1
    assert "class 'ant' of field 'label' is empty" in report.warnings


def test_a_class_the_parent_held_left_empty_fails_an_incremental_build(tmp_path: Path) -> None:
    config = make_classes(tmp_path, max_rejects=None, max_shrink=None)
    first = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert first.version == 1
    for path in (tmp_path / "raw" / "bee").iterdir():
        truncate(path)

    line = refused(config)

    assert "class 'bee' of field 'label' is empty (v0001 held 5)" in line
    assert releases(config) == ["pets-v0001.h5"]
    assert link_target(config, "pets") == "pets-v0001.h5"
    # the class's folder gone altogether: the class is no longer known, still lost
    for path in (tmp_path / "raw" / "bee").iterdir():
        path.unlink()
    (tmp_path / "raw" / "bee").rmdir()
    assert "class 'bee' of field 'label' is empty (v0001 held 5)" in refused(config)
    assert link_target(config, "pets") == "pets-v0001.h5"


def _valid_keys(path: Path) -> list[str]:
    with h5py.File(path, "r") as handle:
        return [Path(n).stem for n in handle["valid"]["filename"].asstr()[...]]


def test_a_split_the_parent_held_left_empty_fails_an_incremental_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=10)
    config = defaults(write_config, tmp_path, max_rejects=10, max_shrink=None)
    first = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert first.path is not None
    assert first.samples == {"train": 8, "valid": 2}
    for key in _valid_keys(first.path):
        truncate(raw.image(key))

    line = refused(config)

    assert "split 'valid' is empty: all 2 of its samples were rejected (v0001 held 2)" in line
    assert releases(config) == ["cells-v0001.h5"]
    assert link_target(config) == "cells-v0001.h5"


def test_a_split_whose_samples_are_all_rejected_fails_a_first_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    make_raw(tmp_path, n=4, broken={"bad": "truncated_late"})
    config = defaults(write_config, tmp_path, max_rejects=2, splits={"train": 0.8, "valid": 0.2})
    valid = [
        k
        for k, s in exact_splits(
            [*(f"s{i:03d}" for i in range(4)), "bad"], {"train": 0.8, "valid": 0.2}, 0
        ).items()
        if s == "valid"
    ]
    assert valid == ["bad"]  # the documented split rule puts the broken pair alone in valid

    line = refused(config)

    assert "split 'valid' is empty: all 1 of its samples were rejected; no release" in line
    assert releases(config) == []


def test_too_few_samples_for_a_split_warn_and_check_flags_the_empty_split(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # check said OK (1 warning) about a split that holds no sample
    make_raw(tmp_path, n=1)
    report = h5etl.build(h5etl.load_spec(defaults(write_config, tmp_path)), jobs=1)

    assert report.path is not None
    assert report.samples == {"train": 1, "valid": 0}
    assert report.warnings == [
        "split 'valid' is empty: none of the 1 samples fell in it (splits.valid: 0.2); "
        "add samples or change the fractions"
    ]
    checked = check_release(report.path)
    assert checked.problems == [
        "split valid: 0 samples: the split is empty (too few inputs, or all of its inputs "
        "were rejected)"
    ]
    assert cli("check", report.path).exit_code == 1


# --- fewer samples than the parent ---------------------------------------------------------


def _remove(raw: RawFolder, keys: list[str]) -> None:
    for key in keys:
        raw.image(key).unlink()
        raw.mask(key).unlink()


def test_a_build_storing_far_fewer_samples_than_its_parent_publishes_nothing(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=20)
    config = defaults(write_config, tmp_path)
    assert h5etl.build(h5etl.load_spec(config), jobs=1).version == 1
    _remove(raw, raw.keys[:3])  # 15 % of the samples

    line = refused(config)

    assert "17 samples stored, 3 (15%) fewer than v0001's 20: over max_shrink 0.1" in line
    assert releases(config) == ["cells-v0001.h5"]
    assert link_target(config) == "cells-v0001.h5"
    assert "17 samples stored" in refused(config, "--dry-run")  # planned counts tell it

    published = cli("build", "-j", 1, "-q", "--allow-loss", config)

    assert published.exit_code == 0, published.output
    assert "warning: --allow-loss: 17 samples stored, 3 (15%) fewer" in published.output
    assert link_target(config) == "cells-v0002.h5"
    names = stored_names(config.parent / "releases" / "cells-v0002.h5")
    assert sorted(names["train"] + names["valid"]) == [f"{k}.png" for k in raw.keys[3:]]
    # from v0002 on, 2 of 17 more (12 %) is past the guard again; 1 (6 %) is not
    _remove(raw, raw.keys[3:5])
    assert "over max_shrink" in refused(config)
    save(raw.image(raw.keys[3]), random_pair(np.random.default_rng(1), (9, 9))[0])
    save(raw.mask(raw.keys[3]), random_pair(np.random.default_rng(1), (9, 9))[1])
    assert h5etl.build(h5etl.load_spec(config), jobs=1).version == 3


def test_max_shrink_zero_refuses_any_lost_sample(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=6)
    config = defaults(write_config, tmp_path, max_shrink=0)
    assert h5etl.build(h5etl.load_spec(config), jobs=1).version == 1
    _remove(raw, raw.keys[:1])

    assert "5 samples stored, 1 (17%) fewer than v0001's 6: over max_shrink 0" in refused(config)


# --- up to date whatever the rejects (item 14) ---------------------------------------------


def _bad_mask(path: Path, value: int | None) -> None:
    """A 0/255 mask of 12x14 pixels, with one pixel of ``value`` (None: a valid mask)."""
    _, mask = random_pair(np.random.default_rng(value or 0), (12, 14))
    if value is not None:
        mask[2, 3] = value
    save(path, mask)


def test_a_build_whose_news_are_only_rejects_is_up_to_date(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a different invalid mask was published as "patch: no change"
    raw = make_raw(tmp_path, n=9, broken={"bad": "mask_128"})
    config = defaults(write_config, tmp_path, max_rejects=10)
    first = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert first.path is not None
    folder = first.path.parent
    before = sorted(p.name for p in folder.iterdir() if p.suffix == ".h5")
    _bad_mask(raw.mask("bad"), 77)  # another invalid mask

    again = cli("build", "-j", 1, "-q", config)

    assert again.exit_code == 0, again.output
    assert again.output.startswith("cells: nothing changed since cells-v0001 (9 samples"), again
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".h5") == before
    assert link_target(config) == "cells-v0001.h5"
    report = h5etl.build(h5etl.load_spec(config), jobs=1)  # decided without decoding now
    assert report.up_to_date
    assert report.version == 1
    assert report.reused == 0
    assert [r.reason for r in report.rejects] == ["mask_values"] * 2  # the pair's two files
    assert all("77" in r.detail for r in report.rejects)  # as they are now, not v0001's 128
    # a new orphan (found before decoding) and a new pair rejected while decoding
    save(raw.masks / "orphan.png", random_pair(np.random.default_rng(2), (8, 8))[1])
    _bad_mask(raw.mask("worse"), 99)
    save(raw.image("worse"), random_pair(np.random.default_rng(3), (12, 14))[0])
    report = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert report.up_to_date
    assert report.version == 1
    assert sorted(r.reason for r in report.rejects) == ["mask_values"] * 4 + ["orphan"]
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".h5") == before
    # a mask made valid is new data: published, the sample stored
    _bad_mask(raw.mask("bad"), None)
    fixed = h5etl.build(h5etl.load_spec(config), jobs=1)
    assert fixed.version == 2
    assert fixed.path is not None
    assert "bad.png" in [n for names in stored_names(fixed.path).values() for n in names]
    assert fixed.change.startswith("minor (from v0001): 1 sample added"), fixed.change
