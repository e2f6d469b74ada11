"""Splits end to end: exact, sticky across releases, grouped, leakage found by check."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import WriteConfig, random_pair, save

from h5etl import ConfigError, build, load_spec
from h5etl.check.health import check_release

FRACTIONS = {"train": 0.7, "valid": 0.2, "test": 0.1}
PATTERN = r"^(pt\d+)_"


def add_pairs(root: Path, keys: list[str], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for key in keys:
        image, mask = random_pair(rng, (8, 9))
        save(root / "raw" / "images" / f"{key}.png", image)
        save(root / "raw" / "masks" / f"{key}.png", mask)


def remove_pairs(root: Path, keys: list[str]) -> None:
    for key in keys:
        (root / "raw" / "images" / f"{key}.png").unlink()
        (root / "raw" / "masks" / f"{key}.png").unlink()


def where(path: Path) -> dict[str, str]:
    """sample_key -> split, read straight from the file."""
    out: dict[str, str] = {}
    with h5py.File(path, "r") as handle:
        for split in handle:
            if split != "diagnostics":
                for key in handle[f"{split}/sample_key"].asstr()[...]:
                    assert key not in out
                    out[str(key)] = split
    return out


def groups_of(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with h5py.File(path, "r") as handle:
        for split in handle:
            if split != "diagnostics":
                keys = handle[f"{split}/sample_key"].asstr()[...]
                groups = handle[f"{split}/sample_group"].asstr()[...]
                out.update(zip(map(str, keys), map(str, groups), strict=True))
    return out


def policy(path: Path) -> dict[str, object]:
    with h5py.File(path, "r") as handle:
        result: dict[str, object] = json.loads(handle.attrs["split_policy"])
        return result


def test_the_issue_290_samples_at_08_02_split_exactly(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    # 290 samples at 0.8/0.2 gave 216/74 (25.5% valid) with the hash rule
    add_pairs(tmp_path, [f"img{i:03d}" for i in range(290)])
    config = write_config(
        tmp_path, splits={"train": 0.8, "valid": 0.2}, storage={"chunk_samples": 16}
    )
    report = build(load_spec(config))
    assert report.samples == {"train": 232, "valid": 58}
    assert report.path is not None
    assert policy(report.path)["rule"] == "exact"


def test_a_sample_never_changes_split_across_five_releases(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    add_pairs(tmp_path, [f"r0_{i:02d}" for i in range(30)])
    config = load_spec(write_config(tmp_path, splits=FRACTIONS, storage={"chunk_samples": 2}))
    first = build(config)
    assert first.path is not None
    history = [where(first.path)]
    for release in range(1, 5):
        add_pairs(tmp_path, [f"r{release}_{i:02d}" for i in range(3 + release)], seed=release)
        gone = sorted(history[-1])[release::11]  # a few samples withdrawn each time
        remove_pairs(tmp_path, gone)
        report = build(config)
        assert report.path is not None
        now = where(report.path)
        before = history[-1]
        assert not set(gone) & set(now)
        for key, split in now.items():
            for earlier in history:
                if key in earlier:
                    assert earlier[key] == split, (key, release)
        recorded = policy(report.path)
        assert recorded["rule"] == "sticky"
        assert recorded["parent"] == release
        assert recorded["kept"] == len(set(before) & set(now))
        assert recorded["dropped"] == len(gone)
        counts = Counter(now.values())
        for split, fraction in FRACTIONS.items():
            assert counts[split] - fraction * len(now) < 1
        history.append(now)


def test_a_withdrawn_patient_disappears_and_nothing_else_moves(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    keys = [f"pt{p:02d}_{i}" for p in range(12) for i in range(4)]
    add_pairs(tmp_path, keys)
    splits = {"train": 0.75, "valid": 0.25, "group_by": PATTERN}
    config = load_spec(write_config(tmp_path, splits=splits, storage={"chunk_samples": 4}))
    first = build(config)
    assert first.path is not None
    before = where(first.path)
    assert Counter(before.values()) == {"train": 36, "valid": 12}  # 9 and 3 whole patients
    assert groups_of(first.path)["pt05_2"] == "pt05"
    remove_pairs(tmp_path, [k for k in keys if k.startswith("pt05_")])
    second = build(config)
    assert second.path is not None
    after = where(second.path)
    assert after == {k: s for k, s in before.items() if not k.startswith("pt05_")}
    assert check_release(second.path).ok


def test_groups_stay_whole_and_check_reports_leakage(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    sizes = [5, 1, 3, 2, 6, 1, 4, 2, 2, 3]
    keys = [f"pt{p:02d}_{i}" for p, n in enumerate(sizes) for i in range(n)]
    add_pairs(tmp_path, keys)
    splits = {"train": 0.7, "valid": 0.3, "group_by": {"pattern": PATTERN}}
    report = build(load_spec(write_config(tmp_path, splits=splits)))
    assert report.path is not None
    found = where(report.path)
    by_group: dict[str, set[str]] = {}
    for key, split in found.items():
        by_group.setdefault(key.split("_")[0], set()).add(split)
    assert all(len(s) == 1 for s in by_group.values())
    counts = Counter(found.values())
    assert abs(counts["train"] - 0.7 * len(keys)) <= max(sizes)
    assert check_release(report.path).ok
    # a group found in two splits (an older build, a hand-edited file) is a problem
    leaked = tmp_path / "leaked.h5"
    shutil.copy(report.path, leaked)
    with h5py.File(leaked, "r+") as handle:
        train_group = str(handle["train/sample_group"].asstr()[0])
        handle["valid/sample_group"][0] = train_group
    result = check_release(leaked)
    assert not result.ok
    assert any(f"group {train_group!r} is in 2 splits" in p for p in result.problems)


def test_a_sample_the_pattern_does_not_match_is_a_reject(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    add_pairs(tmp_path, ["pt01_a", "pt01_b", "pt02_a", "stray"])
    splits = {"train": 0.5, "valid": 0.5, "group_by": PATTERN}
    report = build(load_spec(write_config(tmp_path, splits=splits)))
    assert sum(report.samples.values()) == 3
    reasons = {(Path(r.path).name, r.reason) for r in report.rejects}
    assert reasons == {("stray.png", "no_group")}
    assert report.rejects_path is not None
    assert "does not match splits.group_by" in report.rejects_path.read_text()


def test_groups_from_a_table_column(tmp_path: Path, write_config: WriteConfig) -> None:
    keys = [f"img{i:02d}" for i in range(12)]
    add_pairs(tmp_path, keys)
    rows = "".join(f"{k}.png,patient{i // 3}\n" for i, k in enumerate(keys))
    (tmp_path / "meta.csv").write_text("file,patient\n" + rows)
    table = {"table": str(tmp_path / "meta.csv"), "key": "file", "column": "patient"}
    config = write_config(
        tmp_path,
        splits={"train": 0.5, "valid": 0.5, "group_by": {"field": "patient"}},
        fields={"patient": {"kind": "text", "from": table}},
    )
    report = build(load_spec(config))
    assert report.path is not None
    groups = groups_of(report.path)
    found = where(report.path)
    for key, group in groups.items():
        assert group == f"patient{keys.index(key) // 3}"
        assert {found[k] for k, g in groups.items() if g == group} == {found[key]}
    assert Counter(found.values()) == {"train": 6, "valid": 6}


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        pytest.param({"train": 1.0, "group_by": "(unclosed"}, "is not a regex", id="bad-regex"),
        pytest.param(
            {"train": 1.0, "group_by": {"field": "nope"}}, "'nope' is not a field", id="no-field"
        ),
        pytest.param(
            {"train": 1.0, "group_by": {"field": "filename"}},
            "is not known before decoding",
            id="decoded-field",
        ),
    ],
)
def test_group_by_mistakes_are_config_errors(
    tmp_path: Path, write_config: WriteConfig, splits: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_spec(write_config(tmp_path, splits=splits))


def test_the_policy_is_recorded_and_group_by_round_trips(
    tmp_path: Path, write_config: WriteConfig
) -> None:
    add_pairs(tmp_path, ["pt1_a", "pt2_a"])
    splits = {"train": 0.5, "valid": 0.5, "group_by": PATTERN}
    report = build(load_spec(write_config(tmp_path, splits=splits)))
    assert report.path is not None
    recorded = policy(report.path)
    assert recorded["rule"] == "grouped"
    assert recorded["group_by"] == f"pattern {PATTERN}"
    assert recorded["fractions"] == {"train": 0.5, "valid": 0.5}
    with h5py.File(report.path, "r") as handle:
        stored = str(handle.attrs["config"])
    copy = tmp_path / "again.yaml"
    copy.write_text(stored)
    assert load_spec(copy).group_by == load_spec(write_config(tmp_path, splits=splits)).group_by
    assert os.path.exists(report.path)
