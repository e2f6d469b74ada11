"""The kind contract suite itself (h5etl.testing) fails when a kind breaks its promises: a
wrong or missing value, a flipped byte. Its passing runs are the kinds' own (tests/kinds/,
Test*Contract; imported here as a module, so pytest does not collect the class twice)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import test_kind_label

from h5etl.check.health import check_release
from h5etl.testing.kinds import build, flip_a_stored_byte


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("labels")
    case = test_kind_label.TestLabelContract()
    report = build(case.make_raw(root), jobs=1)
    assert report.path is not None
    return report.path, dict(case.expected(root))


def test_a_wrong_or_missing_value_fails_the_readers_check(
    release: tuple[Path, dict[str, int]],
) -> None:
    path, want = release
    case = test_kind_label.TestLabelContract()
    case._assert_read(path, want)  # the truth passes
    key = sorted(want)[0]
    with pytest.raises(AssertionError, match=key):
        case._assert_read(path, {**want, key: want[key] + 1})
    with pytest.raises(AssertionError, match="not stored"):
        case._assert_read(path, {**want, "cat/nowhere": 0})
    with pytest.raises(AssertionError, match="none expected"):
        case._assert_read(path, {k: v for k, v in want.items() if k != key})


def test_the_flipped_byte_is_one_of_the_rows(
    release: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    # labels are stored raw in chunks of hundreds of rows: a byte flipped in the middle of the
    # chunk fell past the last row, where no reader (and no check) looks
    path, _ = release
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())
    flip_a_stored_byte(copy, "train/label")
    with h5py.File(path, "r") as before, h5py.File(copy, "r") as after:
        assert before["train/label"].chunks[0] > len(before["train/label"])
        changed = np.flatnonzero(before["train/label"][...] != after["train/label"][...])
    assert len(changed) == 1
    assert not check_release(copy, deep=True).ok
