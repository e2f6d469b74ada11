"""``KindContractTests``: the checklist every field kind passes, on real raw folders and files.

A kind's test module subclasses it and gives a small case::

    class TestImageContract(KindContractTests):
        field = "image"

        def make_raw(self, root: Path) -> Path: ...  # tiny raw folder + config, the config
        def break_input(self, root: Path) -> Broken: ...  # spoil one sample's input
        def expected(self, root: Path) -> Mapping[str, Any]: ...  # sample_key -> value

The suite builds one baseline release per class (``SOURCE_DATE_EPOCH`` set, tasks of two
samples) and checks it against builds made in copies of the pristine raw folder.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np
import pytest

import h5etl
from h5etl.check.health import check_release
from h5etl.history import clock
from h5etl.plan import tasks
from h5etl.readers import Release
from h5etl.testing.kill import KILLED_TASK_SAMPLES, run_killed_build

EPOCH = "1700000000"  # SOURCE_DATE_EPOCH of every build here: files compare byte for byte


@dataclass(frozen=True)
class Broken:
    """One input ``break_input`` spoiled: the sample it belongs to (its ``sample_key``), the
    file the build must reject, and the reason code it must give."""

    key: str
    path: Path
    reason: str


@dataclass(frozen=True)
class Baseline:
    """The class's reference build: the pristine raw folder, the release and its bytes."""

    pristine: Path
    config: str  # the config's file name in the raw folder
    report: h5etl.BuildReport
    path: Path
    data: bytes


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Builds in here stamp ``EPOCH`` and cut tasks as a killed build does, so every build
    of the suite (killed, resumed or not) can be the same file."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(clock.ENV, EPOCH)  # a killed build's subprocess inherits it
        patch.setattr(tasks, "TASK_SAMPLES", KILLED_TASK_SAMPLES)
        yield


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    """A build of ``config`` under ``pinned``; kwargs as ``h5etl.build``."""
    with pinned():
        return h5etl.build(h5etl.load_spec(config), **kwargs)


def sample_keys(path: Path) -> dict[str, list[str]]:
    """Each split's ``sample_key`` column, row by row."""
    with h5py.File(path, "r") as handle:
        return {
            split: handle[split]["sample_key"].asstr()[...].tolist()
            for split in handle
            if split != "diagnostics" and "sample_key" in handle[split]
        }


def datasets(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every dataset of a file: dtype, shape and its values as bytes."""
    out: dict[str, tuple[str, tuple[int, ...], bytes]] = {}

    def visit(name: str, node: object) -> None:
        if isinstance(node, h5py.Dataset):
            values = node[()]
            if node.dtype.hasobject:  # variable-length text (alone or in a record): its values
                data = repr(values.tolist()).encode()
            else:
                data = np.asarray(values).tobytes()
            out[name] = (node.dtype.str, node.shape, data)

    with h5py.File(path, "r") as handle:
        handle.visititems(visit)
    return out


def flip_a_stored_byte(path: Path, dataset: str) -> None:
    """Invert one byte in the middle of ``dataset``'s first stored chunk, in the file itself
    (h5py only finds where it is: the flip goes under HDF5, as a bad disk's would)."""
    with h5py.File(path, "r") as handle:
        node = handle[dataset]
        if node.chunks is None:
            offset, size = node.id.get_offset(), node.id.get_storage_size()
        else:
            info = node.id.get_chunk_info(0)
            offset, size = info.byte_offset, info.size
            if node.id.get_create_plist().get_nfilters() == 0:
                # a raw chunk is stored whole: flip a byte of its rows, not of the room
                # past the last row (which no reader sees)
                rows = min(node.chunks[0], node.shape[0])
                size = min(size, rows * int(np.prod(node.chunks[1:])) * node.dtype.itemsize)
    assert offset is not None, f"{dataset} stores no bytes"
    assert size > 0, f"{dataset} stores no bytes"
    with open(path, "r+b") as handle:
        handle.seek(offset + size // 2)
        byte = handle.read(1)[0]
        handle.seek(offset + size // 2)
        handle.write(bytes([byte ^ 0xFF]))


class KindContractTests:
    """The contract of a field kind; subclass it in the kind's tests and give the case.

    Required: ``field`` (the field under test), ``make_raw``, ``break_input``, ``expected``.
    Optional: ``column`` (the dataset the readers return the value under, default the field),
    ``kill_after`` (samples written before the killed build dies; the case needs more),
    ``assert_value`` (how one read value is compared with its expectation), ``prelude``
    (Python the killed build's subprocess runs first: a kind this process put in place by
    hand, which a fresh interpreter would not find).
    """

    field: ClassVar[str]
    column: ClassVar[str | None] = None
    kill_after: ClassVar[int] = 4
    prelude: ClassVar[str] = ""

    # --- the case: what a kind's test module provides ------------------------------------

    def make_raw(self, root: Path) -> Path:
        """Write a tiny raw folder and its config under ``root``; return the config's path.

        Same files every call (seeded). Relative ``dir``s: the suite builds in copies of
        ``root``. A handful of samples, more than ``kill_after`` + 2."""
        raise NotImplementedError

    def break_input(self, root: Path) -> Broken:
        """Spoil one sample's input in ``root`` (a copy of ``make_raw``'s folder) so the
        build rejects it; say which file, for which sample, with which reason."""
        raise NotImplementedError

    def expected(self, root: Path) -> Mapping[str, Any]:
        """Each stored sample's value of ``column`` by its ``sample_key``, computed from the
        files under ``root`` without h5etl (Pillow, numpy, nibabel...)."""
        raise NotImplementedError

    def assert_value(self, got: Any, want: Any, key: str) -> None:
        """Fail unless a read value equals its expectation (exactly, by default)."""
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=key)

    # --- the suite ------------------------------------------------------------------------

    @property
    def _column(self) -> str:
        return self.column or self.field

    @pytest.fixture(scope="class")
    def baseline(self, tmp_path_factory: pytest.TempPathFactory) -> Baseline:
        """The reference release, built once per class with ``--jobs 1``."""
        pristine = tmp_path_factory.mktemp(type(self).__name__) / "pristine"
        pristine.mkdir()
        config = self.make_raw(pristine)
        root = self._copy(pristine, pristine.parent / "baseline")
        report = build(root / config.name, jobs=1)
        assert report.path is not None, f"{type(self).__name__}: the baseline built no release"
        return Baseline(pristine, config.name, report, report.path, report.path.read_bytes())

    @staticmethod
    def _copy(pristine: Path, root: Path) -> Path:
        shutil.copytree(pristine, root, symlinks=True)
        return root

    def _config(self, baseline: Baseline, root: Path) -> Path:
        """A fresh copy of the pristine raw folder at ``root``; its config."""
        return self._copy(baseline.pristine, root) / baseline.config

    def test_jobs_one_and_two_store_identical_bytes(
        self, baseline: Baseline, tmp_path: Path
    ) -> None:
        two = build(self._config(baseline, tmp_path / "jobs2"), jobs=2)
        assert two.path is not None
        first, second = datasets(baseline.path), datasets(two.path)
        assert first.keys() == second.keys()
        for name, stored in first.items():
            assert stored == second[name], f"{name} differs between --jobs 1 and --jobs 2"
        assert two.path.read_bytes() == baseline.data

    def test_check_deep_passes_and_catches_a_flipped_byte(
        self, baseline: Baseline, tmp_path: Path
    ) -> None:
        report = check_release(baseline.path, deep=True)
        assert report.ok, report.problems
        dataset = self._stored_dataset(baseline.path)
        copy = tmp_path / baseline.path.name
        copy.write_bytes(baseline.data)
        flip_a_stored_byte(copy, dataset)
        broken = check_release(copy, deep=True)
        assert not broken.ok, f"check --deep passed a flipped byte in {dataset}"
        assert any(f"/{dataset}" in problem for problem in broken.problems), broken.problems

    def _stored_dataset(self, path: Path) -> str:
        """The field's column in the first split that stores a row of it."""
        with h5py.File(path, "r") as handle:
            for split, keys in sample_keys(path).items():
                if keys and self._column in handle[split]:
                    return f"{split}/{self._column}"
        raise AssertionError(f"no split of {path} stores {self._column}")

    def test_resume_after_a_kill_is_identical(self, baseline: Baseline, tmp_path: Path) -> None:
        config = self._config(baseline, tmp_path / "killed")
        total = sum(baseline.report.samples.values())
        assert total > self.kill_after, f"the case needs more than {self.kill_after} samples"
        with pinned():
            code = run_killed_build(config, self.kill_after, prelude=self.prelude)
        assert code == -signal.SIGKILL, f"the killed build ended with {code}"
        resumed = build(config, jobs=2, resume=True, checkpoint_seconds=0)
        assert resumed.path is not None
        assert 0 < resumed.resumed < total, "the resumed build reused no checkpoint"
        assert resumed.path.read_bytes() == baseline.data

    def test_a_broken_input_is_rejected_with_its_reason(
        self, baseline: Baseline, tmp_path: Path
    ) -> None:
        config = self._config(baseline, tmp_path / "broken")
        broken = self.break_input(config.parent)
        report = build(config, jobs=1)
        assert report.path is not None
        found = {(Path(r.path), r.reason) for r in report.rejects}
        assert (broken.path, broken.reason) in found, report.rejects
        before = {r.key for r in baseline.report.rejects}  # a case may hold broken inputs
        assert {r.key for r in report.rejects} - before == {broken.key}, report.rejects
        assert report.rejects_path is not None
        lines = report.rejects_path.read_text("utf-8").splitlines()
        written = {(Path(r["path"]), r["reason"]) for r in map(json.loads, lines)}
        assert written == {(Path(r.path), r.reason) for r in report.rejects}
        want = {k: v for k, v in self.expected(baseline.pristine).items() if k != broken.key}
        self._assert_read(report.path, want)  # the rest stored, none dropped

    def test_two_builds_are_byte_identical(self, baseline: Baseline, tmp_path: Path) -> None:
        again = build(self._config(baseline, tmp_path / "again"), jobs=1)
        assert again.path is not None
        assert again.path.read_bytes() == baseline.data

    def test_readers_return_the_field(self, baseline: Baseline) -> None:
        self._assert_read(baseline.path, self.expected(baseline.pristine))

    def _assert_read(self, path: Path, want: Mapping[str, Any]) -> None:
        """Every sample ``Release.read`` returns holds its expected value; none missing."""
        seen: set[str] = set()
        for split, keys in sample_keys(path).items():
            with Release(path, split) as reader:
                values = reader.read(np.arange(len(reader)))[self._column]
            for key, value in zip(keys, values, strict=True):
                assert key in want, f"{split}: sample {key!r} was stored, none expected"
                self.assert_value(value, want[key], key)
            seen.update(keys)
        assert seen == set(want), f"not stored: {sorted(set(want) - seen)}"

    def test_torch_reader_returns_the_field(self, baseline: Baseline) -> None:
        torch = pytest.importorskip("torch")
        from h5etl.readers import H5Dataset

        want = self.expected(baseline.pristine)
        for split, keys in sample_keys(baseline.path).items():
            order = np.random.default_rng(0).permutation(len(keys)).tolist()
            with H5Dataset(baseline.path, split, fields=[self._column]) as dataset:
                loader = torch.utils.data.DataLoader(dataset, batch_size=None, sampler=order)
                for index, sample in zip(order, loader, strict=True):
                    value = sample[self._column]
                    got = value.numpy() if isinstance(value, torch.Tensor) else value
                    self.assert_value(got, want[keys[index]], keys[index])
