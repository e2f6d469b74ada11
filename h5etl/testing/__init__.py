"""Test helpers a field kind's tests inherit: the checklist every kind must pass, written once.

``KindContractTests`` (like zarr's ``StoreTests``) is a base class a kind's test module
subclasses, giving only a tiny raw folder, its config, a way to break one input and the values
it expects; the suite builds real releases and asserts on the files (``--jobs 1`` and ``2``
equal, ``check --deep``, resume after a kill, rejects, reproducible bytes, the readers).
It imports pytest, so nothing in h5etl imports it (the import contract says so).
"""

from __future__ import annotations

from h5etl.testing.kill import run_killed_build
from h5etl.testing.kinds import Broken, KindContractTests

__all__ = ["Broken", "KindContractTests", "run_killed_build"]
