"""NIfTI files (``.nii``, ``.nii.gz``, NIfTI-1 and -2): header by nibabel, voxels streamed.

NIfTI stores voxels column-major (x fastest), so the k-th z slice is one contiguous run of
bytes: the data is read a slab of slices at a time straight from the (gzip) stream, never
the whole file at once, and a slab already is (k, y, x) in C order. Values are
``raw * scl_slope + scl_inter`` when the header sets a slope. The affine is nibabel's best
affine (sform, else qform), the spacing its zooms, in mm (``xyzt_units`` honoured).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from h5etl.errors import RejectError
from h5etl.inputs import opening as inputs
from h5etl.inputs.volumes.case import SLAB_ROWS, Case, CaseHeader, Slab, medical

_HEAD = 540  # a NIfTI-2 header; NIfTI-1's is 348
_UNITS_MM = {"meter": 1000.0, "mm": 1.0, "micron": 1e-3, "unknown": 1.0}
_GZIP_MAGIC = b"\x1f\x8b"


class _Hashing(io.RawIOBase):
    """A readable stream that hashes every byte read from it (the file's lineage digest)."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        self.sha256.update(data)
        buffer[: len(data)] = data
        return len(data)


def _exactly(stream: BinaryIO, size: int, path: str) -> bytes:
    data = stream.read(size)
    if len(data) < size:
        raise RejectError("truncated", f"the file ends {size - len(data)} bytes early", path=path)
    return data


def _parse_header(nibabel: Any, head: bytes, path: str) -> Any:
    sizeof = int.from_bytes(head[:4], "little")
    swapped = int.from_bytes(head[:4], "big")
    kind = nibabel.Nifti2Header if 540 in (sizeof, swapped) else nibabel.Nifti1Header
    try:
        return kind.from_fileobj(io.BytesIO(head), check=True)
    except Exception as exc:  # nibabel's HeaderDataError, struct errors...
        raise RejectError("unreadable", f"not a NIfTI header: {exc}", path=path) from exc


def _decimal(value: Any) -> float:
    """A header number as the shortest decimal that gives it back (a NIfTI-1 header holds
    float32: 0.8 mm, not 0.800000011920929)."""
    if isinstance(value, np.float32):
        return float(str(value))
    return float(value)


def _shape(header: Any, path: str) -> tuple[int, int, int]:
    dims = [int(d) for d in header.get_data_shape()]
    if len(dims) > 3 and any(d != 1 for d in dims[3:]):
        raise RejectError(
            "unsupported",
            f"a {len(dims)}-D image of shape {tuple(dims)}; a volume is 3-D (x, y, z)",
            path=path,
        )
    x, y, z = ([*dims, 1, 1, 1])[:3]
    return (z, y, x)


def open_nifti(path: str) -> NiftiCase:
    """The NIfTI file at ``path`` with its header read."""
    nibabel = medical("nibabel")
    with inputs.opened(path) as handle:
        magic = handle.read(2)
        handle.seek(0)
        try:
            stream = gzip.GzipFile(fileobj=handle) if magic == _GZIP_MAGIC else handle
            head = stream.read(_HEAD)
            # a plain .nii shows its truncation in its size (a .nii.gz only when read)
            size = None if magic == _GZIP_MAGIC else handle.seek(0, io.SEEK_END)
        except (OSError, EOFError, zlib.error) as exc:
            raise RejectError("unreadable", f"cannot read: {exc}", path=path) from exc
    header = _parse_header(nibabel, head, path)
    dtype = header.get_data_dtype()
    if dtype.kind not in "iuf" or dtype.fields is not None:
        raise RejectError("unsupported", f"voxels of type {dtype}: not numbers", path=path)
    unit = _UNITS_MM.get(str(header.get_xyzt_units()[0]), 1.0)
    zooms = [_decimal(v) * unit for v in header.get_zooms()[:3]] + [1.0, 1.0, 1.0]
    affine = np.vectorize(_decimal)(np.asarray(header.get_best_affine()))
    affine[:3] *= unit  # axes and translation alike, into mm
    slope, intercept = header.get_slope_inter()
    case_header = CaseHeader(
        "nifti", _shape(header, path), (zooms[2], zooms[1], zooms[0]), affine, ""
    )
    end = int(header.get_data_offset()) + int(np.prod(case_header.shape)) * dtype.itemsize
    if size is not None and size < end:
        raise RejectError("truncated", f"the file ends {end - size} bytes early", path=path)
    return NiftiCase(
        path,
        case_header,
        dtype=dtype,
        offset=int(header.get_data_offset()),
        slope=1.0 if slope is None else float(slope),
        intercept=0.0 if intercept is None else float(intercept),
    )


class NiftiCase(Case):
    def __init__(
        self,
        path: str,
        header: CaseHeader,
        *,
        dtype: np.dtype[Any],
        offset: int,
        slope: float,
        intercept: float,
    ):
        super().__init__(path, header)
        self._dtype = dtype
        self._offset = offset
        self._slope, self._intercept = slope, intercept
        self._digest = ""

    def raw_slabs(self) -> Iterator[Slab]:
        z, y, x = self.header.shape
        per_slice = y * x * self._dtype.itemsize
        with inputs.opened(self.path) as handle:
            hashing = _Hashing(handle)
            buffered = io.BufferedReader(hashing, 1 << 20)
            magic = buffered.peek(2)[:2]
            stream: BinaryIO = (
                gzip.GzipFile(fileobj=buffered) if magic == _GZIP_MAGIC else buffered  # type: ignore[assignment]
            )
            try:
                _exactly(stream, self._offset, self.path)
                for start in range(0, z, SLAB_ROWS):
                    rows = min(SLAB_ROWS, z - start)
                    data = _exactly(stream, rows * per_slice, self.path)
                    raw = np.frombuffer(data, dtype=self._dtype).reshape(rows, y, x)
                    yield Slab(start, raw, self._slope, self._intercept, self.path)
                buffered.read()  # the rest of the file counts in its digest too
            except EOFError as exc:
                raise RejectError(
                    "truncated", f"the file ends early: {exc}", path=self.path
                ) from exc
            except (OSError, zlib.error) as exc:
                raise RejectError("unreadable", f"cannot read: {exc}", path=self.path) from exc
        self._digest = hashing.sha256.hexdigest()

    def digest(self) -> str:
        return self._digest
