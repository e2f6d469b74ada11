"""discover with ``entries: folders``: case folders as entries, paired with files by key."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from conftest import base_config, merge
from hypothesis import given, settings
from hypothesis import strategies as st

from h5etl.config.load import parse_spec
from h5etl.config.spec import Spec
from h5etl.plan import admit, discover


def folder_spec(root: Path, *, ct: dict[str, object], masks: dict[str, object]) -> Spec:
    """Sources ``ct`` (folders) and ``masks`` under ``root/raw``; the fields do not matter
    to discover, so they are the base config's image and mask."""
    (root / "raw" / "ct").mkdir(parents=True, exist_ok=True)
    (root / "raw" / "masks").mkdir(parents=True, exist_ok=True)
    data = merge(base_config(), {})
    data["sources"] = {
        "image": {"dir": "raw/ct", **ct},
        "mask": {"dir": "raw/masks", **masks},
    }
    return parse_spec(data, config_path=root / "config.yaml")


def touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_case_folders_pair_with_nifti_files_by_key(tmp_path: Path) -> None:
    spec = folder_spec(tmp_path, ct={"entries": "folders"}, masks={"glob": "*.nii.gz"})
    for case in ("case_1", "case_2", "case.3"):
        touch(tmp_path / "raw/ct" / case / "IM0001")
        touch(tmp_path / "raw/masks" / f"{case}.nii.gz")
    touch(tmp_path / "raw/ct/.hidden/IM0001")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["case.3", "case_1", "case_2"]
    assert found.samples[0].relpaths == ("case.3", "case.3.nii.gz")  # a folder keeps its dot
    assert found.rejects == []


def test_a_file_in_a_folder_source_is_a_not_a_folder_reject_with_its_partner(
    tmp_path: Path,
) -> None:
    spec = folder_spec(tmp_path, ct={"entries": "folders"}, masks={"glob": "*.nii.gz"})
    touch(tmp_path / "raw/ct/case_1/IM0001")
    touch(tmp_path / "raw/ct/case_2")  # a stray file where a case folder belongs
    touch(tmp_path / "raw/masks/case_1.nii.gz")
    touch(tmp_path / "raw/masks/case_2.nii.gz")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["case_1"]
    reasons = {Path(r.path).name: (r.reason, r.detail) for r in found.rejects}
    assert reasons["case_2"][0] == "not_a_folder"
    assert "a regular file" in reasons["case_2"][1]
    assert reasons["case_2.nii.gz"][0] == "not_a_folder"
    assert "raw/ct/case_2" in reasons["case_2.nii.gz"][1]  # names the culprit


def test_a_deeper_glob_finds_series_folders_under_patients(tmp_path: Path) -> None:
    spec = folder_spec(
        tmp_path,
        ct={"entries": "folders", "glob": "*/*"},
        masks={"entries": "folders", "glob": "*/*"},
    )
    for patient, series in (("p1", "s1"), ("p1", "s2"), ("p2", "s1")):
        touch(tmp_path / "raw/ct" / patient / series / "a.dcm")
        touch(tmp_path / "raw/masks" / patient / series / "slice_000.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["p1/s1", "p1/s2", "p2/s1"]


def test_a_linked_case_folder_is_an_entry(tmp_path: Path) -> None:
    spec = folder_spec(tmp_path, ct={"entries": "folders"}, masks={"entries": "folders"})
    touch(tmp_path / "elsewhere/case_1/IM0001")
    os.symlink(tmp_path / "elsewhere/case_1", tmp_path / "raw/ct/case_1")
    touch(tmp_path / "raw/masks/case_1/slice_000.png")
    found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == ["case_1"]


def test_a_folder_entry_is_stamped_by_its_files_so_a_resume_sees_a_changed_slice(
    tmp_path: Path,
) -> None:
    spec = folder_spec(tmp_path, ct={"entries": "folders"}, masks={"entries": "folders"})
    touch(tmp_path / "raw/ct/case_1/IM0001", b"one")
    touch(tmp_path / "raw/masks/case_1/slice_000.png", b"two")
    samples = discover.find_samples(spec).samples
    before = admit.plan(spec, samples, headers=False)
    assert before.rejects == []
    touch(tmp_path / "raw/ct/case_1/IM0002", b"three")
    after = admit.plan(spec, samples, headers=False)
    assert after.rejects == []
    assert after.fingerprint() != before.fingerprint()


def test_compound_suffix_comes_off_whole() -> None:
    assert discover.key_of("a/case_7.nii.gz") == "a/case_7"
    assert discover.key_of("case_7.NII.GZ") == "case_7"
    assert discover.key_of(".nii.gz") == ".nii"  # no stem: as any other name
    assert discover.key_of("case_7.nii") == "case_7"
    assert discover.key_of("case.7", folder=True) == "case.7"


names = st.text(alphabet="abc01_-", min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(
    cases=st.sets(names, max_size=6),
    masks=st.sets(names, max_size=6),
    stray=st.sets(names, max_size=2),
)
def test_every_case_folder_lands_in_one_sample_or_one_reject(
    cases: set[str], masks: set[str], stray: set[str]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        spec = folder_spec(root, ct={"entries": "folders"}, masks={"glob": "*.nii"})
        for case in cases:
            touch(root / "raw/ct" / case / "IM0001")
        for name in stray - cases:
            touch(root / "raw/ct" / name)
        for case in masks:
            touch(root / "raw/masks" / f"{case}.nii")
        found = discover.find_samples(spec)
    assert [s.key for s in found.samples] == sorted(cases & masks)
    placed = [f.path for s in found.samples for f in s.files] + [r.path for r in found.rejects]
    entries = [str(root / "raw/ct" / c) for c in cases | (stray - cases)]
    entries += [str(root / "raw/masks" / f"{m}.nii") for m in masks]
    assert sorted(placed) == sorted(entries)
