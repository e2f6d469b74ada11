"""A field kind from another package, end to end: the kind registry's ``h5etl.kinds``
entry-point group.

The plugin ``tests/kinds/plugin`` (distribution ``h5etl-filesize``: each sample's file size and
first bytes) is really installed once per session with pip into a folder of its own, then
configs using its kind run through the CLI in subprocesses whose PYTHONPATH holds that folder
(this process never sees the plugin), and so does the plugin's own test run (``plugin/tests``:
the kind contract suite, in a pytest of its own, as the plugin's CI would run it). A second,
broken plugin (its module fails to import, and it claims the built-in name ``image``) must not
stop configs that do not name it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import h5py
import numpy as np
import pytest

from h5etl.format.contract import read_layout
from h5etl.format.reader_hints import HINTS_KEY, ReaderHints, hints_of
from h5etl.readers import iter_batches
from h5etl.readers._fields import keras_fields
from h5etl.testing import KindContractTests

PLUGIN = Path(__file__).parent / "plugin"
HEAD = 4  # h5etl_filesize.kind.HEAD
MAX_BYTES = 300  # CONFIG's max_bytes: a larger file is rejected (too_large)

CONFIG = """\
name: sizes
output: releases
sources:
  files: {dir: raw, glob: "*.bin"}
splits: {train: 0.75, valid: 0.25}
storage: {chunk_samples: 2}
fields:
  size: {kind: filesize, max_bytes: 300}
max_rejects: null  # big.bin is rejected on purpose
"""

BROKEN = {
    "pyproject.toml": """\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "h5etl-broken"
        version = "0.2.0"

        [project.entry-points."h5etl.kinds"]
        broken = "h5etl_broken.entry:ENTRY"
        image = "h5etl_broken.entry:ENTRY"

        [tool.setuptools]
        packages = ["h5etl_broken"]
        """,
    "h5etl_broken/__init__.py": "",
    "h5etl_broken/entry.py": "import h5etl_missing_dependency  # noqa: F401\n",
}


def make_files(root: Path, sizes: Sequence[int] = (0, 1, 3, 4, 5, 40, 77, 120, 299)) -> None:
    """``root/raw/*.bin`` of the given sizes (seeded bytes) and ``big.bin`` over MAX_BYTES,
    with the config beside them: a raw folder for the ``filesize`` kind."""
    rng = np.random.default_rng(7)
    (root / "raw").mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        (root / "raw" / f"f{i:02d}.bin").write_bytes(rng.bytes(size))
    (root / "raw" / "big.bin").write_bytes(rng.bytes(MAX_BYTES + 1))
    (root / "config.yaml").write_text(CONFIG, "utf-8")


def install_plugins(target: Path, work: Path) -> None:
    """pip-install the filesize plugin and the broken one into ``target`` (offline: the
    build backend is this environment's setuptools); sources are copied so that no build
    files land in tests/."""
    filesize = shutil.copytree(PLUGIN, work / "filesize", ignore=shutil.ignore_patterns("*.pyc"))
    broken = work / "broken"
    for name, text in BROKEN.items():
        (broken / name).parent.mkdir(parents=True, exist_ok=True)
        (broken / name).write_text(textwrap.dedent(text), "utf-8")
    if importlib.util.find_spec("setuptools") is None:  # no build backend offline
        for source in (filesize, broken):
            install_by_hand(target, source)
        return
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    command += ["--no-build-isolation", "--target", str(target), str(filesize), str(broken)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def install_by_hand(target: Path, source: Path) -> None:
    """What pip's install of ``source`` leaves in ``target``: its packages and a
    ``.dist-info`` (METADATA, entry_points.txt, RECORD), for an environment without
    setuptools."""
    project = tomllib.loads((source / "pyproject.toml").read_text("utf-8"))["project"]
    name, version = project["name"], project["version"]
    files: list[Path] = []
    for package in (p for p in source.iterdir() if (p / "__init__.py").is_file()):
        shutil.copytree(package, target / package.name, dirs_exist_ok=True)
        files += sorted((target / package.name).rglob("*.py"))
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", "utf-8"
    )
    points: list[str] = []
    for group, entries in project.get("entry-points", {}).items():
        points += [f"[{group}]", *(f"{k} = {v}" for k, v in entries.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(points), "utf-8")
    files += [info / "METADATA", info / "entry_points.txt"]
    rows = [f"{f.relative_to(target).as_posix()},," for f in files]
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,", ""]), "utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder the two plugins are installed in (once per module: pip takes seconds)."""
    work = tmp_path_factory.mktemp("plugins")
    target = work / "site"
    install_plugins(target, work)
    return target


def h5etl_cli(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "h5etl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env=env,
    )


@pytest.fixture(scope="module")
def built(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release of the plugin's kind, built by two loky workers (a first build decodes in
    workers: they unpickle the plugin's kind)."""
    root = tmp_path_factory.mktemp("sizes")
    make_files(root)
    done = h5etl_cli(site, "build", "config.yaml", "--jobs", "2", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    return root


def test_installed_as_pip_installs_a_distribution(site: Path) -> None:
    (found,) = metadata.distributions(name="h5etl-filesize", path=[str(site)])
    (point,) = found.entry_points.select(group="h5etl.kinds")
    assert (point.name, point.value) == ("filesize", "h5etl_filesize.entry:ENTRY")


def test_the_plugins_behaviour_imports_no_pydantic(site: Path, tmp_path: Path) -> None:
    """What a worker imports to unpickle the kind stays free of pydantic and the config."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    script = (
        "import sys, pickle, h5etl_filesize.kind as k\n"
        "pickle.loads(pickle.dumps(k.FileSizeKind('size', 0)))\n"
        "print(sorted(m for m in sys.modules if m == 'pydantic' or m.startswith('h5etl.config')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, env=env
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_validate_says_which_plugin_a_kind_comes_from(site: Path, built: Path) -> None:
    done = h5etl_cli(site, "validate", "config.yaml", cwd=built)
    assert done.returncode == 0, done.stderr
    assert "size (filesize)" in done.stdout
    assert (
        "note: fields.size: kind filesize comes from plugin h5etl-filesize 0.1.0 (entry point "
        "filesize = h5etl_filesize.entry:ENTRY in h5etl.kinds)"
    ) in done.stdout.splitlines()


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "raw").glob("*.bin"))}


def test_the_build_stores_each_file_size_and_head(built: Path) -> None:
    files = _files(built)
    release = built / "releases" / "sizes.h5"
    seen: list[str] = []
    with h5py.File(release, "r") as handle:
        for split in ("train", "valid"):
            names = [n.decode() for n in handle[f"{split}/filename"][...]]
            sizes = handle[f"{split}/size"][...]
            heads = handle[f"{split}/size_head"][...]
            assert handle[f"{split}/size"].attrs["units"] == "bytes"
            assert heads.shape == (len(names), HEAD)
            for name, size, head in zip(names, sizes, heads, strict=True):
                path = built / "raw" / name
                assert size == os.path.getsize(path)
                expected = np.zeros(HEAD, np.uint8)
                expected[: min(HEAD, size)] = list(files[name][:HEAD])
                np.testing.assert_array_equal(head, expected)
            seen += names
    assert sorted(seen) == sorted(n for n in files if n != "big.bin")
    rejects = (built / "releases" / "sizes-v0001.rejects.jsonl").read_text("utf-8")
    assert "big.bin" in rejects
    assert "too_large" in rejects


def test_the_plugin_kind_passes_the_kind_contract(site: Path, tmp_path: Path) -> None:
    """The plugin's own tests (``tests/kinds/plugin/tests``: ``KindContractTests``, all of
    it, ``check --deep`` and resume after a kill included) pass as its CI runs them: pytest
    in a fresh interpreter that finds the installed plugin. Not in this process: the kind
    registry reads entry points once, when the config is first imported, long before any test
    here could put the plugin on ``sys.path``."""
    source = site.parent / "filesize"  # install_plugins' copy of the plugin's sources
    junit = tmp_path / "contract.xml"
    # a fresh pytest: none of this run's (PYTEST_XDIST_WORKER, under which pytest-benchmark
    # warns, an error with the plugin's filterwarnings; PYTEST_ADDOPTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += [f"--basetemp={tmp_path / 'run'}", f"--junitxml={junit}", str(source / "tests")]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    outcomes = {  # test -> how it did not pass ([]: passed)
        case.get("name", ""): [c.tag for c in case if c.tag in {"failure", "error", "skipped"}]
        for case in ElementTree.parse(junit).iter("testcase")
        if case.get("classname", "").endswith(".TestFileSizeContract")
    }
    contract = sorted(name for name in dir(KindContractTests) if name.startswith("test_"))
    assert sorted(outcomes) == contract  # the whole suite ran, nothing deselected
    torch = importlib.util.find_spec("torch") is not None
    skipped = [] if torch else [["skipped"]]  # its DataLoader test needs torch
    assert sorted(v for v in outcomes.values() if v) == skipped, outcomes


def test_readers_read_the_field_and_its_hints(built: Path) -> None:
    release = built / "releases" / "sizes.h5"
    with h5py.File(release, "r") as handle:
        names = [n.decode() for n in handle["train/filename"][...]]
        fields = read_layout(handle).fields
    record = fields["size"]  # a plugin kind's hints travel in its layout record
    assert record.extra[HINTS_KEY] == ReaderHints(keras="target", keras_rank=5).as_json()
    assert hints_of(record) == ReaderHints(keras="target", keras_rank=5)
    assert keras_fields(fields, "target") == ["size"]  # Keras's default y
    assert keras_fields(fields, "input") == []
    batches = list(iter_batches(release, "train", 2, fields=["size", "size_head"], shuffle=False))
    sizes = np.concatenate([b["size"] for b in batches])
    assert sizes.tolist() == [os.path.getsize(built / "raw" / n) for n in names]
    assert np.concatenate([b["size_head"] for b in batches]).shape == (len(names), HEAD)


def test_preview_draws_through_the_plugins_drawer(site: Path, built: Path) -> None:
    from h5etl.errors import ReaderError
    from h5etl.preview.sheet import render_preview

    with pytest.raises(ReaderError, match="nor a field of a kind that draws"):
        render_preview(built / "releases" / "sizes.h5", split="train")  # no plugin here
    done = h5etl_cli(site, "preview", "releases/sizes.h5", "-o", "sizes.png", cwd=built)
    assert done.returncode == 0, done.stderr
    assert (built / "sizes.png").stat().st_size > 0


def test_a_broken_plugin_stops_only_configs_naming_its_kind(
    site: Path, built: Path, tmp_path: Path
) -> None:
    """The broken plugin's module fails to import and it claims ``image``: a config of
    built-in kinds (and one of the working plugin's) still runs; one naming ``broken`` gets
    one line naming the plugin and the error, exit 2."""
    done = h5etl_cli(site, "validate", "config.yaml", cwd=built)
    assert done.returncode == 0, done.stderr
    assert (
        "note: plugin h5etl-broken 0.2.0 (entry point image = h5etl_broken.entry:ENTRY in "
        "h5etl.kinds) is ignored: kind 'image' is already known"
    ) in done.stdout.splitlines()

    (tmp_path / "raw").mkdir()
    config = CONFIG.replace("{kind: filesize, max_bytes: 300}", "{kind: broken}")
    (tmp_path / "config.yaml").write_text(config, "utf-8")
    done = h5etl_cli(site, "validate", "config.yaml", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert (
        "config.yaml: fields.size.kind: kind 'broken' comes from plugin h5etl-broken 0.2.0 "
        "(entry point broken = h5etl_broken.entry:ENTRY in h5etl.kinds), which failed to "
        "load: ModuleNotFoundError: No module named 'h5etl_missing_dependency'"
    ) in line


# --- the registry's rules, in this process ------------------------------------------------


def _points(*pairs: tuple[str, str]) -> list[metadata.EntryPoint]:
    return [metadata.EntryPoint(name, value, "h5etl.kinds") for name, value in pairs]


def test_a_plugin_entry_is_checked_as_it_loads() -> None:
    from h5etl.config.fields.builtin import BUILTIN_ENTRIES
    from h5etl.config.fields.registry import load_registry

    registry = load_registry(
        BUILTIN_ENTRIES,
        _points(
            ("nothing", "h5etl.errors:H5EtlError"),  # no KindEntry
            ("misnamed", "h5etl.config.fields.builtin:BUILTIN_ENTRIES"),
            ("text", "h5etl_nowhere:ENTRY"),  # a built-in name: set aside, never imported
            ("gone", "h5etl_nowhere:ENTRY"),
        ),
    )
    assert list(registry.entries) == [e.name for e in BUILTIN_ENTRIES]
    assert registry.plugins == {}
    assert sorted(registry.broken) == ["gone", "misnamed", "nothing"]
    assert registry.broken["nothing"].endswith("which names no h5etl.kind_api.KindEntry but type")
    assert "ModuleNotFoundError: No module named 'h5etl_nowhere'" in registry.broken["gone"]
    (ignored,) = registry.ignored
    assert "is ignored: kind 'text' is already known" in ignored


class _Plain:
    pass


@pytest.mark.parametrize(
    ("hook", "members"),
    [
        pytest.param("has no kind name", {}, id="kind"),
        pytest.param("overrides neither column nor columns", {"kind": "x"}, id="column"),
        pytest.param("overrides neither decode", {"kind": "x", "column": 1}, id="decode"),
    ],
)
def test_a_kind_without_a_required_hook_is_refused_when_registered(
    hook: str, members: dict[str, Any]
) -> None:
    from h5etl.config.fields.builtin import _text
    from h5etl.config.fields.values import TextField
    from h5etl.errors import KindDefinitionError
    from h5etl.kind_api import Kind, KindEntry

    forgetful = type("Forgetful", (Kind,), {**members, "__module__": "plugin_x"})
    with pytest.raises(KindDefinitionError, match=rf"^plugin_x\.Forgetful {hook}") as caught:
        KindEntry("x", TextField, forgetful, _text)
    assert "\n" not in str(caught.value)
