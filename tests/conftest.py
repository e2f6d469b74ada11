"""Shared fixtures: tiny raw folders of PNGs and configs that point at them.

Use them as pytest fixtures::

    def test_something(make_raw, write_config, tmp_path):
        raw = make_raw(tmp_path, n=5, broken={"bad": "truncated"})
        config = write_config(tmp_path, storage={"chunk_samples": 2})

``make_raw`` writes ``<root>/raw/images/*.png`` (RGB) and ``<root>/raw/masks/*.png`` (L, 0/255);
``write_config`` writes ``<root>/config.yaml`` whose sources are ``raw/images`` and ``raw/masks``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image

# The kind contract suite's asserts say what differed (pytest rewrites them, as in tests/)
pytest.register_assert_rewrite("h5etl.testing")

# tests/remote's S3 server fixtures (one conftest module name only: `from conftest import`
# elsewhere must find this one)
pytest_plugins = ["s3_server"]


# Broken kinds make_raw knows, and the reject reason each one must produce.
BROKEN_REASONS: dict[str, str] = {
    "truncated": "truncated",  # image PNG cut in half (caught by the header probe)
    "truncated_late": "truncated",  # image PNG missing its last bytes (caught at decode)
    "empty": "unreadable",  # zero-byte image file
    "text": "unreadable",  # a text file named .png
    "mask_128": "mask_values",  # a mask holding a 128
    "mask_colour": "mask_not_single_channel",  # an RGB mask whose channels differ
    "orphan_image": "orphan",  # an image without a mask
    "orphan_mask": "orphan",  # a mask without an image
    "oversize": "oversize",  # image and mask larger than the field shape (30x30 > 24x24)
    "size_mismatch": "size_mismatch",  # image 12x12, mask 14x16
    "dangling": "dangling_symlink",  # the image is a symlink to a missing file
}
ALL_BROKEN: dict[str, str] = {f"broken_{kind}": kind for kind in BROKEN_REASONS}
DEFAULT_SIZES: tuple[tuple[int, int], ...] = ((10, 12), (24, 24), (17, 9), (20, 23), (13, 24))
SHAPE = 24


@dataclass
class RawFolder:
    """A raw folder written by ``make_raw``.

    ``keys`` are the good samples (each with an image and a mask), ``sizes[key]`` their (h, w);
    ``broken`` maps a key to its kind, ``reasons`` maps every rejected file's absolute path to
    the reason it must be reported with. ``files`` counts every input file written.
    """

    root: Path
    keys: list[str]
    sizes: dict[str, tuple[int, int]]
    broken: dict[str, str]
    reasons: dict[str, str] = field(default_factory=dict)
    files: int = 0

    @property
    def images(self) -> Path:
        return self.root / "raw" / "images"

    @property
    def masks(self) -> Path:
        return self.root / "raw" / "masks"

    def image(self, key: str) -> Path:
        return self.images / f"{key}.png"

    def mask(self, key: str) -> Path:
        return self.masks / f"{key}.png"


class MakeRaw(Protocol):
    def __call__(
        self,
        root: Path,
        n: int = 5,
        sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
        broken: Mapping[str, str] | Iterable[str] = (),
        *,
        seed: int = 0,
    ) -> RawFolder: ...


WriteConfig = Callable[..., Path]


def exact_splits(names: Iterable[str], fractions: Mapping[str, float], seed: int) -> dict[str, str]:
    """The first release's documented split rule, written out: names sorted by
    SHA-256(f"{seed}\\x00{name}"), the first k splits taking round-half-up(F_k x N)."""
    ordered = sorted(names, key=lambda n: hashlib.sha256(f"{seed}\x00{n}".encode()).digest())
    shares = {split: Fraction(repr(float(f))) for split, f in fractions.items()}
    total = sum(shares.values())
    out, start, cumulative = {}, 0, Fraction(0)
    for split, share in shares.items():
        cumulative += share / total
        stop = math.floor(cumulative * len(ordered) + Fraction(1, 2))
        out.update(dict.fromkeys(ordered[start:stop], split))
        start = stop
    return out


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_pair(rng: np.random.Generator, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A random RGB image (h, w, 3) and a 0/255 mask (h, w) with both labels present."""
    image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    mask = np.where(rng.random(size) < 0.5, 255, 0).astype(np.uint8)
    mask.flat[0], mask.flat[-1] = 0, 255
    return image, mask


def save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format="PNG")


def add_pairs(root: Path, keys: list[str], seed: int = 0, *, largest: int = 12) -> None:
    """A random image/mask pair per key, ``raw/images/<key>.png`` and ``raw/masks/<key>.png``
    under ``root``, each side 6 to ``largest`` pixels."""
    rng = np.random.default_rng(seed)
    for key in keys:
        size = (int(rng.integers(6, largest + 1)), int(rng.integers(6, largest + 1)))
        image, mask = random_pair(rng, size)
        save(root / "raw" / "images" / f"{key}.png", image)
        save(root / "raw" / "masks" / f"{key}.png", mask)


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_broken(raw: RawFolder, key: str, kind: str, rng: np.random.Generator) -> None:
    image, mask = raw.image(key), raw.mask(key)
    both = [image, mask]
    good_image, good_mask = random_pair(rng, (12, 14))
    files = both
    if kind == "truncated":
        data = png_bytes(good_image)
        image.write_bytes(data[: len(data) // 2])
        save(mask, good_mask)
    elif kind == "truncated_late":
        data = png_bytes(good_image)
        image.write_bytes(data[:-40])
        save(mask, good_mask)
    elif kind == "empty":
        image.write_bytes(b"")
        save(mask, good_mask)
    elif kind == "text":
        image.write_text("this is not a PNG\n", encoding="utf-8")
        save(mask, good_mask)
    elif kind == "mask_128":
        save(image, good_image)
        bad = good_mask.copy()
        bad[1, 1] = 128
        save(mask, bad)
    elif kind == "mask_colour":
        save(image, good_image)
        colour = np.zeros((12, 14, 3), dtype=np.uint8)
        colour[2:5, 2:5, 0] = 255
        save(mask, colour)
    elif kind == "orphan_image":
        save(image, good_image)
        files = [image]
    elif kind == "orphan_mask":
        save(mask, good_mask)
        files = [mask]
    elif kind == "oversize":
        big_image, big_mask = random_pair(rng, (SHAPE + 6, SHAPE + 6))
        save(image, big_image)
        save(mask, big_mask)
    elif kind == "size_mismatch":
        save(image, good_image)
        save(mask, random_pair(rng, (14, 16))[1])
    elif kind == "dangling":
        os.symlink(raw.images / "nowhere" / "missing.png", image)
        save(mask, good_mask)
    else:
        raise ValueError(f"unknown broken kind {kind!r}; known: {sorted(BROKEN_REASONS)}")
    raw.files += len(files)
    raw.reasons.update({str(f): BROKEN_REASONS[kind] for f in files})


def _make_raw(
    root: Path,
    n: int = 5,
    sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES,
    broken: Mapping[str, str] | Iterable[str] = (),
    *,
    seed: int = 0,
) -> RawFolder:
    """Write ``n`` good pairs ``s000..`` (sizes cycled) plus broken inputs under ``root/raw``.

    ``broken`` maps key -> kind (see ``BROKEN_REASONS``), or is a list of kinds whose keys
    become ``broken_<kind>``; ``ALL_BROKEN`` holds one of each.
    """
    if not isinstance(broken, Mapping):
        broken = {f"broken_{kind}": kind for kind in broken}
    rng = np.random.default_rng(seed)
    raw = RawFolder(root.absolute(), [], {}, dict(broken))
    raw.images.mkdir(parents=True, exist_ok=True)
    raw.masks.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        key, size = f"s{i:03d}", tuple(sizes[i % len(sizes)])
        image, mask = random_pair(rng, (size[0], size[1]))
        save(raw.image(key), image)
        save(raw.mask(key), mask)
        raw.keys.append(key)
        raw.sizes[key] = (size[0], size[1])
        raw.files += 2
    for key, kind in sorted(broken.items()):
        _write_broken(raw, key, kind, rng)
    return raw


def base_config(name: str = "cells") -> dict[str, Any]:
    """The valid config ``write_config`` starts from, as a mapping."""
    return {
        "name": name,
        "pipeline": "segmentation",
        "output": "releases",
        "sources": {
            "image": {"dir": "raw/images", "glob": "*.png"},
            "mask": {"dir": "raw/masks", "glob": "*.png"},
        },
        "splits": {"train": 0.8, "valid": 0.2},
        "seed": 0,
        "fields": {
            "image": {"shape": [3, SHAPE, SHAPE], "dtype": "uint8", "mode": "RGB"},
            "mask": {"shape": [1, SHAPE, SHAPE], "dtype": "uint8", "mode": "L", "values": [0, 1]},
            "filename": {"dtype": "str"},
        },
        "storage": {"chunk_samples": 4, "compression": "lzf", "shuffle": True},
        "pad": {"fill": 0, "oversize": "reject"},
        "on_error": "skip",
        # These folders are tiny and broken on purpose: 2 bad files of 12 are 17 %, past the
        # default max_rejects (0.05), and a split of one sample is empty when it is the broken
        # one. The loss guards have their own tests (test_publish_guard.py).
        "max_rejects": None,
        "allow_empty": True,
    }


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into ``base``; a value of ``None`` deletes the key."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _write_config(root: Path, *, config_name: str = "config.yaml", **overrides: Any) -> Path:
    """Write ``root/<config_name>``: ``base_config()`` deep-merged with ``overrides``.

    Nested overrides merge (``storage={"chunk_samples": 2}`` keeps compression), except
    ``splits``, which replaces; ``None`` deletes a key (``fields={"filename": None}``).
    """
    path = root / config_name
    data = merge(base_config(), overrides)
    if overrides.get("splits") is not None:
        data["splits"] = overrides["splits"]  # splits replace, as they do over a recipe
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


@pytest.fixture
def make_raw() -> MakeRaw:
    """Factory: ``make_raw(root, n=5, sizes=..., broken={key: kind}) -> RawFolder``."""
    return _make_raw


@pytest.fixture
def write_config() -> WriteConfig:
    """Factory: ``write_config(root, **overrides) -> Path`` of a valid config YAML."""
    return _write_config


def centre_pad(array: np.ndarray, height: int, width: int, fill: int = 0) -> np.ndarray:
    """DESIGN.md's rule, written out independently: top=(H-h)//2, left=(W-w)//2, CHW."""
    chw = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    out = np.full((chw.shape[0], height, width), fill, dtype=np.uint8)
    top, left = (height - chw.shape[1]) // 2, (width - chw.shape[2]) // 2
    out[:, top : top + chw.shape[1], left : left + chw.shape[2]] = chw
    return out


def expected_image(
    path: Path, height: int = SHAPE, width: int = SHAPE, fill: int = 0
) -> np.ndarray:
    """The (3, H, W) row a source image must become, decoded with Pillow here, not by h5etl."""
    with Image.open(path) as image:
        rgb = np.asarray(image.convert("RGB"))
    return centre_pad(rgb, height, width, fill)


def expected_mask(path: Path, height: int = SHAPE, width: int = SHAPE, fill: int = 0) -> np.ndarray:
    """The (1, H, W) row of a 0/255 source mask: 255 -> 1."""
    with Image.open(path) as image:
        grey = np.asarray(image.convert("L"))
    return centre_pad((grey == 255).astype(np.uint8), height, width, fill)


def read_release(path: Path) -> dict[str, np.ndarray]:
    """Every dataset of a release as an array, keyed ``split/field`` (text decoded to str)."""
    out: dict[str, np.ndarray] = {}

    def visit(name: str, node: h5py.Dataset | h5py.Group) -> None:
        if isinstance(node, h5py.Dataset) and not name.startswith("diagnostics"):
            data = node[...]
            if node.dtype.kind == "O":
                data = np.array([v.decode() if isinstance(v, bytes) else v for v in data])
            out[name] = data

    with h5py.File(path, "r") as handle:
        handle.visititems(visit)
    return out


def dataset_digests(path: Path) -> dict[str, str]:
    """``/diagnostics/datasets/*`` sha256 attrs, keyed by dataset path."""
    with h5py.File(path, "r") as handle:
        group = handle["diagnostics/datasets"]
        return {str(node.attrs["dataset"]): str(node.attrs["sha256"]) for node in group.values()}


# Temp folders in RAM when the machine has room and the user chose no TMPDIR: the suite makes
# thousands of small releases, each fsynced several times (the publish must be durable), and on
# a busy disk those waits, not the CPU, set the pace. The code paths are the same on tmpfs;
# the disk-full tests mount their own small tmpfs. pyproject keeps only failed tests' folders.
RAM_TEMP = Path("/dev/shm")
RAM_TEMP_MIN_FREE = 4 * 2**30


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TMPDIR") or config.option.basetemp or not RAM_TEMP.is_dir():
        return
    try:
        stat = os.statvfs(RAM_TEMP)
    except OSError:
        return
    if stat.f_bavail * stat.f_frsize < RAM_TEMP_MIN_FREE:
        return
    folder = RAM_TEMP / "h5etl-tests"
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return
    os.environ["TMPDIR"] = str(folder)  # xdist's workers and the tests' children inherit it
    tempfile.tempdir = None  # read TMPDIR again


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the named semaphores of loky pools whose process is gone. Tests SIGKILL builds
    with their process group, resource tracker included, and each left its pool's
    ``/dev/shm/sem.loky-<pid>-*`` (about 110 a full run). A live process's are left alone
    (an xdist worker's beside this one): only a dead ``<pid>``'s go, and a semaphore
    still open somewhere keeps working without its name."""
    from h5etl.processes import pid_alive

    for path in RAM_TEMP.glob("sem.loky-*-*") if RAM_TEMP.is_dir() else ():
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not pid_alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()


@pytest.fixture(autouse=True)
def _working_directory_restored() -> Iterator[None]:
    """A test that moves the process elsewhere must move it back (``monkeypatch.chdir``): its
    temp folder is removed after it passes, and the next test of the worker found no working
    directory (FileNotFoundError from os.getcwd)."""
    before = os.getcwd()
    yield
    try:
        after = os.getcwd()
    except FileNotFoundError:
        after = ""
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left the working directory at {after or 'a removed folder'}")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Accept pyproject's pytest-xdist options when pytest-xdist is switched off
    (``-p no:xdist``, for a debugger): the run is then serial, in this process."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist-off", "pytest-xdist is not loaded: the run is serial")
    group.addoption("--numprocesses", dest="numprocesses", default=None, help="ignored")
    group.addoption("--dist", dest="dist", default="no", help="ignored")
    group.addoption("--no-loadscope-reorder", action="store_false", dest="loadscopereorder")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a worker per core that other work leaves free, or none at all (serial, in
    this process) when that is fewer than two.

    On a busy machine a second worker finds no free core, and each worker pays its own
    imports (torch, keras) and worker pools: on 185 of the tests two workers took 25 % more
    CPU and 20 % more wall than one process (2 cores, load 3-6). ``-n N`` or
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still choose the number.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    free = min(cores, round(_idle_cores()))
    return free if free >= 2 else 0


def _idle_cores(seconds: float = 0.5) -> float:
    """How many cores sat idle over the last ``seconds`` (``/proc/stat``).

    Not the load average: that is a one-minute mean, and CI's ``pip install`` just before
    the tests read as a busy machine (load 1.2 on an idle one): the suite ran in one process,
    5 min 22 s instead of 3 min 26 s."""
    try:
        before = _cpu_times()
        time.sleep(seconds)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        cores = os.cpu_count() or 1
        return cores - min(cores, os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0.0
    spent = [b - a for a, b in zip(before, after, strict=True)]
    idle = spent[3] + spent[4]  # idle, iowait
    return (os.cpu_count() or 1) * idle / max(1, sum(spent[:8]))


def _cpu_times() -> list[int]:
    """The machine's CPU time so far, by state (user, nice, system, idle, iowait, ...)."""
    with open("/proc/stat", encoding="ascii") as stat:
        return [int(ticks) for ticks in stat.readline().split()[1:]]
