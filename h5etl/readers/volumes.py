"""Reading volume fields: whole cases, random 2-D slices, random 3-D patches, torch Datasets.

A volume field of a split is a ragged column: the slices of every case end to end, offsets
beside, plus row-aligned ``<field>_spacing``, ``<field>_affine`` and ``<field>_series_uid``.
``Volumes`` opens them (with an optional label volume, ``mask``); ``SliceSampler`` draws
slices chunk by chunk (each chunk of slices decompressed once per epoch); ``PatchSampler``
draws (z, y, x) patches, a ``foreground`` fraction of them centred on a voxel of a random
label present in the case, the rest anywhere (nnU-Net's rule); a patch reads only the chunks
it covers. ``Window`` is window/level as a read-time transform: the file keeps HU.
Samplers and datasets open the file themselves, so each loader worker has its own handle.
Every item names its case twice: ``case`` (its index in the split) and ``key`` (its name,
the sample key: ``case_007``), so a loss or a metric can be reported by case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5etl.errors import ReaderError
from h5etl.format import contract as fileformat
from h5etl.readers._chunks import submit
from h5etl.readers._codecs import NotDecodable, Pipeline
from h5etl.readers._sampler import ChunkSampler
from h5etl.readers._source import CacheDir, ReleaseFile

Transform = Callable[[np.ndarray], np.ndarray]
LOCATIONS_PER_LABEL = 10_000  # sampled voxels kept per label and case (nnU-Net keeps 10,000)


@dataclass(frozen=True, slots=True)
class Window:
    """Window/level: HU ``level - width/2 .. level + width/2`` mapped to 0..1 (float32)."""

    level: float
    width: float

    def __call__(self, values: np.ndarray) -> np.ndarray:
        low = self.level - self.width / 2
        scaled = (values.astype(np.float32) - np.float32(low)) / np.float32(self.width)
        return np.clip(scaled, 0.0, 1.0, out=scaled)


def column_paths(handle: h5py.File, split: str, field: str) -> dict[str, str]:
    """The datasets of volume ``field`` in ``split``: values, offsets, spacing, affine, uid,
    and the split's ``key`` (each case's name: its sample key; absent in older releases)."""
    try:
        layout = fileformat.read_layout(handle)
    except ValueError as exc:
        raise ReaderError(str(exc), path=handle.filename) from exc
    record = layout.fields.get(field)
    if record is None or record.kind != "volume":
        volumes = [n for n, r in layout.fields.items() if r.kind == "volume"]
        raise ReaderError(
            f"no volume field {field!r} (volume fields: {', '.join(volumes) or 'none'})",
            path=handle.filename,
        )
    if split not in layout.splits:
        raise ReaderError(
            f"no split {split!r} (splits: {', '.join(layout.splits)})", path=handle.filename
        )
    values = layout.path(split, field)
    record_paths = layout.sample_paths(split)
    return {
        "values": values,
        "offsets": fileformat.offsets_path(values),
        **{suffix: layout.path(split, f"{field}_{suffix}") for suffix in ("spacing", "affine")},
        "series_uid": layout.path(split, f"{field}_series_uid"),
    } | (
        {"key": record_paths[fileformat.SAMPLE_KEY]}
        if fileformat.SAMPLE_KEY in record_paths
        else {}
    )


def _texts(dataset: h5py.Dataset) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in dataset[...]]


def _pipeline(dataset: h5py.Dataset) -> Pipeline | None:
    try:
        return Pipeline.of(dataset)
    except NotDecodable:
        return None


def read_box(
    dataset: h5py.Dataset, pipeline: Pipeline | None, box: tuple[slice, slice, slice]
) -> np.ndarray:
    """``dataset[box]`` from the chunks it covers, each read as stored and decoded by
    imagecodecs on the decode threads (which release the GIL; HDF5 decodes one chunk at a
    time under h5py's lock): 3.5x faster for a 64x128x128 patch of 128 px tiles, one thread.
    Pipelines that are not decoded here go through h5py."""
    if pipeline is None or dataset.chunks is None:
        return np.asarray(dataset[box])
    chunks = dataset.chunks
    bounds = [(b.start, b.stop) for b in box]
    out = np.empty([hi - lo for lo, hi in bounds], dtype=dataset.dtype)
    starts = [range(lo - lo % c, hi, c) for (lo, hi), c in zip(bounds, chunks, strict=True)]
    pending = []
    for z in starts[0]:
        for y in starts[1]:
            for x in starts[2]:
                try:
                    mask, stored = dataset.id.read_direct_chunk((z, y, x))
                except (KeyError, OSError, RuntimeError):  # never written: h5py's fill value
                    return np.asarray(dataset[box])
                pending.append(((z, y, x), submit(pipeline.decode, stored, mask)))
    for offset, future in pending:
        try:
            tile = future.result().view(dataset.dtype).reshape(chunks)
        except NotDecodable:
            return np.asarray(dataset[box])
        low = [max(o, lo) for o, (lo, _) in zip(offset, bounds, strict=True)]
        high = [min(o + c, hi) for o, c, (_, hi) in zip(offset, chunks, bounds, strict=True)]
        target = tuple(
            slice(a - lo, b - lo) for a, b, (lo, _) in zip(low, high, bounds, strict=True)
        )
        source = tuple(slice(a - o, b - o) for a, b, o in zip(low, high, offset, strict=True))
        out[target] = tile[source]
    return out


class Volumes:
    """The cases of one volume field (and its label volume) in one split of a release."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        mask: str | None = None,
        cache_bytes: int = 64 * 2**20,
        cache_dir: CacheDir = None,
    ):
        # a URL's pointer is read once (pass the ReleaseFile on to stay on its version)
        self.source = ReleaseFile.of(path, cache_dir)
        self.path: Path | str = self.source.path or self.source.name
        self.split, self.field, self.mask = split, field, mask
        self._file = self.source.open(rdcc_nbytes=cache_bytes, rdcc_nslots=100_003)
        paths = column_paths(self._file, split, field)
        self.values: h5py.Dataset = self._file[paths["values"]]
        self.offsets = np.asarray(self._file[paths["offsets"]][...], dtype=np.int64)
        self.spacing = np.asarray(self._file[paths["spacing"]][...])
        self.affine = np.asarray(self._file[paths["affine"]][...])
        self.series_uid = _texts(self._file[paths["series_uid"]])
        # each case's name (its sample key), what a loss or a metric is reported by; a
        # release without the sample keys names a case by its number
        self.keys = (
            _texts(self._file[paths["key"]])
            if "key" in paths
            else [str(i) for i in range(len(self.offsets) - 1)]
        )
        self._decoders = {"values": _pipeline(self.values)}
        self.labels: h5py.Dataset | None = None
        self.label_values: list[int] = []
        if mask is not None:
            mask_paths = column_paths(self._file, split, mask)
            self.labels = self._file[mask_paths["values"]]
            mask_offsets = np.asarray(self._file[mask_paths["offsets"]][...])
            if not np.array_equal(mask_offsets, self.offsets):
                raise ReaderError(f"{mask} and {field} have different slice counts", path=str(path))
            self.label_values = [int(v) for v in self.labels.attrs.get("values", [])]
            self._decoders["labels"] = _pipeline(self.labels)

    def __enter__(self) -> Volumes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self.values.chunks or self.values.shape)

    def shape_of(self, case: int) -> tuple[int, int, int]:
        z = int(self.offsets[case + 1] - self.offsets[case])
        return (z, int(self.values.shape[1]), int(self.values.shape[2]))

    def case(self, case: int) -> dict[str, Any]:
        """One whole case: ``case`` (its index), ``key`` (its name), ``image`` (z, y, x),
        ``mask`` if asked, and its geometry."""
        start, stop = int(self.offsets[case]), int(self.offsets[case + 1])
        out: dict[str, Any] = {
            "case": case,
            "key": self.keys[case],
            "image": self.values[start:stop],
            "spacing": self.spacing[case],
            "affine": self.affine[case],
            "series_uid": self.series_uid[case],
        }
        if self.labels is not None:
            out["mask"] = self.labels[start:stop]
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for case in range(len(self)):
            yield self.case(case)

    def patch(
        self, case: int, start: tuple[int, int, int], size: tuple[int, int, int], *, fill: float = 0
    ) -> dict[str, Any]:
        """The (z, y, x) box at ``start`` of ``size`` (parts outside the case: ``fill``, 0 for
        the mask): one h5py read of only the chunks it covers."""
        shape = self.shape_of(case)
        low = [max(0, s) for s in start]
        high = [min(n, s + p) for n, s, p in zip(shape, start, size, strict=True)]
        inner = tuple(slice(lo - s, hi - s) for lo, hi, s in zip(low, high, start, strict=True))
        base = int(self.offsets[case])
        box = (slice(base + low[0], base + high[0]), slice(low[1], high[1]), slice(low[2], high[2]))
        out: dict[str, Any] = {"case": case, "key": self.keys[case], "start": start}
        inside = all(h > lo for lo, h in zip(low, high, strict=True))
        image = np.full(size, fill, dtype=self.values.dtype)
        if inside:
            image[inner] = read_box(self.values, self._decoders["values"], box)
        out["image"] = image
        if self.labels is not None:
            labels = np.zeros(size, dtype=self.labels.dtype)
            if inside:
                labels[inner] = read_box(self.labels, self._decoders.get("labels"), box)
            out["mask"] = labels
        return out


class SliceSampler:
    """Random 2-D slices of every case, a chunk of slices at a time (``ChunkSampler``'s epoch
    orders over the split's slices: each chunk is decompressed once per epoch)."""

    def __init__(
        self,
        path: str | Path | ReleaseFile,
        split: str = "train",
        field: str = "ct",
        *,
        mask: str | None = None,
        cache_dir: CacheDir = None,
        shuffle: bool = True,
        seed: int = 0,
        transform: Transform | None = None,
        rank: int = 0,
        world_size: int = 1,
        part: tuple[int, int] = (0, 1),
    ):
        """``rank``/``world_size``: distributed ranks (equal shares, padded by wrapping);
        ``part`` (i, n): this loader worker's every n-th slice of its rank's share."""
        self.path = ReleaseFile.of(path, cache_dir)  # pinned for every epoch's reopen
        self.split, self.field, self.mask = split, field, mask
        self.transform = transform
        self.part = part
        with Volumes(self.path, split, field, mask=mask) as volumes:
            self.offsets = volumes.offsets
            rows = volumes.chunks[0]
        self.sampler = ChunkSampler(
            int(self.offsets[-1]),
            rows,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler.indices()[self.part[0] :: self.part[1]])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rows = self.sampler.indices()[self.part[0] :: self.part[1]].tolist()
        with Volumes(self.path, self.split, self.field, mask=self.mask) as volumes:
            for row in rows:
                case = int(np.searchsorted(self.offsets, row, side="right") - 1)
                image = volumes.values[row]
                out: dict[str, Any] = {
                    "case": case,
                    "key": volumes.keys[case],
                    "z": int(row - self.offsets[case]),
                    "image": self.transform(image) if self.transform else image,
                    "spacing": volumes.spacing[case],
                }
                if volumes.labels is not None:
                    out["mask"] = volumes.labels[row]
                yield out
