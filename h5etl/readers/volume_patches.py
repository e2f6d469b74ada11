"""Random 3-D patches of volume cases, with nnU-Net's foreground oversampling.

A draw picks a case uniformly; with probability ``foreground`` (and a label volume that has
labels other than 0 in that case) it picks one of the labels present uniformly, one of its
voxels at random, and centres the patch there; otherwise the patch goes anywhere. A case
smaller than the patch on an axis is centred and padded (``fill`` for the image, 0 for the
labels), as nnU-Net pads. Where each label's voxels are is found once per case (a slab at a
time, at most ``LOCATIONS_PER_LABEL`` voxels kept per label) and cached.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from h5etl.readers._source import CacheDir, ReleaseFile
from h5etl.readers.volumes import LOCATIONS_PER_LABEL, Transform, Volumes

SLAB = 32  # slices of a label volume scanned at a time for its label locations


def label_locations(
    labels: Any, start: int, stop: int, rng: np.random.Generator, keep: int = LOCATIONS_PER_LABEL
) -> dict[int, np.ndarray]:
    """Up to ``keep`` random (z, y, x) voxels of each non-zero label of one case, drawn with
    each voxel equally likely: per slab a uniform subset and its count, then slabs weighted
    by their counts. Rows of ``labels[start:stop]`` are the case's slices."""
    kept: dict[int, list[tuple[int, np.ndarray]]] = {}
    for first in range(start, stop, SLAB):
        slab = np.asarray(labels[first : min(first + SLAB, stop)])
        present = np.flatnonzero(np.bincount(slab.ravel()))
        for label in present[present > 0].tolist():
            where = np.flatnonzero(slab.ravel() == label)
            subset = where if len(where) <= keep else rng.choice(where, keep, replace=False)
            coords = np.stack(np.unravel_index(subset, slab.shape), axis=1)
            coords[:, 0] += first - start
            kept.setdefault(int(label), []).append((len(where), coords))
    out = {}
    for label, parts in kept.items():
        counts = np.array([n for n, _ in parts], dtype=np.float64)
        if counts.sum() <= keep:
            out[label] = np.concatenate([c for _, c in parts])
            continue
        slabs = rng.choice(len(parts), keep, p=counts / counts.sum())
        out[label] = np.stack([parts[s][1][rng.integers(len(parts[s][1]))] for s in slabs.tolist()])
    return out


def patch_start(
    shape: tuple[int, ...], size: tuple[int, ...], rng: np.random.Generator, centre: Any = None
) -> tuple[int, int, int]:
    """Where a patch of ``size`` starts in a case of ``shape``: around ``centre`` (kept inside
    the case where the case is large enough), else anywhere inside; centred (and padded)
    on an axis where the case is smaller than the patch."""
    start = []
    for axis, (n, p) in enumerate(zip(shape, size, strict=True)):
        low, high = (0, n - p) if n >= p else ((n - p) // 2, (n - p) // 2)
        if centre is not None:
            start.append(int(np.clip(int(centre[axis]) - p // 2, low, high)))
        else:
            start.append(int(rng.integers(low, high + 1)))
    return (start[0], start[1], start[2])


class PatchSampler:
    """An endless (or ``length``-long) stream of random (z, y, x) patches of one split."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        patch_size: tuple[int, int, int] = (64, 128, 128),
        mask: str | None = None,
        foreground: float = 0.33,
        length: int | None = None,
        seed: int = 0,
        fill: float | None = None,
        transform: Transform | None = None,
        cache_dir: CacheDir = None,
    ):
        if not 0 <= foreground <= 1:
            raise ValueError(f"foreground is a fraction 0..1, got {foreground}")
        if foreground and mask is None:
            raise ValueError("foreground oversampling needs the label volume: pass mask=...")
        self.path = ReleaseFile.of(path, cache_dir)  # pinned for every epoch's reopen
        self.split, self.field, self.mask = split, field, mask
        self.patch_size = tuple(int(p) for p in patch_size)
        self.foreground, self.length, self.seed = foreground, length, seed
        self.fill, self.transform = fill, transform
        self.epoch = 0
        self._locations: dict[int, dict[int, np.ndarray]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("an endless PatchSampler has no length: pass length=...")
        return self.length

    def locations(self, volumes: Volumes, case: int) -> dict[int, np.ndarray]:
        """Each non-zero label's sampled voxels in ``case`` (found once, then cached)."""
        if case not in self._locations:
            assert volumes.labels is not None
            rng = np.random.default_rng([self.seed, case])
            start, stop = int(volumes.offsets[case]), int(volumes.offsets[case + 1])
            self._locations[case] = label_locations(volumes.labels, start, stop, rng)
        return self._locations[case]

    def draw(self, volumes: Volumes, rng: np.random.Generator) -> dict[str, Any]:
        """One patch: a random case, centred on a random label's voxel or anywhere."""
        case = int(rng.integers(len(volumes)))
        shape = volumes.shape_of(case)
        centre = None
        if self.foreground and rng.random() < self.foreground:
            found = self.locations(volumes, case)
            if found:
                label = sorted(found)[int(rng.integers(len(found)))]
                voxels = found[label]
                centre = voxels[int(rng.integers(len(voxels)))]
        start = patch_start(shape, self.patch_size, rng, centre)
        fill = self.fill if self.fill is not None else _lowest(volumes)
        size = (self.patch_size[0], self.patch_size[1], self.patch_size[2])
        out = volumes.patch(case, start, size, fill=fill)
        out["foreground"] = centre is not None
        out["spacing"] = volumes.spacing[case]
        if self.transform is not None:
            out["image"] = self.transform(out["image"])
        return out

    def stream(self, rng: np.random.Generator, count: int | None) -> Iterator[dict[str, Any]]:
        with Volumes(self.path, self.split, self.field, mask=self.mask) as volumes:
            drawn = 0
            while count is None or drawn < count:
                yield self.draw(volumes, rng)
                drawn += 1

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.stream(np.random.default_rng([self.seed, self.epoch]), self.length)


def _lowest(volumes: Volumes) -> float:
    """What lies outside a case: the split's minimum (air in CT) if recorded, else 0."""
    low = volumes.values.attrs.get("min")
    if low is None:
        return 0.0
    return float(np.asarray(low).ravel()[0])
