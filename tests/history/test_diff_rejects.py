"""``h5etl diff A B``'s rejects section, on real releases built from a folder whose files are
broken, fixed and broken again between the builds.

Expectations come from the raw folders (which file was broken, how: ``BROKEN_REASONS``) and
from h5py reads of the files (which split stores a key), never from the diff's own reader.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
from conftest import BROKEN_REASONS, MakeRaw, WriteConfig, add_pairs, png_bytes, random_pair
from numpy.random import default_rng
from typer.testing import CliRunner

from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.pipeline import run as pipeline


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def _build(config: Path) -> Path:
    report = pipeline.build(load_spec(config), jobs=1)
    assert report.path is not None
    return report.path


def _split_of(path: Path, key: str) -> str:
    """The split whose sample keys hold ``key``, read with h5py."""
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            if key in handle[f"{split}/sample_key"].asstr()[...].tolist():
                return split
    raise AssertionError(f"{key} is stored in no split of {path}")


def _truncate(image: Path) -> None:
    data = png_bytes(random_pair(default_rng(7), (12, 12))[0])
    image.write_bytes(data[: len(data) // 2])


def test_diff_shows_fixed_newly_rejected_and_another_reason(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a file rejected in A and stored in B showed only as "added"; a newly rejected one
    # only as "removed", without its reason
    raw = make_raw(tmp_path, n=24, broken={"bad1": "truncated", "bad2": "text"})
    config = write_config(tmp_path)
    v1 = _build(config)
    add_pairs(tmp_path, ["bad1"], seed=3)  # fixed: a good pair under the same name
    v2 = _build(config)
    fixed = _split_of(v2, "bad1")
    _truncate(raw.image("s003"))  # newly broken, stored in v1 and v2
    was = _split_of(v2, "s003")
    _truncate(raw.image("bad2"))  # broken another way: another reason
    v3 = _build(config)

    code, out = _cli("diff", v1, v2)
    assert code == 0, out
    lines = out.splitlines()
    assert "rejects: 4 -> 2 files; 1 fixed" in lines
    assert (
        f"  fixed: bad1 (now in {fixed}): was {BROKEN_REASONS['truncated']}: raw/images/bad1.png"
        in [line.split(".png", 1)[0] + ".png" for line in lines]
    )

    code, out = _cli("diff", v2, v3)
    assert code == 0, out
    lines = out.splitlines()
    assert "rejects: 2 -> 4 files; 1 newly rejected, 1 another reason" in lines
    newly = next(line for line in lines if line.startswith("  newly rejected: "))
    assert newly.startswith(f"  newly rejected: s003: {BROKEN_REASONS['truncated']}: ")
    assert "raw/images/s003.png" in newly
    assert newly.endswith(f"(was in {was})")
    other = next(line for line in lines if line.startswith("  another reason: "))
    before, after = BROKEN_REASONS["text"], BROKEN_REASONS["truncated"]
    assert other.startswith(f"  another reason: bad2: {before} -> {after}: raw/images/bad2.png")

    code, out = _cli("diff", v2, v3, "--json")
    assert code == 0, out
    rejects = json.loads(out)["rejects"]
    assert (rejects["a"], rejects["b"]) == (2, 4)
    assert [(c["key"], c["a"], c["b"], c["split"]) for c in rejects["newly_rejected"]] == [
        ("s003", None, BROKEN_REASONS["truncated"], was)
    ]
    assert [(c["key"], c["a"], c["b"]) for c in rejects["another_reason"]] == [
        ("bad2", before, after)
    ]
    assert rejects["fixed"] == rejects["cleared"] == []
    code, out = _cli("diff", v1, v2, "--json")
    fixed_json = json.loads(out)["rejects"]["fixed"]
    assert [(c["key"], c["a"], c["b"], c["split"], c["path"]) for c in fixed_json] == [
        ("bad1", BROKEN_REASONS["truncated"], None, fixed, "raw/images/bad1.png")
    ]


def test_the_same_rejects_show_as_the_same_and_a_gone_input_as_cleared(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=12, broken={"bad1": "truncated"})
    config = write_config(tmp_path)
    v1 = _build(config)
    add_pairs(tmp_path, ["new1"], seed=5)
    v2 = _build(config)
    code, out = _cli("diff", v1, v2)
    assert code == 0, out
    assert "rejects: 2 -> 2 files, the same inputs for the same reasons" in out.splitlines()
    assert "change: minor: 1 sample added" in out.splitlines()
    # the broken input is gone (and a pair added, so the build has something to store)
    raw.image("bad1").unlink()
    raw.mask("bad1").unlink()
    add_pairs(tmp_path, ["new2"], seed=6)
    v3 = _build(config)
    code, out = _cli("diff", v2, v3)
    assert code == 0, out
    lines = out.splitlines()
    assert "rejects: 2 -> 0 files; 1 cleared" in lines
    cleared = next(line for line in lines if line.startswith("  cleared: "))
    assert cleared.startswith(f"  cleared: bad1: was {BROKEN_REASONS['truncated']}: raw/images/")
    assert cleared.endswith("(neither stored nor rejected now)")
