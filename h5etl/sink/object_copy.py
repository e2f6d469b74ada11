"""object_copy: HDF5's object copy (``H5Ocopy``) with the GIL released while it runs.

Part of the sink (the only code that writes HDF5). An incremental build creates each split's
array datasets as copies of its parent's (``parent_rows.seed_dataset``) while this process
decodes the new samples in its threads (``local_threads``). h5py up to 3.16 holds the
GIL through ``H5Ocopy`` (h5py's pull request 2931 releases it, not yet in a release), so the
decoders stopped at their first line of Python for the whole copy: 0.07-0.16 s of 170 MiB
here, 0.4 s with the parent's pages to read from the disk. ``copy_object`` makes the same
call as ``h5py.Group.copy`` (the same property lists, so the same bytes) through ctypes on
the libhdf5 h5py itself loaded, holding h5py's lock as h5py does around its own GIL-free
calls: no other thread enters HDF5 meanwhile, and the other threads' Python runs. Where that
library cannot be found (no ``/proc``, a libhdf5 of another version), h5py's copy runs.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
from typing import Any

import h5py

logger = logging.getLogger(__name__)

# libhdf5.so.320, libhdf5-9e18f0c6.so.320.0.0 (a wheel's bundled copy); not libhdf5_hl
_LIBRARY_NAME = re.compile(r"^libhdf5(-[0-9a-f]+)?\.so(\.\d+)*$")
_MAPS = "/proc/self/maps"


def loaded_libraries(maps: str = _MAPS) -> list[str]:
    """The paths of the libhdf5 shared objects mapped into this process (none without
    ``/proc``), in the order the maps list them."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        parts = line.split(maxsplit=5)
        path = parts[5].strip() if len(parts) == 6 else ""
        if _LIBRARY_NAME.match(os.path.basename(path)) and path not in found:
            found.append(path)
    return found


def _version_of(library: Any) -> tuple[int, int, int]:
    numbers = [ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()]
    if library.H5get_libversion(*(ctypes.byref(n) for n in numbers)) < 0:
        return (0, 0, 0)
    return (numbers[0].value, numbers[1].value, numbers[2].value)


@functools.cache
def _h5ocopy() -> Any | None:
    """``H5Ocopy`` of the one libhdf5 h5py runs on, typed for ctypes (which releases the GIL
    around the call), or None: not exactly one such library, or not h5py's version."""
    libraries = loaded_libraries()
    if len(libraries) != 1:
        logger.debug("libhdf5 mapped %d times: object copies hold the GIL", len(libraries))
        return None
    try:
        library = ctypes.CDLL(libraries[0])  # the one already mapped: dlopen returns it
        if _version_of(library) != h5py.version.hdf5_version_tuple[:3]:
            return None
        function = library.H5Ocopy
    except (OSError, AttributeError) as exc:
        logger.debug("cannot reach H5Ocopy in %s (%s)", libraries[0], exc)
        return None
    hid = ctypes.c_int64  # hid_t since HDF5 1.10, the oldest h5py 3 builds on
    function.argtypes = [hid, ctypes.c_char_p, hid, ctypes.c_char_p, hid, hid]
    function.restype = ctypes.c_int  # herr_t
    return function


def _property_lists(without_attrs: bool) -> tuple[Any, Any]:
    """The object-copy and link-create property lists ``h5py.Group.copy`` passes."""
    copy = h5py.h5p.create(h5py.h5p.OBJECT_COPY)
    copy.set_copy_object(h5py.h5o.COPY_WITHOUT_ATTR_FLAG if without_attrs else 0)
    link = h5py.h5p.create(h5py.h5p.LINK_CREATE)
    link.set_create_intermediate_group(True)
    return copy, link


def copy_object(
    source: h5py.Dataset | h5py.Group, group: h5py.Group, name: str, *, without_attrs: bool
) -> bool:
    """Copy ``source`` (of any open file) to ``group[name]`` as ``group.copy`` would; return
    whether the GIL was released for it (False: h5py's own copy ran).

    Raises:
        OSError: HDF5 could not copy it (the disk filled, a read failed).
    """
    function = _h5ocopy()
    if function is None:
        group.copy(source, group, name=name, without_attrs=without_attrs)
        return False
    copy, link = _property_lists(without_attrs)
    with h5py._objects.phil:  # h5py's own lock: no other thread enters HDF5 meanwhile
        status = function(source.id.id, b".", group.id.id, name.encode(), copy.id, link.id)
    if status < 0:
        raise OSError(f"HDF5 could not copy {source.name} into {group.file.filename}")
    return True
