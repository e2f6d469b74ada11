"""Config keys in the wrong place say where they belong, in one line, in the config's words.

Top-level ``compression:`` said "unknown key"; ``splits: {..., stratify: label}`` said "Input
should be a valid number"; ``sources: {dir: x}`` printed three lines naming ``SourceSpec``.
An image field without ``mode`` was refused although its shape says it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import base_config, centre_pad, read_release, save
from PIL import Image
from pydantic import BaseModel

from h5etl import build, load_spec
from h5etl.errors import ConfigError


def model_names() -> set[str]:
    """Every pydantic model class of h5etl: words no config error may show."""
    names, todo = set(), [BaseModel]
    while todo:
        for model in todo.pop().__subclasses__():
            todo.append(model)
            if model.__module__.startswith("h5etl"):
                names.add(model.__name__)
    return names


def problems(root: Path, document: dict[str, Any]) -> list[str]:
    """The config error's lines for ``document``, checked for internal class names."""
    (root / "raw" / "images").mkdir(parents=True, exist_ok=True)
    (root / "raw" / "masks").mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_spec(path)
    lines = caught.value.problems
    shown = "\n".join(lines)
    leaked = sorted(name for name in model_names() if re.search(rf"\b{name}\b", shown))
    assert not leaked, shown
    return [line.removeprefix(f"{path}: ") for line in lines]


def _with(**changes: Any) -> dict[str, Any]:
    document = base_config()
    for dotted, value in changes.items():
        node = document
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return document


@pytest.mark.parametrize(
    ("document", "line"),
    [
        pytest.param(
            _with(compression="gzip"),
            "compression: compression belongs under storage: (or under an image or mask or "
            "volume or series field, fields.<name>:), not at the top level",
            id="top-level-compression",
        ),
        pytest.param(
            _with(splits__stratify="label"),
            "splits.stratify: stratify is no split: stratify belongs at the top level, "
            "not under splits:",
            id="stratify-in-splits",
        ),
        pytest.param(
            _with(splits__seed=3),
            "splits.seed: seed is no split: seed belongs at the top level, not under splits:",
            id="seed-in-splits",
        ),
        pytest.param(
            _with(sources={"dir": "raw/images", "glob": "*.png"}),
            "sources.dir, sources.glob: sources maps each source's name to its keys "
            "(sources: {images: {dir: raw/images, glob: '*.png'}}); dir, glob are keys of one "
            "source",
            id="sources-without-names",
        ),
        pytest.param(
            _with(fields={"shape": [3, 24, 24], "dtype": "uint8"}),
            "fields.shape, fields.dtype: fields maps each field's name to its keys (fields: "
            "{image: {shape: [3, 224, 224]}}); shape, dtype are keys of one field",
            id="fields-without-names",
        ),
        pytest.param(
            _with(depth={"shape": [1, 24, 24], "dtype": "uint16"}),
            "depth: a field belongs under fields: (fields: {depth: {...}})",
            id="a-field-outside-fields",
        ),
        pytest.param(
            _with(storage__fill=0),
            "storage.fill: fill belongs under pad: (or under a volume field, fields.<name>:), "
            "not under storage:",
            id="fill-in-storage",
        ),
        pytest.param(
            _with(fields__image__glob="*.png"),
            "fields.image.glob: an image field takes no glob: glob belongs under a source, "
            "sources.<name>:",
            id="glob-in-a-field",
        ),
        pytest.param(
            _with(group_by="(p\\d+)_"),
            "group_by belongs under splits: splits: {..., group_by: ...}",
            id="group-by-at-the-top",
        ),
    ],
)
def test_a_key_in_the_wrong_place_says_where_it_belongs(
    tmp_path: Path, document: dict[str, Any], line: str
) -> None:
    assert problems(tmp_path, document) == [line]


# Where each key belongs, written out here (not read from the models), with a valid value.
HOMES: dict[str, tuple[str | None, Any]] = {
    "seed": (None, 3),
    "on_error": (None, "fail"),
    "stratify": (None, "label"),
    "chunk_samples": ("storage", 8),
    "shuffle": ("storage", False),
    "oversize": ("pad", "crop"),
    "mask_fill": ("pad", 0),
    "scheduler": ("decode", "local"),
}


@pytest.mark.parametrize(
    ("key", "where"),
    [
        (key, where)
        for key in sorted(HOMES)
        for where in (None, "storage", "pad", "decode")
        if where != HOMES[key][0]
    ],
)
def test_every_key_put_elsewhere_names_its_place(
    tmp_path: Path, key: str, where: str | None
) -> None:
    home, value = HOMES[key]
    document = base_config()
    if where is None:
        document[key] = value
    else:
        document.setdefault(where, {})[key] = value
    place = "at the top level" if home is None else f"under {home}:"
    found = problems(tmp_path, document)
    assert len(found) == 1, found
    assert f"{key} belongs {place}" in found[0]


def _build_without_mode(root: Path, channels: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(channels)
    rgb = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)
    mask = (rng.random((10, 12)) < 0.5).astype(np.uint8)
    save(root / "raw" / "images" / "a.png", rgb)
    save(root / "raw" / "masks" / "a.png", mask)
    document = base_config()
    document["splits"] = {"train": 1.0}
    document["fields"]["image"] = {"shape": [channels, 24, 24], "dtype": "uint8"}  # no mode
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(document, sort_keys=False), "utf-8")
    report = build(load_spec(config))
    assert report.path is not None
    return rgb, read_release(report.path)["train/image"]


@pytest.mark.parametrize("channels", [1, 3])
def test_an_image_field_without_mode_takes_it_from_its_shape(tmp_path: Path, channels: int) -> None:
    rgb, stored = _build_without_mode(tmp_path, channels)
    pixels = rgb if channels == 3 else np.asarray(Image.fromarray(rgb).convert("L"))
    assert stored.shape == (1, channels, 24, 24)
    np.testing.assert_array_equal(stored[0], centre_pad(pixels, 24, 24))


def test_an_image_shape_of_other_channels_says_which_it_can_take(tmp_path: Path) -> None:
    document = _with(fields__image={"shape": [4, 24, 24], "dtype": "uint8"})
    assert problems(tmp_path, document) == [
        "fields.image.shape: an image field has 3 channels (mode RGB) or 1 (mode L), "
        "channels first: [3, H, W] or [1, H, W], got [4, 24, 24]"
    ]


@pytest.mark.parametrize(
    ("document", "section", "words"),
    [
        # a key in the wrong place points at the docs of where it belongs
        pytest.param(_with(fill=0), "pad", "under a volume field", id="top-level-fill"),
        pytest.param(
            _with(fields__image__stratify="label"),
            "stratify",
            "stratify belongs at the top level",
            id="stratify-in-a-field",
        ),
        pytest.param(
            _with(sources__image__compression="lzf"),
            "storage",
            "compression belongs under storage:",
            id="compression-in-a-source",
        ),
        # a key of another kind of field is explained with the fields, in plain grammar
        pytest.param(
            _with(fields__image={**base_config()["fields"]["image"], "kind": "image", "fill": 0}),
            "fields",
            "an image field takes no fill (that is a key of volume fields; an image field's",
            id="fill-in-an-image-field",
        ),
        pytest.param(
            _with(fields__image__colour="RGB"),
            "fields",
            "unknown key (an image field's keys:",
            id="unknown-image-key",
        ),
    ],
)
def test_a_misplaced_key_points_at_the_docs_of_its_place(
    tmp_path: Path, document: dict[str, Any], section: str, words: str
) -> None:
    (tmp_path / "raw" / "images").mkdir(parents=True)
    (tmp_path / "raw" / "masks").mkdir(parents=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), "utf-8")
    with pytest.raises(ConfigError) as caught:
        load_spec(path)
    line = str(caught.value)
    assert "\n" not in line, line
    assert words in line
    assert line.endswith(f"(see docs/reference/config.md#{section})"), line
