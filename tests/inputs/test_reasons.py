"""One damage, one reason: a dry run, ``--dry-run --decode`` and a build name a defect alike.

A JPEG cut at 200 bytes was ``decode_error: Truncated File Read`` (``unreadable`` in a dry
run) while one cut later was ``truncated``; a mask of the wrong size with bad values was
``size_mismatch`` in a dry run and ``mask_values`` in the build.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import WriteConfig, random_pair, save
from PIL import Image

from h5etl import build, load_spec
from h5etl.errors import RejectError
from h5etl.history.build_report import BuildReport
from h5etl.inputs import raster as images
from h5etl.inputs import reasons

REJECTS_PAGE = Path(__file__).parents[2] / "docs" / "reference" / "rejects.md"


def _encoded(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def _cuts(size: int) -> list[int]:
    """Where a file is cut: in its signature, its header, at 200 bytes, mid-pixels, near
    its end (a JPEG without its EOI marker; a PNG without the end of its pixels)."""
    return [4, 30, 200, size // 2, size - 40]


@pytest.fixture(scope="module")
def defects(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str | None]]:
    """A raw folder of good pairs and damaged ones, and key -> the reason each must get
    (from its headers: a plain dry run finds it; None: only decoding finds it)."""
    root = tmp_path_factory.mktemp("reasons")
    rng = np.random.default_rng(12)
    images_dir, masks_dir = root / "raw" / "images", root / "raw" / "masks"
    for i in range(3):
        image, mask = random_pair(rng, (20, 22))
        save(images_dir / f"good{i}.png", image)
        save(masks_dir / f"good{i}.png", mask)
    image, mask = random_pair(rng, (20, 22))
    expected: dict[str, str | None] = {}
    for fmt in ("PNG", "JPEG"):
        data = _encoded(image, fmt)
        for cut in _cuts(len(data)):
            key = f"{fmt.lower()}_cut_at_{cut}"
            (images_dir / f"{key}.png").write_bytes(data[:cut])
            save(masks_dir / f"{key}.png", mask)
            expected[key] = "truncated"
    (images_dir / "text.png").write_text("not an image\n", encoding="utf-8")
    save(masks_dir / "text.png", mask)
    expected["text"] = "unreadable"
    small = random_pair(rng, (10, 12))[1]
    bad_values = mask.copy()
    bad_values[1, 1] = 128
    small_bad = small.copy()
    small_bad[0, 0] = 77
    colour = np.zeros((10, 12, 3), np.uint8)
    colour[2:4, 2:4, 0] = 255
    big_image, big_mask = random_pair(rng, (30, 30))
    big_mask[0, 0] = 128
    pairs = {
        "size_mismatch": (image, small, "size_mismatch"),
        "bad_values": (image, bad_values, None),  # no header shows values
        "size_and_values": (image, small_bad, "size_mismatch"),
        "size_and_colour": (image, colour, "size_mismatch"),
        "oversize_and_values": (big_image, big_mask, "oversize"),
    }
    for key, (pixels, labels, reason) in pairs.items():
        save(images_dir / f"{key}.png", pixels)
        save(masks_dir / f"{key}.png", labels)
        expected[key] = reason
    return root, expected


def _reasons(report: BuildReport) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for reject in report.rejects:
        found.setdefault(reject.key, set()).add(reject.reason)
    return found


def test_every_stage_names_a_defect_alike(
    defects: tuple[Path, dict[str, str | None]], write_config: WriteConfig
) -> None:
    root, expected = defects
    spec = load_spec(write_config(root, splits={"train": 1.0}))
    dry = _reasons(build(spec, dry_run=True))
    decoded = _reasons(build(spec, dry_run=True, decode=True))
    built = build(spec)
    assert built.samples == {"train": 3}
    stored = _reasons(built)
    whole = {key: reason or "mask_values" for key, reason in expected.items()}
    whole["bad_values"] = "mask_values"
    assert decoded == stored == {key: {reason} for key, reason in whole.items()}
    assert dry == {key: {reason} for key, reason in expected.items() if reason is not None}


def test_a_whole_file_is_not_decoded_by_its_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the header probe decodes only a file whose end is not where its format ends
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (20, 22, 3), dtype=np.uint8)

    def never(path: str) -> None:
        raise AssertionError(f"{path} was decoded by its probe")

    monkeypatch.setattr(images, "_decodes_whole", never)
    for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP"):
        path = tmp_path / f"whole.{fmt.lower()}"
        path.write_bytes(_encoded(image if fmt != "GIF" else image[..., 0], fmt))
        assert (images.probe(str(path)).height, images.probe(str(path)).width) == (20, 22)


def _decode_rgb(data: bytes) -> None:
    images.decode(data, "RGB", path="cut.img")


def _outcome(check: Callable[[Any], object], argument: Any) -> str:
    try:
        check(argument)
    except RejectError as exc:
        return exc.reason
    return "ok"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "WEBP"])
def test_a_file_cut_anywhere_is_truncated_to_its_probe_and_its_decoder(
    tmp_path: Path, fmt: str
) -> None:
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (20, 22, 3), dtype=np.uint8)
    data = _encoded(image if fmt != "GIF" else image[..., 0], fmt)
    path = tmp_path / "cut.img"
    for cut in [
        *range(16, len(data) - 40, max(1, len(data) // 40)),
        *range(len(data) - 40, len(data)),
    ]:
        path.write_bytes(data[:cut])
        found = [_outcome(images.probe, str(path)), _outcome(_decode_rgb, data[:cut])]
        # a file missing only its last bytes may hold every pixel (a PNG without IEND): then
        # both read it; a file cut before that is truncated to both
        assert found in (["truncated", "truncated"], ["ok", "ok"]), cut
        assert found == ["truncated"] * 2 or cut >= len(data) - 40, cut


def test_the_reject_reasons_page_shows_the_table_generated_from_the_code() -> None:
    # the table lived in the README, copied by hand; the docs generate it from reasons.TABLE
    text = REJECTS_PAGE.read_text("utf-8")
    assert "<!-- generated: reasons-table -->" in text
    for reason in reasons.TABLE:
        assert f"{{#{reason.code}}}" in text, reason.code  # what to do about it, per reason
