"""Where the shipped pipeline recipes and example configs live, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # h5etl/ (this is h5etl/config/)


def data_dir(kind: str) -> Path:
    """``pipelines`` or ``configs``: inside the wheel, else beside the package in a checkout."""
    installed = _PACKAGE / "_data" / kind
    return installed if installed.is_dir() else _PACKAGE.parent / kind


def recipe_names() -> list[str]:
    return sorted(path.stem for path in data_dir("pipelines").glob("*.yaml"))


def find_recipe(pipeline: str, *, relative_to: Path) -> Path | None:
    """A recipe by name (``segmentation``) or by path relative to the config's folder."""
    if pipeline.endswith((".yaml", ".yml")) or "/" in pipeline:
        candidate = relative_to / pipeline
        return candidate if candidate.is_file() else None
    shipped = data_dir("pipelines") / f"{pipeline}.yaml"
    return shipped if shipped.is_file() else None


def demo_config() -> Path:
    return data_dir("configs") / "demo.yaml"


def example_config(file_name: str) -> Path:
    """A shipped example config by file name, e.g. ``classification.yaml``."""
    return data_dir("configs") / file_name
