"""A sample's transforms run as a worker runs them (issue 28, items 2-4): on real files
(PNG through Pillow, NIfTI through nibabel), per field and per sample, each failure a reject
of its own reason, random draws the same in any process."""

from __future__ import annotations

import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from h5etl.transforms.apply import (
    Expectation,
    FieldChain,
    SampleCall,
    TransformRejected,
    Transforms,
    apply_transforms,
)
from h5etl.transforms.loading import Loader

PREP = """
import numpy as np

def invert(value):
    return 255 - value

def body_crop(sample, *, threshold):
    image, mask = sample["image"], sample["mask"]
    inside = image > threshold
    if inside.ndim > mask.ndim:
        inside = inside.any(axis=-1)
    box = tuple(slice(int(i.min()), int(i.max()) + 1) for i in np.nonzero(inside))
    return {"image": image[box], "mask": mask[box]}

def broken(value):
    return _helper(value)

def _helper(value):
    raise ValueError("no body\\n  found")

def as_float(value):
    return value.astype(np.float64)

def grow(value):
    return np.pad(value, 40)

def relabel(value):
    return value // 255 * 7

def noisy(value, *, scale, rng):
    return (value + rng.normal(0, scale, value.shape)).astype(np.float32)

def only_image(sample):
    return {"image": sample["image"]}

class NoBody(Exception):
    pass

def refuse(value):
    raise NoBody("nothing above the threshold")
"""

BODY = (slice(5, 21), slice(8, 31))  # rows 5..20, columns 8..30 of a 32 x 40 image
IMAGE = Expectation(dtype="uint8", max_shape=(32, 40, 3))
MASK = Expectation(dtype="uint8", max_shape=(32, 40), values=frozenset({0, 255}))


@pytest.fixture
def loader(tmp_path: Path) -> Loader:
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "prep.py").write_text(textwrap.dedent(PREP))
    return Loader(folder)


@pytest.fixture
def sample(tmp_path: Path) -> dict[str, np.ndarray]:
    """An RGB image with a bright body on black and its 0/255 mask, as PNG files, decoded."""
    rng = np.random.default_rng(7)
    image = np.zeros((32, 40, 3), np.uint8)
    image[BODY] = rng.integers(60, 250, (16, 23, 3), dtype=np.uint8)
    mask = np.zeros((32, 40), np.uint8)
    mask[10:15, 12:20] = 255
    Image.fromarray(image).save(tmp_path / "a.png")
    Image.fromarray(mask).save(tmp_path / "a_mask.png")
    return {
        "image": np.asarray(Image.open(tmp_path / "a.png")),
        "mask": np.asarray(Image.open(tmp_path / "a_mask.png")),
    }


def _chain(loader: Loader, field: str, *calls: tuple[str, dict[str, Any]]) -> FieldChain:
    return FieldChain(field, tuple(loader.resolve(c, a) for c, a in calls))


def _expect() -> tuple[tuple[str, Expectation], ...]:
    return (("image", IMAGE), ("mask", MASK))


def test_a_field_chain_runs_in_order_with_builtins(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    chain = _chain(loader, "image", ("prep:invert", {}), ("crop", {"size": [16, 16]}))
    out = apply_transforms(Transforms(0, chains=(chain,), expect=_expect()), "a", sample)
    expected = (255 - sample["image"].astype(np.int64))[8:24, 12:28].astype(np.uint8)
    np.testing.assert_array_equal(out["image"], expected)
    assert out["mask"] is sample["mask"]  # untouched fields pass as they are


def test_a_sample_call_crops_image_and_mask_together(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    crop = SampleCall(loader.resolve("prep:body_crop", {"threshold": 0}), ("image", "mask"))
    given = {name: value.copy() for name, value in sample.items()}
    out = apply_transforms(Transforms(0, sample_calls=(crop,), expect=_expect()), "a", given)
    np.testing.assert_array_equal(out["image"], sample["image"][BODY])
    np.testing.assert_array_equal(out["mask"], sample["mask"][BODY])
    assert out["image"].flags.c_contiguous
    np.testing.assert_array_equal(given["image"], sample["image"])  # the input is not changed


def test_a_sample_call_crops_a_volume_and_its_mask(loader: Loader, tmp_path: Path) -> None:
    import nibabel as nib

    volume = np.full((12, 10, 8), -1000, np.int16)  # air around a body of soft tissue
    volume[2:9, 3:7, 1:6] = np.arange(7 * 4 * 5, dtype=np.int16).reshape(7, 4, 5)
    labels = np.zeros(volume.shape, np.uint8)
    labels[4:6, 4:6, 2:4] = 1
    for name, data in (("ct", volume), ("seg", labels)):
        nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / f"{name}.nii.gz")
    read = {
        field: np.asarray(nib.load(tmp_path / f"{name}.nii.gz").dataobj)
        for field, name in (("image", "ct"), ("mask", "seg"))
    }
    crop = SampleCall(loader.resolve("prep:body_crop", {"threshold": -500}), ("image", "mask"))
    expect = (
        ("image", Expectation(dtype="int16", max_shape=(12, 10, 8))),
        ("mask", Expectation(dtype="uint8", max_shape=(12, 10, 8), values=frozenset({0, 1}))),
    )
    out = apply_transforms(Transforms(0, sample_calls=(crop,), expect=expect), "case1", read)
    np.testing.assert_array_equal(out["image"], volume[2:9, 3:7, 1:6])
    np.testing.assert_array_equal(out["mask"], labels[2:9, 3:7, 1:6])


def test_an_exception_in_user_code_rejects_the_sample_with_its_last_frame(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    chain = _chain(loader, "image", ("prep:broken", {}))
    with pytest.raises(TransformRejected) as caught:
        apply_transforms(Transforms(0, chains=(chain,)), "a", sample)
    assert caught.value.reason == "transform_error"
    assert caught.value.message == "image: prep:broken: ValueError: no body found"
    line = textwrap.dedent(PREP).splitlines().index('    raise ValueError("no body\\n  found")')
    path = loader.resolve("prep:broken").module.path
    assert caught.value.frame == f"{path}:{line + 1} in _helper"
    # the worker sends it to the parent: the frame travels with it
    back = pickle.loads(pickle.dumps(caught.value))
    assert (back.reason, back.message, back.frame) == (
        "transform_error",
        caught.value.message,
        caught.value.frame,
    )


@pytest.mark.parametrize(
    ("field", "call", "problem"),
    [
        pytest.param(
            "image",
            "prep:as_float",
            "image: expected uint8 at most (32 x 40 x 3), got float64 (32 x 40 x 3)",
            id="dtype",
        ),
        pytest.param(
            "image",
            "prep:grow",
            "image: expected uint8 at most (32 x 40 x 3), got uint8 (112 x 120 x 83)",
            id="shape",
        ),
        pytest.param(
            "mask", "prep:relabel", "mask: expected mask values in [0, 255], got 7", id="values"
        ),
    ],
)
def test_a_result_the_field_cannot_store_is_a_transform_output_reject(
    loader: Loader, sample: dict[str, np.ndarray], field: str, call: str, problem: str
) -> None:
    chain = _chain(loader, field, (call, {}))
    with pytest.raises(TransformRejected) as caught:
        apply_transforms(Transforms(0, chains=(chain,), expect=_expect()), "a", sample)
    assert (caught.value.reason, caught.value.message) == ("transform_output", problem)


def test_a_sample_call_must_return_its_fields(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    step = SampleCall(loader.resolve("prep:only_image"), ("image", "mask"))
    with pytest.raises(TransformRejected) as caught:
        apply_transforms(Transforms(0, sample_calls=(step,)), "a", sample)
    assert caught.value.reason == "transform_output"
    assert caught.value.message == (
        "image+mask: prep:only_image: expected a dict of ['image', 'mask'], got ['image']"
    )


def test_a_cast_out_of_range_is_refused_not_wrapped(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    chain = _chain(
        loader,
        "image",
        ("window", {"low": 0, "high": 100, "scale": 300}),
        ("cast", {"dtype": "uint8"}),
    )
    with pytest.raises(TransformRejected) as caught:
        apply_transforms(Transforms(0, chains=(chain,), expect=_expect()), "a", sample)
    assert caught.value.reason == "transform_output"
    assert caught.value.message == (
        "image: cast: cast to uint8: values 0..300 outside 0..255 (never wrapped or clipped)"
    )


def _noisy(loader: Loader, seed: int) -> Transforms:
    chain = _chain(loader, "image", ("prep:noisy", {"scale": 5.0}))
    return Transforms(seed, chains=(chain,))


def test_a_random_transform_draws_per_seed_and_key(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    once = apply_transforms(_noisy(loader, 1), "a", sample)["image"]
    again = apply_transforms(_noisy(loader, 1), "a", sample)["image"]
    np.testing.assert_array_equal(once, again)
    assert not np.array_equal(once, apply_transforms(_noisy(loader, 1), "b", sample)["image"])
    assert not np.array_equal(once, apply_transforms(_noisy(loader, 2), "a", sample)["image"])


def test_loky_workers_draw_what_the_parent_draws_from_the_shipped_code(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    from joblib import Parallel, delayed

    transforms = _noisy(loader, 3)
    keys = [f"k{i}" for i in range(6)]
    here = [apply_transforms(transforms, key, sample)["image"] for key in keys]
    # the workers run the bytes the spec carries: the file on disk is not needed there
    Path(str(loader.resolve("prep:noisy", {"scale": 5.0}).module.path)).unlink()
    there = Parallel(n_jobs=2, backend="loky")(
        delayed(apply_transforms)(transforms, key, sample) for key in keys
    )
    for mine, theirs in zip(here, there, strict=True):
        np.testing.assert_array_equal(mine, theirs["image"])


def test_threads_of_a_fresh_process_load_the_module_once(
    loader: Loader, sample: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from h5etl.transforms import loading

    transforms = _noisy(loader, 4)
    expected = [apply_transforms(transforms, f"k{i}", sample)["image"] for i in range(8)]
    # as in a worker that has not run the module yet: its threads race to load it
    spec = transforms.chains[0].calls[0]
    monkeypatch.setattr(loading, "_FUNCTIONS", {})
    monkeypatch.delitem(sys.modules, spec.module.loaded_name)
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda i: apply_transforms(transforms, f"k{i}", sample), range(8)))
    for mine, theirs in zip(expected, found, strict=True):
        np.testing.assert_array_equal(mine, theirs["image"])
    assert len(loading._FUNCTIONS) == 1


def test_an_exception_class_of_the_users_module_is_named_by_the_module(
    loader: Loader, sample: dict[str, np.ndarray]
) -> None:
    chain = _chain(loader, "mask", ("prep:refuse", {}))
    with pytest.raises(TransformRejected) as caught:
        apply_transforms(Transforms(0, chains=(chain,)), "a", sample)
    assert caught.value.message == "mask: prep:refuse: prep.NoBody: nothing above the threshold"


@pytest.mark.parametrize(
    ("expectation", "value", "problem"),
    [
        pytest.param(Expectation(dtype="<u2"), np.zeros(3, np.uint16), None, id="dtype-spelt"),
        pytest.param(
            Expectation(dtype="uint16"),
            np.zeros(3, ">u2"),
            None,
            id="byte-order",
        ),
        pytest.param(
            Expectation(shape=(None, 4)),
            np.zeros((9, 5)),
            "expected an array (any x 4), got float64 (9 x 5)",
            id="shape",
        ),
        pytest.param(Expectation(shape=(None, 4)), np.zeros((9, 4)), None, id="free-axis"),
        pytest.param(
            Expectation(max_shape=(4, 4)),
            np.zeros((4, 4, 1)),
            "expected an array at most (4 x 4), got float64 (4 x 4 x 1)",
            id="axes",
        ),
        pytest.param(
            Expectation(dtype="int64", classes=3),
            np.int64(3),
            "expected class labels 0..2, got 3",
            id="classes",
        ),
        pytest.param(Expectation(dtype="int64", classes=3), np.int64(2), None, id="a-class"),
        pytest.param(
            Expectation(values=frozenset({0, 1})),
            np.array([0.0, 1.0]),
            "expected integer labels, got float64",
            id="float-labels",
        ),
        pytest.param(Expectation(dtype="uint8"), None, "expected uint8, got a NoneType", id="none"),
    ],
)
def test_an_expectation_names_what_it_wanted_and_what_came(
    expectation: Expectation, value: object, problem: str | None
) -> None:
    assert expectation.problem(value) == problem
