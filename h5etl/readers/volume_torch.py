"""PyTorch Datasets over volume fields: whole cases, random 2-D slices, random 3-D patches.

Images come as float32 tensors with a channel axis ((1, z, y, x) or (1, y, x)), after the
``transform`` (e.g. ``Window(40, 400)``) if one is given; label volumes as int64 without a
channel axis (what ``cross_entropy`` takes); every item names its case by index (``case``)
and by name (``key``; a batch's names are a list of str). Each loader worker opens the file
itself and takes its own share of the slices (or its own seed for patches).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from h5etl.readers._source import CacheDir, ReleaseFile
from h5etl.readers.volume_patches import PatchSampler
from h5etl.readers.volumes import SliceSampler, Transform, Volumes


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a test dependency
        raise ImportError("the volume datasets need PyTorch: pip install torch") from exc
    return torch


def _tensors(item: dict[str, Any]) -> dict[str, Any]:
    torch = _torch()
    out = dict(item)
    out["image"] = torch.from_numpy(np.ascontiguousarray(item["image"], dtype=np.float32))[None]
    if "mask" in item:
        out["mask"] = torch.from_numpy(item["mask"].astype(np.int64))
    if "spacing" in item:
        out["spacing"] = torch.from_numpy(np.asarray(item["spacing"], dtype=np.float64))
    if "affine" in item:
        out["affine"] = torch.from_numpy(np.asarray(item["affine"], dtype=np.float64))
    return out


def _worker() -> tuple[int, int]:
    info = _torch().utils.data.get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


class VolumeCaseDataset:
    """Map-style: item i is case i (``case``, its name ``key``, ``image``, ``mask``,
    ``spacing``, ``affine``)."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        mask: str | None = None,
        transform: Transform | None = None,
        cache_dir: CacheDir = None,
    ):
        self.path = ReleaseFile.of(path, cache_dir)  # pinned for every worker
        self.split, self.field, self.mask = split, field, mask
        self.transform = transform
        with Volumes(self.path, split, field, mask=mask) as volumes:
            self._length = len(volumes)
        self._volumes: Volumes | None = None

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._volumes is None:  # opened in the process that reads (a loader worker)
            self._volumes = Volumes(self.path, self.split, self.field, mask=self.mask)
        item = self._volumes.case(index)
        item.pop("series_uid")
        if self.transform is not None:
            item["image"] = self.transform(item["image"])
        return _tensors(item)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_volumes"] = None  # never an open handle across processes
        return state


def _iterable_base() -> Any:
    return _torch().utils.data.IterableDataset


class VolumeSliceDataset(_iterable_base()):  # type: ignore[misc]
    """Iterable: every slice of the split once per epoch, in chunk-aware random order, the
    slices shared out between ranks and loader workers."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        mask: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        transform: Transform | None = None,
        rank: int = 0,
        world_size: int = 1,
        cache_dir: CacheDir = None,
    ):
        super().__init__()
        self.options: dict[str, Any] = {
            "path": ReleaseFile.of(path, cache_dir),  # pinned for every worker and epoch
            "split": split,
            "field": field,
            "mask": mask,
            "shuffle": shuffle,
            "seed": seed,
            "transform": transform,
        }
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker, workers = _worker()
        sampler = SliceSampler(
            **self.options,
            rank=self.rank,
            world_size=self.world_size,
            part=(worker, workers),
        )
        sampler.set_epoch(self.epoch)
        for item in sampler:
            yield _tensors(item)


class VolumePatchDataset(_iterable_base()):  # type: ignore[misc]
    """Iterable: ``length`` random patches per epoch (split between loader workers), each
    worker drawing from its own seed ``(seed, epoch, worker)``."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        length: int,
        patch_size: tuple[int, int, int] = (64, 128, 128),
        mask: str | None = None,
        foreground: float = 0.33,
        seed: int = 0,
        fill: float | None = None,
        transform: Transform | None = None,
        cache_dir: CacheDir = None,
    ):
        super().__init__()
        self.sampler = PatchSampler(
            ReleaseFile.of(path, cache_dir),
            split,
            field,
            patch_size=patch_size,
            mask=mask,
            foreground=foreground,
            length=length,
            seed=seed,
            fill=fill,
            transform=transform,
        )

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker, workers = _worker()
        total = len(self.sampler)
        count = total // workers + (1 if worker < total % workers else 0)
        rng = np.random.default_rng([self.sampler.seed, self.sampler.epoch, worker])
        for item in self.sampler.stream(rng, count):
            yield _tensors(item)
