"""The design's rules that imports cannot express (``lint-imports`` checks the rest).

Only the sink writes HDF5: ``h5py`` is imported where releases are read too (check, readers,
history), and an import cannot tell a read from a write, so this scans every module for an
``h5py.File(...)`` opened in a mode other than "r" and allows it only under ``h5etl/sink/``
(and for an in-memory file that never reaches the disk: ``backing_store=False``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "h5etl"


def _mode(call: ast.Call) -> str | None:
    """The mode an ``h5py.File`` call opens with (None: not a constant), "r" when left out."""
    node = call.args[1] if len(call.args) > 1 else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            node = keyword.value
    if node is None:
        return "r"  # h5py's default since 3.0
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _in_memory(call: ast.Call) -> bool:
    return any(
        k.arg == "backing_store" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in call.keywords
    )


def hdf5_writes(source: str) -> list[int]:
    """Lines of ``source`` that open an HDF5 file on disk for writing."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if func.attr != "File" or not (
            isinstance(func.value, ast.Name) and func.value.id == "h5py"
        ):
            continue
        if _mode(node) != "r" and not _in_memory(node):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_write_and_passes_a_read() -> None:
    source = (
        "import h5py\n"
        "h5py.File(p, 'r')\n"
        "h5py.File(p)\n"
        "h5py.File(p, mode='a')\n"
        "h5py.File(p, 'w', driver='core', backing_store=False)\n"
        "h5py.File(p, m)\n"
    )
    assert hdf5_writes(source) == [4, 6]


def test_only_the_sink_writes_hdf5() -> None:
    sink = PACKAGE / "sink"
    found = {
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if sink not in path.parents
        for line in hdf5_writes(path.read_text(encoding="utf-8"))
    }
    assert found == set()


ARCHITECTURE = PACKAGE.parent / "docs" / "internals" / "architecture.md"
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def _layers_contract() -> list[str]:
    """The folders of the ``layers`` import contract, top first, siblings in their order."""
    import tomllib

    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    names = [part.strip() for layer in layers for part in layer.replace(":", "|").split("|")]
    return [name.removeprefix("h5etl.") for name in names]


def _pictured_folders() -> list[str]:
    """The folders and root modules the architecture page's tree draws, top first."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    tree = text.split("## How it is built", 1)[1].split("```", 2)[1]
    names: list[str] = []
    for line in tree.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            first = line.split()[0]
            if first.endswith("/"):
                names.append(first.removesuffix("/"))
            elif first.endswith(".py"):  # the root modules' line
                names.extend(w.removesuffix(".py") for w in line.split() if w.endswith(".py"))
    return names


def test_the_architecture_page_draws_the_layers_the_import_contract_enforces() -> None:
    # the picture drifted from pyproject's contract once already: a newcomer reads the picture
    pictured = _pictured_folders()
    enforced = [name for name in _layers_contract() if name != "_version"]
    assert pictured == enforced


def test_every_package_folder_is_in_the_layers_contract() -> None:
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders <= set(_layers_contract())
