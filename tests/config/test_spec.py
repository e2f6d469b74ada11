"""spec: recipe defaults, path resolution, per-field overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import pytest
import yaml
from conftest import MakeRaw, WriteConfig, base_config

from h5etl.config.fields import ImageField, MaskField
from h5etl.config.load import load_spec
from h5etl.config.sections import Compression
from h5etl.config.spec import spec_sha256, spec_text
from h5etl.errors import ConfigError
from h5etl.sink import writer as sink


@pytest.fixture
def raw_root(tmp_path: Path, make_raw: MakeRaw) -> Path:
    make_raw(tmp_path, n=1)
    return tmp_path


def test_recipe_defaults_fill_what_the_config_leaves_out(raw_root: Path) -> None:
    config = raw_root / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "cells",
                "sources": {"image": {"dir": "raw/images"}, "mask": {"dir": "raw/masks"}},
                "fields": {"image": {"shape": [3, 8, 8]}, "mask": {"shape": [1, 8, 8]}},
            }
        ),
        encoding="utf-8",
    )
    spec = load_spec(config)
    assert spec.pipeline == "segmentation"
    image, mask = spec.fields["image"], spec.fields["mask"]
    assert isinstance(image, ImageField)
    assert image.mode == "RGB"
    assert isinstance(mask, MaskField)
    assert mask.values == (0, 1)
    assert spec.fields["filename"].kind == "text"
    assert spec.source_of("filename") == "image"
    assert spec.splits == {"train": 0.8, "valid": 0.2}
    # the default codec, chosen by measurement (tests/benchmarks/codec_bench.py)
    assert (spec.storage.compression.codec, spec.storage.compression.cname) == ("blosc", "lz4")
    assert spec.image_fields == ["image", "mask"]
    assert spec.text_fields == ["filename"]


def test_config_splits_replace_the_recipe_splits(raw_root: Path, write_config: WriteConfig) -> None:
    # splits: {train: 1.0} was merged with the recipe's {train: 0.8, valid: 0.2} -> "got 1.2"
    config = write_config(raw_root, splits={"train": 1.0})
    assert load_spec(config).splits == {"train": 1.0}
    data = base_config()
    data.pop("splits")
    data.pop("pipeline")
    data["splits"] = {"all": 1.0}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_spec(config).splits == {"all": 1.0}


def test_own_field_names_do_not_inherit_the_recipe_fields(raw_root: Path) -> None:
    # fields {img, lbl} got the recipe's image/mask merged in: "fields.image: needs a shape"
    config = raw_root / "config.yaml"
    data = {
        "name": "own",
        "sources": {"img": {"dir": "raw/images"}, "lbl": {"dir": "raw/masks"}},
        "fields": {
            "img": {"shape": [3, 8, 8], "mode": "RGB"},
            "lbl": {"shape": [1, 8, 8], "mode": "L", "values": [0, 1]},
        },
    }
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    spec = load_spec(config)
    # the recipe's file-name field comes along: a text field reads the first source
    assert sorted(spec.fields) == ["filename", "img", "lbl"]
    assert spec.source_of("filename") == "img"


def test_paths_resolve_relative_to_the_config(
    raw_root: Path, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(raw_root)
    monkeypatch.chdir(raw_root.parent)
    spec = load_spec(Path(raw_root.name) / config.name)
    assert spec.output == raw_root / "releases"
    assert spec.sources["image"].dir == raw_root / "raw/images"
    assert spec.output.is_absolute()


def test_storage_and_per_field_overrides(raw_root: Path, write_config: WriteConfig) -> None:
    config = write_config(
        raw_root,
        storage={"chunk_samples": 8, "compression": {"codec": "gzip", "level": 6}},
        fields={
            "image": {"chunks": [2, 3, 24, 24], "shuffle": False},
            "mask": {"compression": "none"},
        },
    )
    spec = load_spec(config)
    assert spec.chunks_of("image") == (2, 3, 24, 24)
    assert spec.chunks_of("mask") == (8, 1, 24, 24)
    assert spec.compression_of("image") == Compression(codec="gzip", level=6)
    assert spec.compression_of("mask").codec == "none"
    assert spec.shuffle_of("image") is False
    assert spec.shuffle_of("mask") is True
    assert spec.batch_samples == 8  # lcm of 2 and 8


def test_batch_samples_is_the_lcm(raw_root: Path, write_config: WriteConfig) -> None:
    config = write_config(raw_root, fields={"image": {"chunks": [6, 3, 24, 24]}})
    assert load_spec(config).batch_samples == 12


@pytest.mark.parametrize(
    ("image_rows", "mask_rows", "batch"),
    [
        pytest.param(32, 31, 992, id="lcm-under-the-limit"),
        pytest.param(1024, 512, 1024, id="at-the-limit"),
        pytest.param(4096, 4096, 4096, id="one-large-chunk-for-all"),
        pytest.param(4096, 64, 4096, id="dividing-the-largest"),
    ],
)
def test_batch_samples_within_the_limit(
    raw_root: Path, write_config: WriteConfig, image_rows: int, mask_rows: int, batch: int
) -> None:
    # fields that agree make a task of one chunk, whatever its size: the user chose it
    fields = {
        "image": {"chunks": [image_rows, 3, 24, 24]},
        "mask": {"chunks": [mask_rows, 1, 24, 24]},
    }
    assert load_spec(write_config(raw_root, fields=fields)).batch_samples == batch


def test_batch_samples_over_the_limit_is_one_clear_line(
    raw_root: Path, write_config: WriteConfig
) -> None:
    # co-prime chunk rows made every decode task (and its memory) as large as the split
    fields = {"image": {"chunks": [4096, 3, 24, 24]}, "mask": {"chunks": [4095, 1, 24, 24]}}
    config = write_config(raw_root, fields=fields)
    with pytest.raises(ConfigError) as caught:
        load_spec(config)
    assert caught.value.problems == [
        f"{config}: fields.image.chunks, fields.mask.chunks: chunk rows image 4096, mask 4095 "
        f"make decode tasks of 16773120 samples (a task holds a whole chunk of every array "
        f"field: their least common multiple); at most 1024 or the largest chunk rows keeps "
        f"memory bounded: use chunk rows that divide one another, e.g. the same for every field"
    ]


def test_storable_attrs_are_kept(raw_root: Path, write_config: WriteConfig) -> None:
    # the limits of what HDF5 stores, just inside them
    attrs = {
        "uint64_max": 2**64 - 1,
        "int64_min": -(2**63),
        "ints": [-(2**63), 2**63 - 1],
        "floats": [1.5, 2.0],
        "none": [],
        "text": "é\tx",
        "y" * 65534: True,
    }
    spec = load_spec(write_config(raw_root, attrs=attrs))
    assert spec.attrs == attrs
    # and HDF5 stores them as they are, with the sink's file settings
    with h5py.File(
        raw_root / "attrs.h5", "w", driver="core", backing_store=False, libver=sink.LIBVER
    ) as handle:
        handle.attrs.update(spec.attrs)
        stored = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in handle.attrs.items()}
    assert stored == attrs


@pytest.mark.parametrize(
    ("compression", "codec", "level"),
    [
        pytest.param("lzf", "lzf", None, id="lzf"),
        pytest.param("gzip", "gzip", 4, id="gzip-default-level"),
        pytest.param({"codec": "gzip", "level": 9}, "gzip", 9, id="gzip-level"),
        pytest.param("none", "none", None, id="none"),
        pytest.param(None, "none", None, id="null"),
        pytest.param(False, "none", None, id="false"),
        pytest.param({"codec": "zstd", "level": 22}, "zstd", 22, id="zstd"),
        pytest.param("blosc", "blosc", 5, id="blosc"),
    ],
)
def test_compression_forms(
    raw_root: Path,
    write_config: WriteConfig,
    compression: Any,
    codec: str,
    level: int | None,
) -> None:
    config = write_config(raw_root)
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["storage"]["compression"] = compression
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    found = load_spec(config).storage.compression
    assert (found.codec, found.effective_level) == (codec, level)


ERRORS = [
    pytest.param({"extra": 1}, "extra: unknown key", id="unknown"),
    pytest.param({"fields": {"image": {"chunk": [1]}}}, "fields.image.chunk: unknown", id="typo"),
    pytest.param(
        {"fields": {"image": {"chunks": [4, 3, 24]}}}, "fields.image.chunks: needs 4", id="rank"
    ),
    pytest.param(
        {"fields": {"image": {"chunks": [4, 3, 25, 24]}}},
        "fields.image.chunks: each axis must fit",
        id="too-big",
    ),
    pytest.param(
        {"fields": {"image": {"dtype": "float77"}}}, "fields.image.dtype: allowed", id="dtype"
    ),
    pytest.param(
        {"fields": {"image": {"dtype": "uint32"}}},
        "fields.image.dtype: allowed dtypes are uint8, uint16, int16, float32",
        id="uint32",
    ),
    pytest.param({"fields": {"image": {"shape": [1, 24, 24]}}}, "needs shape [3", id="channels"),
    # values make it a mask (the rule before kinds): a mask has one channel
    pytest.param({"fields": {"image": {"values": [0, 1]}}}, "mode L", id="values-rgb"),
    pytest.param({"fields": {"mask": {"values": [0, 0]}}}, "distinct", id="values-dup"),
    pytest.param(
        {"fields": {"filename": {"shape": [1]}}}, "a text field takes no shape", id="text"
    ),
    pytest.param(
        {"fields": {"mask": {"source": "labels"}}},
        "fields.mask.source: no source named 'labels'",
        id="source",
    ),
    pytest.param({"fields": {"diagnostics": {"dtype": "str"}}}, "field name", id="reserved"),
    pytest.param({"splits": {"train": 0.5, "valid": 0.2}}, "sum to 1, got 0.7", id="sum"),
    pytest.param({"splits": {"a b": 1.0}}, "split name", id="split-name"),
    pytest.param({"splits": {"train": 0}}, "splits.train", id="split-zero"),
    pytest.param({"storage": {"compression": "brotli"}}, "storage.compression.codec", id="codec"),
    pytest.param(
        {"storage": {"compression": {"codec": "gzip", "level": 10}}}, "0..9, got 10", id="level"
    ),
    pytest.param(
        {"storage": {"compression": {"codec": "lzf", "level": 1}}}, "takes no level", id="lzf-lvl"
    ),
    pytest.param({"storage": {"chunk_samples": -1}}, "storage.chunk_samples", id="chunk-samples"),
    pytest.param({"pad": {"fill": 256}}, "pad.fill", id="fill"),
    pytest.param({"sources": {"image": {"dir": "nowhere"}}}, "sources.image.dir: folder", id="dir"),
    pytest.param(
        {"sources": {"extra": {"dir": "raw"}}},
        "sources.extra: no field reads this source",
        id="src",
    ),
    pytest.param({"seed": "abc"}, "seed", id="seed"),
    # attrs: {version: ...} was silently replaced by the release version
    pytest.param(
        {"attrs": {"version": "v9"}},
        "attrs: names reserved for the attributes h5etl writes itself, pick others: version",
        id="attr",
    ),
    pytest.param({"max_rejects": -1}, "max_rejects", id="max-rejects"),
    # attrs HDF5 cannot store passed validation and failed in Sink.finish, after the decoding
    pytest.param(
        {"attrs": {"big": 2**64}},
        "attrs.big: integers must fit in 64 bits (-9223372036854775808..18446744073709551615), "
        "got 18446744073709551616",
        id="attr-int-too-big",
    ),
    pytest.param({"attrs": {"small": -(2**63) - 1}}, "attrs.small: integers", id="attr-int-low"),
    pytest.param(
        {"attrs": {"ids": [1, 2**63]}},
        "attrs.ids: integers in a list must fit in int64",
        id="attr-list-beyond-int64",
    ),
    pytest.param(
        {"attrs": {"note": "a\0b"}}, "attrs.note: HDF5 text cannot hold a NUL", id="attr-nul"
    ),
    pytest.param(
        {"attrs": {"tags": ["a", "b\0"]}}, "attrs.tags: HDF5 text cannot hold a NUL", id="attr-lnul"
    ),
    pytest.param({"attrs": {"": 1}}, "attrs: attribute names cannot be empty", id="attr-empty"),
    pytest.param(
        {"attrs": {"a\0b": 1}}, "attrs: attribute names cannot hold a NUL", id="attr-name-nul"
    ),
    pytest.param(
        {"attrs": {"x" * 65535: 1}}, "attribute names must be at most 65534 bytes", id="attr-long"
    ),
    pytest.param({"description": "a\0b"}, "description: HDF5 text cannot hold a NUL", id="desc"),
    # chunks 100 and 64 made decode tasks of 1600 samples; co-prime ones, the whole split
    pytest.param(
        {"fields": {"image": {"chunks": [1023, 3, 24, 24]}}},
        "fields.image.chunks, storage.chunk_samples: chunk rows image 1023, mask 4 make decode "
        "tasks of 4092 samples",
        id="batch-lcm-with-storage",
    ),
    pytest.param(
        {"fields": {"image": {"chunks": [100, 3, 24, 24]}, "mask": {"chunks": [64, 1, 24, 24]}}},
        "fields.image.chunks, fields.mask.chunks: chunk rows image 100, mask 64 make decode "
        "tasks of 1600 samples",
        id="batch-lcm",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), ERRORS)
def test_config_errors_name_file_and_key(
    raw_root: Path, write_config: WriteConfig, overrides: dict[str, Any], message: str
) -> None:
    config = write_config(raw_root, **overrides)
    with pytest.raises(ConfigError) as caught:
        load_spec(config)
    error = caught.value
    assert error.exit_code == 2
    assert any(message in line for line in error.problems), error.problems
    assert all(line.startswith(str(config)) for line in error.problems), error.problems
    assert not any("Value error" in line or "pydantic" in line for line in error.problems)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[1, 2]\n", "must be a YAML mapping", id="list"),
        pytest.param("name: [x\n", "not valid YAML at line", id="invalid"),
        pytest.param("1: x\n", "must be a string", id="int-key"),
        pytest.param("", "sources: required key is missing", id="empty"),
        pytest.param("pipeline: 3\n", "pipeline", id="pipeline-type"),
        # libyaml's parser, now used for configs, crashes the process on this (yaml_load)
        pytest.param(
            "name: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply", id="deep"
        ),
    ],
)
def test_unusable_documents(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_spec(config)
    assert message in str(caught.value)
    assert str(config) in str(caught.value)


def test_undecodable_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(config)


def test_spec_is_frozen_and_its_text_round_trips(raw_root: Path, write_config: WriteConfig) -> None:
    spec = load_spec(write_config(raw_root))
    with pytest.raises(ValueError, match="frozen"):
        spec.seed = 3  # type: ignore[misc]
    text = spec_text(spec)
    assert yaml.safe_load(text)["name"] == "cells"
    assert len(spec_sha256(spec)) == 64
    assert spec_sha256(spec) == spec_sha256(load_spec(write_config(raw_root)))


def test_the_config_text_is_each_specs_own(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # spec_text keeps the text of the spec asked last: a copy with another value, asked
    # between two asks of the first, must still get its own text, and the first its own
    make_raw(tmp_path, n=2)
    spec = load_spec(write_config(tmp_path))
    first = spec_text(spec)
    other = spec.model_copy(update={"seed": 5})
    assert yaml.safe_load(spec_text(other))["seed"] == 5
    assert spec_text(spec) == first
    assert yaml.safe_load(first)["seed"] == spec.seed != 5
    assert spec_sha256(spec) == spec_sha256(spec.model_copy())
