"""The ``mask`` kind end to end: multi-class labels, palette indices, colour tables.

Each test writes a tiny raw folder of PNGs (numpy + Pillow), runs the real build or CLI and
reads the release with h5py. Expected rows and histograms are computed here from the label
arrays the test wrote, never by h5etl's own decode.
"""

from __future__ import annotations

import io
import json
import signal
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from conftest import base_config, merge, save
from PIL import Image
from typer.testing import CliRunner

import h5etl
from h5etl.cli.app import app
from h5etl.config.load import load_spec
from h5etl.plan import tasks
from h5etl.readers import Release
from h5etl.testing import Broken, KindContractTests, run_killed_build

SHAPE = 24
SIZES = ((10, 12), (24, 24), (17, 9), (20, 23), (13, 24), (8, 8))
runner = CliRunner()
Colour = tuple[int, int, int]


# --- raw folders and configs ----------------------------------------------------------------


def palette_png(indices: np.ndarray, colours: list[Colour]) -> bytes:
    """A P-mode PNG whose pixels are ``indices`` into ``colours`` (Pillow writes it)."""
    image = Image.fromarray(indices.astype(np.uint8), mode="P")
    flat = [c for colour in colours for c in colour]
    image.putpalette(flat + [0] * (768 - len(flat)))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = buffer.getvalue()
    with Image.open(io.BytesIO(data)) as reopened:
        assert reopened.mode == "P"
        np.testing.assert_array_equal(np.asarray(reopened), indices)
    return data


def write_pairs(
    root: Path,
    masks: Mapping[str, np.ndarray | bytes],
    *,
    image_sizes: Mapping[str, tuple[int, int]] | None = None,
    seed: int = 0,
) -> None:
    """``raw/images/<key>.png`` (random RGB, the mask's size unless told) and the masks:
    an array is saved by Pillow as it is (L or RGB), bytes are written as given."""
    rng = np.random.default_rng(seed)
    for key, mask in masks.items():
        path = root / "raw" / "masks" / f"{key}.png"
        if isinstance(mask, bytes):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(mask)
            with Image.open(io.BytesIO(mask)) as image:
                size = (image.height, image.width)
        else:
            save(path, mask)
            size = (mask.shape[0], mask.shape[1])
        size = (image_sizes or {}).get(key, size)
        save(root / "raw" / "images" / f"{key}.png", rng.integers(0, 256, (*size, 3), np.uint8))


def centre_pad(labels: np.ndarray, height: int, width: int, fill: int = 0) -> np.ndarray:
    """DESIGN.md's rule, written out here for any dtype: top=(H-h)//2, left=(W-w)//2, (1, H, W)."""
    out = np.full((1, height, width), fill, dtype=labels.dtype)
    top, left = (height - labels.shape[0]) // 2, (width - labels.shape[1]) // 2
    out[0, top : top + labels.shape[0], left : left + labels.shape[1]] = labels
    return out


def label_masks(values: list[int], n: int = 6, seed: int = 1) -> dict[str, np.ndarray]:
    """``n`` uint8 label masks of the SIZES, each holding every value at least once."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        h, w = SIZES[i % len(SIZES)]
        labels = rng.choice(np.array(values, np.uint8), (h, w))
        labels.flat[: len(values)] = values
        out[f"s{i:03d}"] = labels
    return out


COLORS_PLACEHOLDER = "COLORS-GO-HERE"


def write_config(root: Path, mask: Mapping[str, Any], colors_yaml: str = "", **over: Any) -> Path:
    """``root/config.yaml``: conftest's base config with ``fields.mask`` replaced by ``mask``.

    ``colors_yaml`` is put in verbatim as the mask's ``colors:`` value (a flow mapping written
    as a user would, e.g. ``{[128, 64, 128]: 7, [0, 0, 0]: 0}``)."""
    field = dict(mask)
    if colors_yaml:
        field["colors"] = COLORS_PLACEHOLDER
    data = merge(base_config(), over)
    if "splits" in over:
        data["splits"] = over["splits"]  # splits replace, as in conftest's write_config
    data["fields"] = {k: (field if k == "mask" else v) for k, v in data["fields"].items()}
    text = yaml.safe_dump(data, sort_keys=False).replace(COLORS_PLACEHOLDER, colors_yaml)
    path = root / "config.yaml"
    path.write_text(text, "utf-8")
    return path


def build(config: Path, **kwargs: Any) -> h5etl.BuildReport:
    return h5etl.build(load_spec(config), **kwargs)


def invoke(*args: object) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per split: key -> its stored mask row, read with h5py (keys from the filename column)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with h5py.File(path, "r") as handle:
        for split in ("train", "valid"):
            if split not in handle:
                continue
            names = [Path(n.decode()).stem for n in handle[f"{split}/filename"][...]]
            out[split] = dict(zip(names, handle[f"{split}/mask"][...], strict=True))
    return out


def histogram(path: Path, split: str) -> dict[int, int]:
    with h5py.File(path, "r") as handle:
        attrs = handle[f"{split}/mask"].attrs
        if not len(handle[f"{split}/mask"]):
            return {}  # an empty split stores no statistics
        values = np.asarray(attrs["histogram_values"]).tolist()
        counts = np.asarray(attrs["histogram_counts"]).tolist()
    return dict(zip(values, counts, strict=True))


def count(arrays: list[np.ndarray]) -> dict[int, int]:
    """An independent histogram of unpadded label arrays (values present only)."""
    total: Counter[int] = Counter()
    for array in arrays:
        total.update(Counter(array.ravel().tolist()))
    return dict(sorted(total.items()))


def assert_release_holds(
    path: Path, labels: Mapping[str, np.ndarray], *, fill: int = 0, dtype: str = "uint8"
) -> None:
    """Every stored row is its labels centre-padded with ``fill``; each split's histogram
    attrs count exactly its samples' unpadded labels."""
    rows = stored(path)
    assert sorted(k for split in rows.values() for k in split) == sorted(labels)
    for split, by_key in rows.items():
        for key, row in by_key.items():
            assert row.dtype == np.dtype(dtype)
            expected = centre_pad(labels[key], SHAPE, SHAPE, fill).astype(dtype)
            np.testing.assert_array_equal(row, expected, err_msg=key)
        assert histogram(path, split) == count([labels[k] for k in by_key]), split


def mask_field(values: list[int], **extra: Any) -> dict[str, Any]:
    return {"kind": "mask", "shape": [1, SHAPE, SHAPE], "values": values, **extra}


def rejects_of(report: h5etl.BuildReport, key: str) -> list[tuple[str, str, str]]:
    return sorted(
        (Path(r.path).parent.name, r.reason, r.detail) for r in report.rejects if r.key == key
    )


# --- 1. multi-class label masks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "fill"),
    [
        pytest.param([0, 1, 2, 3], 0, id="0-3"),
        pytest.param([0, 1, 2, 3], 3, id="0-3-fill-3"),
        pytest.param([0, 7, 255], 7, id="0-7-255-fill-7"),
    ],
)
def test_label_masks_are_stored_as_labels_with_exact_histograms(
    tmp_path: Path, values: list[int], fill: int
) -> None:
    labels = label_masks(values)
    write_pairs(tmp_path, labels)
    config = write_config(tmp_path, mask_field(values), pad={"mask_fill": fill})

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels, fill=fill)
    with h5py.File(report.path, "r") as handle:
        record = json.loads(handle.attrs["layout"])["fields"]["mask"]
        assert handle["train/mask"].attrs["kind"] == "mask"
    assert (record["kind"], record["values"], record["of"]) == ("mask", values, "image")


def test_uint16_label_masks_keep_their_labels(tmp_path: Path) -> None:
    values = [0, 300, 1000, 65535]
    rng = np.random.default_rng(3)
    labels = {}
    for i, (h, w) in enumerate(SIZES[:4]):
        array = rng.choice(np.array(values, np.uint16), (h, w))
        array.flat[:4] = values
        labels[f"s{i:03d}"] = array
    write_pairs(tmp_path, labels)  # Pillow saves a uint16 array as a 16-bit grey PNG
    config = write_config(tmp_path, mask_field(values, dtype="uint16"))

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels, dtype="uint16")


def test_16_bit_masks_into_an_8_bit_field_are_counted_as_conversions(tmp_path: Path) -> None:
    # 8-bit labels widened to 16 bits (v * 257): stored as the labels, and never silently
    labels = label_masks([0, 7, 255], n=5)
    widened = {k: v.astype(np.uint16) * 257 for k, v in list(labels.items())[:3]}
    # a fourth, rejected after its conversion (its image is another size): not counted
    bad = {"bad": labels["s000"].astype(np.uint16) * 257}
    write_pairs(tmp_path, {**labels, **widened, **bad}, image_sizes={"bad": (3, 3)})
    config = write_config(tmp_path, mask_field([0, 7, 255]))

    code, output = invoke("build", config, "--jobs", "1", "--quiet")

    assert code == 0, output
    assert "rejects: 2 files (size_mismatch 2)" in output, output
    release = next((tmp_path / "releases").glob("cells-v*.h5"))
    assert_release_holds(release, labels)
    with h5py.File(release, "r") as handle:
        counted = json.loads(handle["diagnostics"].attrs["conversions"])
    assert counted == {"mask": {"16_to_8_bits": 3}}
    assert "converted: mask: 3 16-bit inputs scaled to 8 bits" in output, output


def test_uint16_mask_pads_with_a_label_above_255(tmp_path: Path) -> None:
    values = [0, 1000]
    labels = {"s000": np.array([[0, 1000], [1000, 0]], np.uint16)}
    write_pairs(tmp_path, labels)
    config = write_config(
        tmp_path, mask_field(values, dtype="uint16"), pad={"mask_fill": 1000}, splits={"train": 1.0}
    )

    report = build(config, jobs=1)

    assert report.path is not None
    assert_release_holds(report.path, labels, fill=1000, dtype="uint16")


@pytest.mark.parametrize(
    ("values", "stray"),
    [
        pytest.param([0, 1, 2, 3], 4, id="just-above"),
        pytest.param([0, 1, 2, 3], 255, id="255-in-multiclass"),
        pytest.param([0, 7, 255], 8, id="between-labels"),
        pytest.param([0, 7, 255], 1, id="below-a-gap"),
    ],
)
def test_a_value_outside_the_labels_is_a_reject_naming_it(
    tmp_path: Path, values: list[int], stray: int
) -> None:
    labels = label_masks(values, n=4)
    bad = labels["s000"].copy()
    bad[2, 3] = stray
    write_pairs(tmp_path, {**labels, "bad": bad})
    config = write_config(tmp_path, mask_field(values))

    report = build(config, jobs=1)

    found = rejects_of(report, "bad")
    assert [(folder, reason) for folder, reason, _ in found] == [
        ("images", "mask_values"),
        ("masks", "mask_values"),
    ]
    detail = found[1][2]
    assert str(stray) in detail.split("got ", 1)[1], detail
    assert str(values) in detail
    assert "\n" not in detail
    assert report.path is not None
    assert_release_holds(report.path, labels)


def test_mask_fill_must_be_one_of_the_values(tmp_path: Path) -> None:
    write_pairs(tmp_path, label_masks([0, 7, 255], n=2))
    config = write_config(tmp_path, mask_field([0, 7, 255]), pad={"mask_fill": 1})

    code, output = invoke("validate", config)

    assert code == 2
    assert len(output.strip().splitlines()) == 1, output
    assert "pad.mask_fill" in output
    assert "[0, 7, 255]" in output


@pytest.mark.parametrize("policy", ["crop", "resize"])
@pytest.mark.parametrize(
    ("values", "dtype"), [([0, 7, 255], "uint8"), ([0, 300, 65535], "uint16")], ids=["8", "16"]
)
def test_an_oversize_mask_is_cut_or_resized_to_labels_only(
    tmp_path: Path, policy: str, values: list[int], dtype: str
) -> None:
    # 48x48 made of 2x2 blocks of one label: halving it by nearest gives the 24x24 grid back
    # (a smoothing filter would make values between labels)
    rng = np.random.default_rng(6)
    grid = rng.choice(np.array(values, dtype), (SHAPE, SHAPE))
    big = np.kron(grid, np.ones((2, 2), dtype))
    small = rng.choice(np.array(values, dtype), (9, 11))
    write_pairs(tmp_path, {"big": big, "small": small})
    config = write_config(
        tmp_path,
        mask_field(values, dtype=dtype),
        pad={"oversize": policy},
        splits={"train": 1.0},
    )

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    top = (big.shape[0] - SHAPE) // 2
    fitted = grid if policy == "resize" else big[top : top + SHAPE, top : top + SHAPE]
    assert_release_holds(report.path, {"big": fitted, "small": small}, dtype=dtype)


def test_a_mask_without_stats_stores_no_histogram(tmp_path: Path) -> None:
    write_pairs(tmp_path, label_masks([0, 1, 2], n=3))
    config = write_config(tmp_path, mask_field([0, 1, 2], stats=False), splits={"train": 1.0})

    report = build(config, jobs=1)

    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        assert "histogram_values" not in handle["train/mask"].attrs
        assert "histogram_counts" not in handle["train/mask"].attrs


# --- 2. palette masks ----------------------------------------------------------------------

# index 1 is red, 2 green, 3 a grey lighter than any label: none of it may leak into the labels
PALETTE: list[Colour] = [(0, 0, 0), (255, 0, 0), (0, 255, 0), (200, 200, 200)]


def test_palette_masks_store_their_indices(tmp_path: Path) -> None:
    labels = label_masks([0, 1, 2, 3], n=5)
    masks: dict[str, np.ndarray | bytes] = {k: palette_png(v, PALETTE) for k, v in labels.items()}
    write_pairs(tmp_path, masks)
    config = write_config(tmp_path, mask_field([0, 1, 2, 3]))

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels)


def test_a_palette_index_outside_the_values_is_a_reject(tmp_path: Path) -> None:
    labels = label_masks([0, 1, 2], n=3)
    bad = labels["s000"].copy()
    bad[0, 5] = 3  # index 3: grey (200, 200, 200) in the palette, a label not in values
    masks: dict[str, np.ndarray | bytes] = {k: palette_png(v, PALETTE) for k, v in labels.items()}
    write_pairs(tmp_path, {**masks, "bad": palette_png(bad, PALETTE)})
    config = write_config(tmp_path, mask_field([0, 1, 2]))

    report = build(config, jobs=1)

    found = rejects_of(report, "bad")
    assert [reason for _, reason, _ in found] == ["mask_values", "mask_values"]
    assert "got 3" in found[1][2], found
    assert report.path is not None
    assert_release_holds(report.path, labels)


# --- 3. colour-coded masks -----------------------------------------------------------------

ROAD, SKY = (128, 64, 128), (70, 130, 180)
COLOUR_LABELS = {ROAD: 7, (0, 0, 0): 0, SKY: 3}
AS_SEQUENCES = "{[128, 64, 128]: 7, [0, 0, 0]: 0, [70, 130, 180]: 3}"
AS_HEX = "{'#804080': 7, '#000000': 0, '#4682b4': 3}"


def colour_masks(n: int = 5, seed: int = 2) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(RGB masks, their labels): pixels drawn from the colour table's colours."""
    rng = np.random.default_rng(seed)
    colours = np.array(list(COLOUR_LABELS), np.uint8)
    ids = np.array(list(COLOUR_LABELS.values()), np.uint8)
    rgb, labels = {}, {}
    for i in range(n):
        h, w = SIZES[i % len(SIZES)]
        pick = rng.integers(0, len(colours), (h, w))
        pick.flat[:3] = [0, 1, 2]
        rgb[f"s{i:03d}"] = colours[pick]
        labels[f"s{i:03d}"] = ids[pick]
    return rgb, labels


@pytest.mark.parametrize("table", [AS_SEQUENCES, AS_HEX], ids=["sequence-keys", "hex-keys"])
def test_colour_masks_map_through_the_table(tmp_path: Path, table: str) -> None:
    rgb, labels = colour_masks()
    write_pairs(tmp_path, dict(rgb))
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=table)
    assert f"colors: {table}" in config.read_text("utf-8")

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels)
    with h5py.File(report.path, "r") as handle:
        record = json.loads(handle.attrs["layout"])["fields"]["mask"]
    assert sorted(map(tuple, ([tuple(c), v] for c, v in record["colors"]))) == sorted(
        (c, v) for c, v in COLOUR_LABELS.items()
    )


def test_the_first_table_in_the_issue_builds_as_written(tmp_path: Path) -> None:
    rgb = {"s000": np.array([[ROAD, (0, 0, 0)], [(0, 0, 0), ROAD]], np.uint8)}
    write_pairs(tmp_path, dict(rgb))
    config = write_config(
        tmp_path,
        mask_field([0, 7]),
        colors_yaml="{[128, 64, 128]: 7, [0, 0, 0]: 0}",
        splits={"train": 1.0},
    )

    report = build(config, jobs=1)

    assert report.path is not None
    assert_release_holds(report.path, {"s000": np.array([[7, 0], [0, 7]], np.uint8)})


def test_a_palette_mask_with_a_colour_table_maps_through_its_palette(tmp_path: Path) -> None:
    palette: list[Colour] = [(0, 0, 0), ROAD, SKY]  # index 1 -> road (7), 2 -> sky (3)
    indices = label_masks([0, 1, 2], n=4)
    lookup = np.array([0, 7, 3], np.uint8)
    masks: dict[str, np.ndarray | bytes] = {k: palette_png(v, palette) for k, v in indices.items()}
    write_pairs(tmp_path, masks)
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, {k: lookup[v] for k, v in indices.items()})


def test_an_rgba_colour_mask_drops_its_alpha(tmp_path: Path) -> None:
    rgb, labels = colour_masks(n=2)
    alpha = {k: np.dstack([v, np.full(v.shape[:2], 255, np.uint8)]) for k, v in rgb.items()}
    write_pairs(tmp_path, dict(alpha))
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels)


def test_an_unknown_colour_is_a_reject_naming_colour_count_place_and_file(
    tmp_path: Path,
) -> None:
    rgb, labels = colour_masks(n=3)
    bad = rgb["s000"].copy()  # 10x12
    bad[2, 3] = bad[2, 4] = bad[9, 0] = (255, 0, 0)
    write_pairs(tmp_path, {**rgb, "bad": bad})
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)

    code, output = invoke("build", config, "--jobs", "1", "--quiet")

    assert code == 0, output
    bad_path = tmp_path / "raw" / "masks" / "bad.png"
    assert "rejects: 2 files (unknown_color 2)" in output
    with open(next((tmp_path / "releases").glob("*.rejects.jsonl")), encoding="utf-8") as handle:
        reports = [json.loads(line) for line in handle]
    mine = next(r for r in reports if r["path"] == str(bad_path))
    assert mine["reason"] == "unknown_color"
    detail = mine["detail"]
    assert "colour [255, 0, 0] is not in fields.mask.colors" in detail, detail
    assert "3 pixels" in detail, detail
    assert "row 2, col 3" in detail, detail
    assert "\n" not in detail
    other = next(r for r in reports if r["path"] != str(bad_path))
    assert other["reason"] == "unknown_color"
    assert str(bad_path) in other["detail"]
    report_path = next((tmp_path / "releases").glob("cells-v*.h5"))
    assert_release_holds(report_path, labels)


def test_an_unknown_colour_in_a_dry_run_names_the_file(tmp_path: Path) -> None:
    rgb, _ = colour_masks(n=2)
    bad = rgb["s001"].copy()
    bad[1, 1] = (1, 2, 3)
    write_pairs(tmp_path, {**rgb, "bad": bad})
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)

    code, output = invoke("build", config, "--dry-run", "--decode", "--jobs", "1", "--quiet")

    bad_path = tmp_path / "raw" / "masks" / "bad.png"
    line = next(x for x in output.splitlines() if x.startswith(f"reject: {bad_path}:"))
    assert "unknown_color" in line, line
    assert "colour [1, 2, 3]" in line, line
    assert "1 pixel," in line, line
    assert "row 1, col 1" in line
    assert code == 0, output


def test_the_stored_config_reloads_with_hex_colours(tmp_path: Path) -> None:
    rgb, labels = colour_masks(n=3)
    write_pairs(tmp_path, dict(rgb))
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)
    report = build(config, jobs=1)
    assert report.path is not None
    with h5py.File(report.path, "r") as handle:
        text = handle.attrs["config"]
    text = text.decode() if isinstance(text, bytes) else str(text)
    assert "'#804080': 7" in text or '"#804080": 7' in text, text

    again = tmp_path / "again"
    again.mkdir()
    (again / "raw").symlink_to(tmp_path / "raw")
    (again / "config.yaml").write_text(text, "utf-8")
    spec = load_spec(again / "config.yaml")
    reloaded = spec.fields["mask"]
    assert reloaded == load_spec(config).fields["mask"]
    rebuilt = h5etl.build(spec, jobs=1)
    assert rebuilt.path is not None
    assert_release_holds(rebuilt.path, labels)


def test_a_grey_mask_maps_through_a_colour_table_as_grey_colours(tmp_path: Path) -> None:
    grey = {k: (v * 255).astype(np.uint8) for k, v in label_masks([0, 1], n=3).items()}
    write_pairs(tmp_path, dict(grey))
    config = write_config(
        tmp_path, mask_field([0, 1, 2]), colors_yaml="{[0, 0, 0]: 2, [255, 255, 255]: 1}"
    )

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(
        report.path, {k: np.where(v == 255, 1, 2).astype(np.uint8) for k, v in grey.items()}
    )


def test_an_unknown_palette_colour_is_named_by_its_colour(tmp_path: Path) -> None:
    palette: list[Colour] = [(0, 0, 0), ROAD, (9, 9, 9)]
    indices = label_masks([0, 1], n=2)
    bad = indices["s000"].copy()
    bad[4, 6] = 2  # (9, 9, 9): in the palette, not in the table
    masks: dict[str, np.ndarray | bytes] = {k: palette_png(v, palette) for k, v in indices.items()}
    write_pairs(tmp_path, {**masks, "bad": palette_png(bad, palette)})
    config = write_config(tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES)

    report = build(config, jobs=1)

    found = rejects_of(report, "bad")
    assert [r for _, r, _ in found] == ["unknown_color", "unknown_color"]
    assert "colour [9, 9, 9]" in found[1][2], found
    assert "1 pixel, first at row 4, col 6" in found[1][2], found


def test_a_palette_mask_with_transparency_stores_its_indices(tmp_path: Path) -> None:
    labels = label_masks([0, 1, 2], n=3)
    masks: dict[str, np.ndarray | bytes] = {}
    for key, indices in labels.items():
        image = Image.fromarray(indices, mode="P")
        image.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (768 - 9))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", transparency=0)  # index 0 transparent (tRNS)
        masks[key] = buffer.getvalue()
    write_pairs(tmp_path, masks)
    config = write_config(tmp_path, mask_field([0, 1, 2]))

    report = build(config, jobs=1)

    assert report.rejects == []
    assert report.path is not None
    assert_release_holds(report.path, labels)


TWICE = "fieldspecs.MaskField._colour_keys builds a dict: a colour given twice keeps its last label"


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        pytest.param(
            "{'#000000': 0, '0, 0, 0': 1}",
            "[0, 0, 0]",
            id="two-spellings-one-colour",
        ),
        pytest.param(
            "{}",
            "empty",
            id="empty-table",
        ),
    ],
)
def test_a_colour_table_that_cannot_be_meant_is_a_config_error(
    tmp_path: Path, table: str, problem: str
) -> None:
    write_pairs(tmp_path, colour_masks(n=2)[0])
    config = write_config(tmp_path, mask_field([0, 1]), colors_yaml=table)

    code, output = invoke("validate", config)

    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert "fields.mask.colors" in output, output
    assert problem in output.split("fields.mask.colors", 1)[1], output


def test_a_colour_written_twice_in_yaml_is_a_config_error(tmp_path: Path) -> None:
    write_pairs(tmp_path, colour_masks(n=2)[0])
    config = write_config(tmp_path, mask_field([0, 1]), colors_yaml="{[0, 0, 0]: 0, [0, 0, 0]: 1}")

    code, output = invoke("validate", config)

    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert str(config) in output, output
    assert "twice" in output or "duplicate" in output, output


# --- 4. size against the image -------------------------------------------------------------


def test_a_mask_of_another_size_than_its_image_is_a_size_mismatch(tmp_path: Path) -> None:
    labels = label_masks([0, 1, 2, 3], n=4)
    bad = labels["s000"]  # 10x12; its image 12x12
    write_pairs(tmp_path, {**labels, "bad": bad}, image_sizes={"bad": (12, 12)})
    config = write_config(tmp_path, mask_field([0, 1, 2, 3]))

    dry = build(config, jobs=1, dry_run=True)
    real = build(config, jobs=1)

    for report in (dry, real):
        found = rejects_of(report, "bad")
        assert [(f, r) for f, r, _ in found] == [
            ("images", "size_mismatch"),
            ("masks", "size_mismatch"),
        ]
        assert "image 12x12" in found[0][2], found
        assert "mask 10x12" in found[0][2], found
    assert real.path is not None
    assert_release_holds(real.path, labels)


def test_of_names_the_image_whose_size_the_mask_has(tmp_path: Path) -> None:
    # "image" is twice the mask's size; "aux" (named by of:) is the mask's size
    labels = label_masks([0, 1], n=4)
    rng = np.random.default_rng(5)
    for key, array in labels.items():
        h, w = array.shape
        save(tmp_path / "raw" / "masks" / f"{key}.png", array)
        save(tmp_path / "raw" / "aux" / f"{key}.png", rng.integers(0, 256, (h, w), np.uint8))
        save(
            tmp_path / "raw" / "images" / f"{key}.png", rng.integers(0, 256, (12, 12, 3), np.uint8)
        )
    save(tmp_path / "raw" / "masks" / "bad.png", labels["s001"])  # 24x24, aux 10x12
    save(tmp_path / "raw" / "aux" / "bad.png", rng.integers(0, 256, (10, 12), np.uint8))
    save(tmp_path / "raw" / "images" / "bad.png", rng.integers(0, 256, (12, 12, 3), np.uint8))
    aux = {"kind": "image", "shape": [1, SHAPE, SHAPE], "mode": "L"}
    config = write_config(
        tmp_path,
        mask_field([0, 1], of="aux"),
        sources={"aux": {"dir": "raw/aux", "glob": "*.png"}},
        fields={"aux": aux},
    )
    data = yaml.safe_load(config.read_text("utf-8"))
    data["sources"] = {k: data["sources"][k] for k in ("image", "aux", "mask")}
    config.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")

    dry = build(config, jobs=1, dry_run=True)
    real = build(config, jobs=1)

    for report in (dry, real):
        found = rejects_of(report, "bad")
        assert {r for _, r, _ in found} == {"size_mismatch"}, found
        assert "aux 10x12" in found[0][2], found
        assert "mask 24x24" in found[0][2], found
        assert all(r.key == "bad" for r in report.rejects), report.rejects
    assert real.path is not None
    assert_release_holds(real.path, labels)


@pytest.mark.parametrize("target", ["filename", "nowhere", "mask"])
def test_of_must_name_an_image_field(tmp_path: Path, target: str) -> None:
    write_pairs(tmp_path, label_masks([0, 1], n=2))
    config = write_config(tmp_path, mask_field([0, 1], of=target))

    code, output = invoke("validate", config)

    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert "fields.mask.of" in output, output
    assert repr(target) in output, output


# --- 5. determinism, check, resume, readers ------------------------------------------------


def test_check_deep_prints_the_histograms(tmp_path: Path) -> None:
    # --jobs 1 = 2, check --deep passing and resume: TestMaskContract (h5etl.testing)
    rgb, labels = colour_masks(n=9)
    write_pairs(tmp_path, dict(rgb))
    config = write_config(
        tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_HEX, storage={"chunk_samples": 2}
    )

    report = build(config, jobs=2)

    assert report.path is not None
    assert_release_holds(report.path, labels)
    code, output = invoke("check", report.path, "--deep")
    assert code == 0, output
    for split in ("train", "valid"):
        expected = count([labels[k] for k in stored(report.path)[split]])
        shown = ", ".join(f"{v} {n}" for v, n in expected.items())
        assert f"mask histogram (unpadded pixels): {shown}" in output, output


def test_readers_return_the_labels(tmp_path: Path) -> None:
    labels = label_masks([0, 7, 255], n=6)
    write_pairs(tmp_path, labels)
    config = write_config(tmp_path, mask_field([0, 7, 255]), splits={"train": 1.0})
    report = build(config, jobs=1)
    assert report.path is not None
    order = list(stored(report.path)["train"])
    expected = np.stack([centre_pad(labels[k], SHAPE, SHAPE) for k in order])

    with Release(report.path, "train") as reader:
        batch = reader.read_slice(0, len(order))
        stats = reader.stats["mask"]
    np.testing.assert_array_equal(batch["mask"], expected)
    assert batch["mask"].dtype == np.uint8
    values, counts = np.asarray(stats["histogram_values"]), np.asarray(stats["histogram_counts"])
    assert dict(zip(values.tolist(), counts.tolist(), strict=True)) == count(list(labels.values()))

    torch = pytest.importorskip("torch")
    from h5etl.readers import H5Dataset

    dataset = H5Dataset(report.path, "train", batch_size=3)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=dataset.batch_sampler(3, shuffle=False), num_workers=0
    )
    got = np.concatenate([batch["mask"].numpy() for batch in loader])
    dataset.close()
    np.testing.assert_array_equal(got, expected)


def test_resume_after_the_colour_table_changed_decodes_everything_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "TASK_SAMPLES", 2)
    rgb, labels = colour_masks(n=20, seed=8)
    write_pairs(tmp_path, dict(rgb))
    config = write_config(
        tmp_path, mask_field([0, 3, 7]), colors_yaml=AS_SEQUENCES, storage={"chunk_samples": 2}
    )
    assert run_killed_build(config, 10, 1) == -signal.SIGKILL
    swapped = "{[128, 64, 128]: 3, [0, 0, 0]: 0, [70, 130, 180]: 7}"  # road and sky swap labels
    config = write_config(
        tmp_path, mask_field([0, 3, 7]), colors_yaml=swapped, storage={"chunk_samples": 2}
    )

    resumed = build(config, jobs=1, resume=True)

    assert resumed.resumed == 0, "rows mapped by the old table must not be reused"
    assert resumed.path is not None
    swap = np.array([0, 1, 2, 7, 4, 5, 6, 3], np.uint8)
    assert_release_holds(resumed.path, {k: swap[v] for k, v in labels.items()})


def test_flat_layout_with_a_mask_builds_checks_and_reads(tmp_path: Path) -> None:
    labels = label_masks([0, 1, 2, 3], n=6)
    write_pairs(tmp_path, labels)
    data = merge(base_config(), {"layout": "{field}_{split}"})
    data["sources"] = {
        "x": {"dir": "raw/images", "glob": "*.png"},
        "y": {"dir": "raw/masks", "glob": "*.png"},
    }
    data["fields"] = {
        "x": {"kind": "image", "shape": [3, SHAPE, SHAPE], "mode": "RGB"},
        "y": mask_field([0, 1, 2, 3]),
        "name": {"kind": "text", "source": "y"},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")

    report = build(config, jobs=1)

    assert report.path is not None
    code, output = invoke("check", report.path, "--deep")
    assert code == 0, output
    with h5py.File(report.path, "r") as handle:
        assert {"x_train", "y_train", "x_valid", "y_valid"} <= set(handle)
        assert "train" not in handle
        for split in ("train", "valid"):
            keys = [Path(n.decode()).stem for n in handle[f"name_{split}"][...]]
            rows = handle[f"y_{split}"][...]
            for key, row in zip(keys, rows, strict=True):
                np.testing.assert_array_equal(row, centre_pad(labels[key], SHAPE, SHAPE))
            with Release(report.path, split) as reader:
                np.testing.assert_array_equal(reader.read_slice(0, len(keys))["y"], rows)
            assert "y histogram (unpadded pixels): " in output


# --- 6. validate ---------------------------------------------------------------------------


def test_validate_notes_the_inferred_mask_kind(tmp_path: Path) -> None:
    write_pairs(tmp_path, label_masks([0, 1, 2, 3], n=2))
    field = {"shape": [1, SHAPE, SHAPE], "dtype": "uint8", "mode": "L", "values": [0, 1, 2, 3]}
    config = write_config(tmp_path, field)

    code, output = invoke("validate", config)

    assert code == 0, output
    assert "mask (mask)" in output
    notes = [line for line in output.splitlines() if line.startswith("note:")]
    assert any("fields.mask" in n and "kind: mask" in n for n in notes), output
    assert any("fields.image" in n and "kind: image" in n for n in notes), output


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("derive", {"from": "image", "resize": "nearest", "factor": 2}, id="derive"),
        pytest.param("scale", {"of": "image", "factor": 2}, id="scale"),
        pytest.param("from", {"table": "labels.csv", "key": "file", "column": "x"}, id="from"),
        pytest.param("classes", ["a", "b"], id="classes"),
    ],
)
def test_a_key_of_another_kind_on_a_mask_is_one_line_naming_it(
    tmp_path: Path, key: str, value: Any
) -> None:
    write_pairs(tmp_path, label_masks([0, 1], n=2))
    config = write_config(tmp_path, mask_field([0, 1], **{key: value}))

    code, output = invoke("validate", config)

    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert f"fields.mask.{key}" in output
    assert f"a mask field takes no {key}" in output, output


# --- the kind checklist (h5etl.testing) ----------------------------------------------------


class TestMaskContract(KindContractTests):
    """Colour-coded RGB masks mapped through a colour table to labels 0, 3, 7, centre-padded;
    a colour outside the table rejects its sample."""

    field = "mask"

    def make_raw(self, root: Path) -> Path:
        rgb, _ = colour_masks(n=8, seed=7)
        write_pairs(root, dict(rgb))
        return write_config(
            root, mask_field([0, 3, 7]), colors_yaml=AS_HEX, storage={"chunk_samples": 2}
        )

    def break_input(self, root: Path) -> Broken:
        path = root / "raw" / "masks" / "s002.png"
        with Image.open(path) as image:
            pixels = np.asarray(image).copy()
        pixels[1, 1] = (1, 2, 3)
        save(path, pixels)
        return Broken("s002", path, "unknown_color")

    def expected(self, root: Path) -> dict[str, np.ndarray]:
        out = {}
        for png in (root / "raw" / "masks").glob("*.png"):
            with Image.open(png) as image:
                pixels = np.asarray(image.convert("RGB"))
            labels = np.zeros(pixels.shape[:2], np.uint8)
            for colour, label in COLOUR_LABELS.items():
                labels[(pixels == colour).all(axis=2)] = label
            out[png.stem] = centre_pad(labels, SHAPE, SHAPE)
        return out
