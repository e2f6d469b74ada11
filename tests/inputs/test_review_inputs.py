"""Hostile inputs through a whole build: 16-bit masks, FIFOs, decoders that raise odd errors.

Each one used to go wrong only end to end (a stored zero mask, a build that never ended, a
traceback instead of a reject), so each is built through the real pipeline here.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MakeRaw, RawFolder, WriteConfig, centre_pad, read_release, save
from PIL import Image, ImageOps

from h5etl import build, load_spec
from h5etl.history.build_report import BuildReport
from h5etl.inputs import pixels, plainpng


def _build(config: Path) -> BuildReport:
    report = build(load_spec(config), jobs=1)
    assert report.path is not None
    return report


def _rows(report: BuildReport) -> dict[str, dict[str, np.ndarray]]:
    """key -> {field: row} of every stored sample (one split: train)."""
    assert report.path is not None
    data = read_release(report.path)
    names = [str(n).removesuffix(".png") for n in data["train/filename"]]
    return {
        key: {"image": data["train/image"][i], "mask": data["train/mask"][i]}
        for i, key in enumerate(names)
    }


def _report_lines(report: BuildReport) -> dict[str, dict[str, Any]]:
    """Rejects report beside the release, by file path."""
    assert report.rejects_path is not None
    lines = [json.loads(t) for t in report.rejects_path.read_text("utf-8").splitlines()]
    return {line["path"]: line for line in lines}


def _accounted(raw: RawFolder, report: BuildReport) -> None:
    """Invariant 3: every input is stored once or reported once."""
    stored = 2 * sum(report.samples.values())
    assert stored + len(report.rejects) == raw.files
    assert len({r.path for r in report.rejects}) == len(report.rejects)


# --- 16-bit masks ---------------------------------------------------------------------------


def _save_sixteen_bit(path: Path, values: np.ndarray) -> None:
    image = Image.fromarray(values.astype(np.uint16))
    image.save(path, format="PNG")
    with Image.open(path) as reopened:
        assert reopened.mode in pixels.SIXTEEN_BIT_MODES


def test_sixteen_bit_masks_through_a_build(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    # a 16-bit mask that was not exactly {0, 1} went through v >> 8: a 0/255 mask was stored
    # all zeros, and a {0, 1, 2} mask passed as an empty mask instead of a mask_values reject
    raw = make_raw(tmp_path, n=2)
    rng = np.random.default_rng(3)
    labels = (rng.random((9, 11)) < 0.5).astype(np.int64)
    labels[0, 0], labels[-1, -1] = 0, 1
    masks = {
        "m_0_1": labels,
        "m_0_255": labels * 255,
        "m_0_65535": labels * 65535,
        "m_0_1_2": np.where(np.arange(99).reshape(9, 11) == 50, 2, labels),
        "m_0_300": labels * 300,
    }
    for key, values in masks.items():
        save(raw.image(key), rng.integers(0, 256, (9, 11, 3), dtype=np.uint8))
        _save_sixteen_bit(raw.mask(key), values)
        raw.files += 2

    report = _build(write_config(tmp_path, splits={"train": 1.0}))

    rows = _rows(report)
    assert sorted(rows) == sorted([*raw.keys, "m_0_1", "m_0_255", "m_0_65535"])
    for key in ("m_0_1", "m_0_255", "m_0_65535"):
        np.testing.assert_array_equal(rows[key]["mask"], centre_pad(labels, 24, 24), err_msg=key)
    reported = _report_lines(report)
    for key, named in (("m_0_1_2", "got 2"), ("m_0_300", "got 300")):
        mask, image = reported[str(raw.mask(key))], reported[str(raw.image(key))]
        assert (mask["reason"], mask["stage"]) == ("mask_values", "decode")
        assert named in mask["detail"]
        assert image["reason"] == "mask_values"
        assert image["detail"].endswith(f"(in {raw.mask(key)})")
    _accounted(raw, report)


# --- FIFOs ----------------------------------------------------------------------------------


class _Writer:
    """Serves a FIFO from a thread: each open for writing returns once a reader opens it.

    Should the build ever open the FIFO (any number of times), it finds a writer, reads some
    bytes and goes on, and ``opened`` tells: a regression fails the test instead of hanging.
    """

    def __init__(self, fifo: Path):
        self.fifo = fifo
        self.opened = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                with open(self.fifo, "wb") as pipe:
                    self.opened.set()
                    pipe.write(b"not an image")
            except OSError:  # the reader went away first
                pass

    def release(self) -> None:
        """Stop serving: unblock the pending open as a reader would, and wait for the thread."""
        self.done.set()
        reader = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.thread.join()
        finally:
            os.close(reader)


def test_fifo_among_the_inputs_is_a_reject(
    tmp_path: Path, make_raw: MakeRaw, write_config: WriteConfig
) -> None:
    raw = make_raw(tmp_path, n=3)
    os.mkfifo(raw.image("pipe"))
    save(raw.mask("pipe"), np.zeros((6, 6), np.uint8))
    raw.files += 2
    writer = _Writer(raw.image("pipe"))
    try:
        report = _build(write_config(tmp_path))
        opened = writer.opened.is_set()
    finally:
        writer.release()

    assert not opened, "the build opened the FIFO"
    reported = _report_lines(report)
    fifo, partner = reported[str(raw.image("pipe"))], reported[str(raw.mask("pipe"))]
    assert (fifo["reason"], fifo["stage"]) == ("not_a_file", "discover")
    assert "named pipe (FIFO)" in fifo["detail"]
    assert (partner["reason"], partner["stage"]) == ("not_a_file", "discover")
    assert partner["detail"].endswith(f"(in {raw.image('pipe')})")
    assert sum(report.samples.values()) == 3
    _accounted(raw, report)


# --- decoders that raise what Pillow's plugins raise ---------------------------------------

POISON = (13, 11)  # (width, height) of the one file whose decoder fails


def _poison_pillow(monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    """Every file goes through Pillow; the POISON-sized one raises struct.error in ``at``."""
    monkeypatch.setattr(plainpng, "shape_of", lambda *args, **kwargs: None)
    if at == "decode":
        original = ImageOps.exif_transpose

        def transpose(image: Image.Image, **kwargs: Any) -> Any:
            if image.size == POISON:
                raise struct.error("unpack requires a buffer of 4 bytes")
            return original(image, **kwargs)

        monkeypatch.setattr(ImageOps, "exif_transpose", transpose)
    else:
        getexif = Image.Image.getexif

        def exif(image: Image.Image) -> Image.Exif:
            if image.size == POISON:
                raise struct.error("unpack requires a buffer of 4 bytes")
            return getexif(image)

        monkeypatch.setattr(Image.Image, "getexif", exif)


@pytest.mark.parametrize(("at", "stage"), [("probe", "clean"), ("decode", "decode")])
def test_an_odd_decoder_error_rejects_one_sample(
    tmp_path: Path,
    make_raw: MakeRaw,
    write_config: WriteConfig,
    monkeypatch: pytest.MonkeyPatch,
    at: str,
    stage: str,
) -> None:
    # struct.error (or KeyError, ZeroDivisionError...) from a plugin ended the whole build
    raw = make_raw(tmp_path, n=4)
    rng = np.random.default_rng(8)
    save(raw.image("odd"), rng.integers(0, 256, (POISON[1], POISON[0], 3), dtype=np.uint8))
    save(raw.mask("odd"), np.zeros((POISON[1], POISON[0]), np.uint8))
    raw.files += 2
    _poison_pillow(monkeypatch, at)
    config = write_config(tmp_path, splits={"train": 1.0})

    if at == "probe":  # header probes run in dry runs; a build decodes without them
        dry = build(load_spec(config), dry_run=True)
        assert dry.samples == {"train": len(raw.keys)}
        reported = {r.path: r.as_json() for r in dry.rejects}
    else:
        report = _build(config)
        assert sorted(_rows(report)) == raw.keys
        reported = _report_lines(report)
    image = reported[str(raw.image("odd"))]
    assert (image["reason"], image["stage"]) == ("decode_error", stage)
    assert image["detail"] == "cannot decode: struct.error: unpack requires a buffer of 4 bytes"
    assert reported[str(raw.mask("odd"))]["reason"] == "decode_error"
    if at == "decode":
        _accounted(raw, report)
