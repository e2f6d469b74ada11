"""DICOM pixels taken straight from a file's bytes, exact rescaling in the stored dtype, and the
decode window sized by its results: each against pydicom, numpy or a count made here.

The expectations are pydicom's own ``pixel_array`` of the same files and numpy arithmetic in
int64/float64, never the product's decoding.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import h5py
import numpy as np
import pydicom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import (
    UID,
    CTImageStorage,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
    RLELossless,
    generate_uid,
)

from h5etl.config.load import load_spec
from h5etl.dataflow import BatchResult, DecodeTask, EncodedChunk, EncodedRows, Sample
from h5etl.decode import worker_memory
from h5etl.errors import RejectError
from h5etl.examples.volumes import write_dicom_series
from h5etl.execute import inflight, schedule
from h5etl.inputs.volumes import open_case
from h5etl.inputs.volumes.case import cast_exact, rescaled, rescaled_exact
from h5etl.kinds.base import SampleContext
from h5etl.kinds.volume import VolumeKind
from h5etl.plan.kind_registry import kinds_of
from h5etl.sink.array_writer import ArrayWriter, DatasetStats

# (Bits Allocated, Bits Stored, Pixel Representation)
STORAGES = [(8, 8, 0), (8, 7, 1), (16, 16, 0), (16, 12, 0), (16, 12, 1), (16, 16, 1), (32, 20, 1)]


def write_slice(
    path: Path,
    pixels: np.ndarray,
    *,
    z: float,
    bits: tuple[int, int, int] = (16, 16, 1),
    syntax: str = ExplicitVRLittleEndian,
) -> None:
    """One CT slice whose Pixel Data holds exactly ``pixels``' bytes (unused high bits and all)."""
    allocated, stored, signed = bits
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = UID(ExplicitVRLittleEndian if syntax == RLELossless else syntax)
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CTImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.SeriesInstanceUID = "1.2.3"
    ds.Modality = "CT"
    ds.Rows, ds.Columns = pixels.shape
    ds.PixelSpacing = [0.8, 0.8]
    ds.SliceThickness = 2.0
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.ImagePositionPatient = [0.0, 0.0, z]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = allocated, stored, stored - 1
    ds.PixelRepresentation = signed
    ds.RescaleSlope, ds.RescaleIntercept = 1, 0
    big = syntax == ExplicitVRBigEndian
    ds.PixelData = pixels.astype(pixels.dtype.newbyteorder(">" if big else "<")).tobytes()
    if syntax == RLELossless:
        ds.compress(RLELossless, encoding_plugin="pydicom")
    ds.save_as(path, enforce_file_format=True)


def raw_pixels(
    rng: np.random.Generator, bits: tuple[int, int, int], shape: tuple[int, int]
) -> np.ndarray:
    """Random stored values, garbage in the bits above Bits Stored included."""
    allocated, _, signed = bits
    dtype = np.dtype(f"{'i' if signed else 'u'}{allocated // 8}")
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


@pytest.mark.parametrize("bits", STORAGES)
@pytest.mark.parametrize("syntax", [ExplicitVRLittleEndian, ImplicitVRLittleEndian])
def test_native_pixels_are_pydicoms(
    tmp_path: Path, bits: tuple[int, int, int], syntax: str
) -> None:
    rng = np.random.default_rng(sum(bits))
    folder = tmp_path / "s"
    folder.mkdir()
    for k in range(3):
        write_slice(folder / f"{k}.dcm", raw_pixels(rng, bits, (6, 5)), z=2.0 * k, bits=bits,
                    syntax=syntax)  # fmt: skip
    case = open_case(str(folder))
    assert all(s.pixels is not None for s in case._slices)  # type: ignore[attr-defined]
    expected = [pydicom.dcmread(folder / f"{k}.dcm").pixel_array for k in range(3)]
    slabs = list(case.raw_slabs())
    for slab, want in zip(slabs, expected, strict=True):
        assert slab.raw.dtype == want.dtype
        assert np.array_equal(slab.raw[0], want)


@pytest.mark.parametrize("syntax", [RLELossless, ExplicitVRBigEndian])
def test_other_transfer_syntaxes_are_decoded_by_pydicom(tmp_path: Path, syntax: str) -> None:
    rng = np.random.default_rng(5)
    folder = tmp_path / "s"
    folder.mkdir()
    planes = [raw_pixels(rng, (16, 16, 1), (6, 5)) for _ in range(2)]
    for k, plane in enumerate(planes):
        write_slice(folder / f"{k}.dcm", plane, z=2.0 * k, syntax=syntax)
    case = open_case(str(folder))
    assert all(s.pixels is None for s in case._slices)  # type: ignore[attr-defined]
    assert np.array_equal(case.read("int16"), np.stack(planes))


def test_a_file_changed_after_its_header_was_read_is_read_by_pydicom(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    folder = tmp_path / "s"
    folder.mkdir()
    planes = [raw_pixels(rng, (16, 16, 1), (6, 5)) for _ in range(2)]
    for k, plane in enumerate(planes):
        write_slice(folder / f"{k}.dcm", plane, z=2.0 * k)
    case = open_case(str(folder))
    ds = pydicom.dcmread(folder / "1.dcm")  # a longer header: the pixels move
    ds.PatientName = "x" * 40
    ds.save_as(folder / "1.dcm")
    assert np.array_equal(case.read("int16"), np.stack(planes))


def test_pixels_shorter_than_their_header_says_are_a_reject_naming_the_file(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(7)
    folder = tmp_path / "s"
    folder.mkdir()
    for k in range(2):
        write_slice(folder / f"{k}.dcm", raw_pixels(rng, (16, 16, 1), (6, 5)), z=2.0 * k)
    case = open_case(str(folder))
    data = (folder / "1.dcm").read_bytes()
    (folder / "1.dcm").write_bytes(data[:-10])  # cut inside the pixels
    with pytest.raises(RejectError) as caught:
        case.read("int16")
    assert os.fspath(caught.value.path or "").endswith("1.dcm")


@settings(max_examples=150, deadline=None)
@given(
    raw=hnp.arrays(
        st.sampled_from([np.uint8, np.uint16, np.int16, np.int32]),
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)),
    ),
    slope=st.sampled_from([1, 2, -1, 3, 0.5, 1.5]),
    intercept=st.sampled_from([0, -1024, 1024, 7, 70000, -0.5]),
    dtype=st.sampled_from(["uint8", "uint16", "int16", "int32", "float32"]),
)
def test_rescaling_into_the_stored_dtype_is_exact_or_a_lossy_conversion_reject(
    raw: np.ndarray, slope: float, intercept: float, dtype: str
) -> None:
    exact = raw.astype(np.float64) * slope + intercept  # exact: |values| < 2**53
    info = np.iinfo(dtype) if dtype != "float32" else None
    integral = bool(np.array_equal(exact, np.rint(exact)))
    fits = info is None or (integral and info.min <= exact.min() and exact.max() <= info.max)
    if fits:
        got = rescaled_exact(raw, slope, intercept, dtype, where="x")
        assert got.dtype == np.dtype(dtype)
        assert np.array_equal(got.astype(np.float64), exact.astype(dtype).astype(np.float64))
        assert np.array_equal(got, cast_exact(rescaled(raw, slope, intercept), dtype, where="x"))
    else:
        with pytest.raises(RejectError) as caught:
            rescaled_exact(raw, slope, intercept, dtype, where="x")
        assert caught.value.reason == "lossy_conversion"


def _result(nbytes: int) -> BatchResult:
    result = BatchResult(DecodeTask("train", 0, (), 1, 1), 1)
    chunk = EncodedChunk((0, 0, 0), 0, b"x" * nbytes, "")
    result.columns["ct"] = EncodedRows([[chunk]], [b""])
    return result


def test_the_window_follows_the_size_of_the_results() -> None:
    window = inflight.InFlightLimit(2, 256 * 2**20)  # an estimate of 256 MiB a task
    assert window.limit() == 2
    window.noted(_result(45 * 2**20))  # cases came to 45 MiB compressed
    assert window.limit() == 5  # 2 * jobs + 1: every worker busy, a result waiting for each
    window.noted(_result(200 * 2**20))
    assert window.limit() == 2  # as the estimate allowed: results only widen the window
    images = inflight.InFlightLimit(3, 64 * 2**20)
    assert images.limit() == 7
    images.noted(_result(60 * 2**20))  # barely compressed: 2 x 60 MiB would allow only 4
    assert images.limit() == 7  # images keep the window they had


def test_in_order_never_has_more_in_flight_than_its_limit_says() -> None:
    limits = iter([3, 3, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2])
    current = {"limit": 3, "in_flight": 0, "most": 0}
    lock = threading.Lock()

    def limit() -> int:
        current["limit"] = next(limits, 2)
        return current["limit"]

    def submit(item: int) -> Future[int]:
        with lock:
            current["in_flight"] += 1
            current["most"] = max(current["most"], current["in_flight"])
        future: Future[int] = Future()
        future.set_result(item)
        return future

    def result(item: int, future: Future[int]) -> int:
        current["in_flight"] -= 1
        return future.result()

    def items() -> Iterator[int]:
        for item in range(10):
            # when the next is submitted, no more than the last limit asked are in flight
            assert current["in_flight"] < max(current["limit"], 1) + 1
            yield item

    assert list(schedule.in_order(items(), submit, result, limit)) == list(range(10))
    assert current["most"] <= 3


def test_the_writer_lets_go_of_a_case_as_it_stores_it(tmp_path: Path) -> None:
    volume = np.arange(3 * 8 * 8, dtype=np.int16).reshape(3, 8, 8) - 100
    write_dicom_series(tmp_path / "raw" / "ct" / "a", volume)
    (tmp_path / "c.yaml").write_text(
        "name: v\npipeline: volumes\noutput: out\nsplits: {train: 1.0}\n"
        "sources:\n  ct: {dir: raw/ct, entries: folders}\n"
        "fields:\n  ct: {slice_shape: [8, 8]}\n"
    )
    kind = next(k for k in kinds_of(load_spec(tmp_path / "c.yaml")) if k.name == "ct")
    assert isinstance(kind, VolumeKind)
    sample = Sample("a", ("a",), (("ct", str(tmp_path / "raw" / "ct")),))
    folder = str(tmp_path / "raw" / "ct" / "a")
    encoded = kind.decode(SampleContext(sample, [b""], {}, (folder,)))["ct"].encoded
    with h5py.File(tmp_path / "x.h5", "w") as handle:
        dataset = handle.create_dataset(
            "v", (0, 8, 8), maxshape=(None, 8, 8), chunks=kind.layout.chunks, dtype="int16",
            **kind.layout.filter_kwargs(),
        )  # fmt: skip
        writer = ArrayWriter(dataset, kind.layout, DatasetStats("v"))
        writer.add_encoded(encoded.blocks, encoded.digests, 3, release=True)
        assert all(block == [] for block in encoded.blocks)  # nothing of the case is held
        assert np.array_equal(dataset[...], volume)


def test_results_arrive_with_rarer_young_collections_then_the_thresholds_come_back() -> None:
    import gc

    before = gc.get_threshold()
    with worker_memory.collecting_less():
        during = gc.get_threshold()
    assert during == (worker_memory.YOUNG_COLLECTION_EVERY, *before[1:])
    assert gc.get_threshold() == before


def test_big_results_are_sent_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_memory, "send_lock_path", lambda parent: str(tmp_path / "send.lock"))
    first = _result(worker_memory.BIG_RESULT + 1)
    worker_memory.send_one_at_a_time(first)  # its turn, until it is gone (sent)
    worker_memory.send_one_at_a_time(_result(1000))  # a small one never waits
    second = _result(worker_memory.BIG_RESULT + 1)
    waited = threading.Event()

    def send_second() -> None:
        worker_memory.send_one_at_a_time(second)
        waited.set()

    thread = threading.Thread(target=send_second)
    thread.start()
    assert not waited.wait(0.3)  # the second waits while the first is held
    del first
    assert waited.wait(5)  # and goes once the first is freed
    thread.join()


def test_a_result_that_widens_the_window_sends_more_work_before_it_is_written() -> None:
    # the first CT case widened a window of 2 to 5 only once the writer had stored it: both
    # workers idled meanwhile
    events: list[str] = []
    collected = {"count": 0}

    def limit() -> int:
        return 5 if collected["count"] else 2

    def submit(item: int) -> Future[int]:
        in_flight = sum(e.startswith("submit") for e in events) - sum(
            e.startswith("write") for e in events
        )
        assert in_flight < limit()  # collected but unwritten results count as in flight
        events.append(f"submit {item}")
        future: Future[int] = Future()
        future.set_result(item)
        return future

    def result(item: int, future: Future[int]) -> int:
        collected["count"] += 1
        return future.result()

    written = []
    for item in schedule.in_order(range(8), submit, result, limit):
        events.append(f"write {item}")
        written.append(item)
    assert written == list(range(8))
    assert events[: events.index("write 0")] == [f"submit {i}" for i in range(5)]
