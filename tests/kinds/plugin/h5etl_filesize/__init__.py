"""An h5etl field kind: each sample's file size (int64) and its first ``HEAD`` bytes.

The behaviour (``kind``) is what decode workers import, so it imports only
``h5etl.kinds.base`` and below; the config model and the registry entry (``entry``, named by
the ``h5etl.kinds`` entry point) import ``h5etl.kind_api``, parent side. This package's own
``__init__`` imports neither: a worker unpickling the kind imports the package first.
"""
