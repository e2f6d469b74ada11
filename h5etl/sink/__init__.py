"""The single writer: the only code that writes HDF5."""

# Every sink module reads or writes Blosc and Zstd datasets (a parent's rows, a re-cut
# block): the filters are registered with HDF5 once, here, for all of them.
import hdf5plugin  # noqa: F401
