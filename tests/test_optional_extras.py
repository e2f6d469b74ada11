"""Optional libraries are found up front (issue 25, item 10): without the medical extra,
``validate``, ``build --dry-run``, ``build`` and ``demo --example ct-volumes`` each refuse a
volume config in one line naming ``pip install 'h5etl[medical]'`` (exit 2), before any work,
and the demo leaves no folder behind. The libraries are made unimportable in a subprocess
(a meta path finder that blocks them, or a None in ``sys.modules``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from h5etl import examples
from h5etl.examples import demo

BLOCKER = """
import runpy, sys
BLOCKED = set(sys.argv.pop(1).split(","))
HOW = sys.argv.pop(1)


class Blocked:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if HOW == "finder":
    sys.meta_path.insert(0, Blocked())
else:
    for name in BLOCKED:
        sys.modules[name] = None
sys.argv[0] = "h5etl"
runpy.run_module("h5etl", run_name="__main__", alter_sys=True)
"""
HINT = "pip install 'h5etl[medical]'"


@pytest.fixture(scope="module")
def ct_volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ct-volumes example laid out (written here, where the libraries are installed)."""
    return examples.prepare(tmp_path_factory.mktemp("ct") / "demo", "ct-volumes")


def without(tmp_path: Path, blocked: str, how: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKER, "utf-8")
    return subprocess.run(
        [sys.executable, str(script), blocked, how, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert HINT in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("how", "command"),
    [
        pytest.param("finder", ["validate"], id="validate"),
        pytest.param("none", ["build", "--dry-run", "-j", "1"], id="dry-run"),
        pytest.param("finder", ["build", "-j", "1"], id="build"),
    ],
)
def test_a_volume_config_without_the_medical_extra_is_refused_in_one_line(
    tmp_path: Path, ct_volumes: Path, how: str, command: list[str]
) -> None:
    line = one_line(without(tmp_path, "pydicom,nibabel", how, *command, str(ct_volumes)))
    assert "fields ct, mask (volume)" in line
    assert "pydicom and nibabel" in line
    assert str(ct_volumes) in line
    assert not (ct_volumes.parent / "releases").exists()  # nothing built, no folder made


def test_one_missing_library_is_named_alone(tmp_path: Path, ct_volumes: Path) -> None:
    line = one_line(without(tmp_path, "nibabel", "finder", "validate", str(ct_volumes)))
    assert "are read with nibabel, not installed here" in line


def test_the_demo_without_the_medical_extra_makes_no_folder(tmp_path: Path) -> None:
    target = tmp_path / "ct-demo"
    done = without(
        tmp_path,
        "pydicom,nibabel",
        "finder",
        "demo",
        "--example",
        "ct-volumes",
        "--dir",
        str(target),
    )
    line = one_line(done)
    assert line.startswith("h5etl: error: example ct-volumes: fields ct, mask (volume)")
    assert "pydicom and nibabel" in line
    assert not target.exists()


def test_a_demo_whose_writer_fails_leaves_no_half_made_folder(tmp_path: Path) -> None:
    # whatever stops an example's writer (a library missing after all, a full disk)
    def broken(raw: Path) -> None:
        (raw / "ct").mkdir(parents=True)
        raise ImportError("No module named 'pydicom'")

    target = tmp_path / "demo"
    shipped = Path(examples.__file__).parent  # any file will do as the shipped config
    with pytest.raises(ImportError):
        demo.lay_out(target, shipped / "registry.py", broken)
    assert not target.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine", "utf-8")
    with pytest.raises(ImportError):
        demo.lay_out(kept, shipped / "registry.py", broken)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # theirs stays, ours goes
