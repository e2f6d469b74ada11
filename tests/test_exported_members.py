"""The public API is small and explicit: ``h5etl.__all__`` is pinned here."""

from __future__ import annotations

from pathlib import Path

import h5etl

EXPECTED = [
    "BuildFailed",
    "BuildReport",
    "CheckFailed",
    "ConfigError",
    "H5EtlError",
    "ReleaseError",
    "SinkError",
    "Spec",
    "UsageError",
    "__version__",
    "build",
    "load_spec",
]


def test_all_is_pinned_and_sorted() -> None:
    # changing the public API is a decision: update EXPECTED (and the changelog) with it
    assert h5etl.__all__ == EXPECTED
    assert h5etl.__all__ == sorted(h5etl.__all__)


def test_every_exported_name_exists_and_belongs_to_h5etl() -> None:
    for name in h5etl.__all__:
        member = getattr(h5etl, name)
        if name != "__version__":
            assert member.__module__.startswith("h5etl."), name


def test_errors_share_one_root() -> None:
    for name in ("BuildFailed", "CheckFailed", "ConfigError", "ReleaseError", "SinkError"):
        assert issubclass(getattr(h5etl, name), h5etl.H5EtlError)
    assert h5etl.ConfigError.exit_code == 2
    assert issubclass(h5etl.UsageError, h5etl.H5EtlError)
    assert h5etl.UsageError.exit_code == 2


def test_package_is_typed() -> None:
    assert (Path(h5etl.__file__).parent / "py.typed").is_file()


KIND_API = [
    "GROUP",
    "ArrayColumn",
    "BuildContext",
    "Builder",
    "ChunkLayout",
    "Codec",
    "Column",
    "Expectation",
    "FieldModel",
    "FieldRecord",
    "Kind",
    "KindDefinitionError",
    "KindEntry",
    "Prepared",
    "ProbeTarget",
    "RaggedColumn",
    "ReaderHints",
    "RejectError",
    "Sample",
    "SampleContext",
    "ScalarColumn",
    "StatsKind",
    "TextColumn",
    "check_hooks",
    "own_or_first",
]


def test_the_kind_authors_api_is_pinned() -> None:
    # what a plugin kind imports (h5etl.kind_api): changing it breaks plugins, so it is a
    # decision like the public API's
    from h5etl import kind_api

    assert kind_api.__all__ == KIND_API  # in ruff's order (RUF022: constants first)
    for name in kind_api.__all__:
        assert hasattr(kind_api, name), name
