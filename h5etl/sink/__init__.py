"""The single writer: the only code that writes HDF5."""
