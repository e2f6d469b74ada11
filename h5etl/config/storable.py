"""What HDF5 stores exactly, checked when a config is read rather than when a file is finished.

Text without NUL characters and valid UTF-8, integers within 64 bits, attribute names HDF5 will
neither refuse nor truncate. ``Text`` and ``AttrValue`` are pydantic types for the config.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

__all__ = ["AttrValue", "Text", "attr_name_problem"]

INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
MAX_ATTR_NAME_BYTES = 65534  # HDF5's limit on an attribute name (UTF-8, without the NUL)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}..."


def _storable_text(text: str) -> str:
    """A string HDF5 stores as it is: no NUL (it ends C strings), valid UTF-8."""
    if "\x00" in text:
        raise ValueError(f"HDF5 text cannot hold a NUL character (\\0), got {_shown(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text must be valid UTF-8, got {_shown(text)}") from exc
    return text


def _storable_attr(value: Any) -> Any:
    """An attribute value h5py stores exactly: text as above, integers in 64 bits."""
    if isinstance(value, str):
        return _storable_text(value)
    if isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                _storable_text(item)
            elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
                # numpy turns such a list into float64 (or objects HDF5 cannot store)
                raise ValueError(
                    f"integers in a list must fit in int64 ({INT64_MIN}..{INT64_MAX}), got "
                    f"{item}; write it as a string"
                )
    elif isinstance(value, int) and not INT64_MIN <= value <= UINT64_MAX:
        raise ValueError(
            f"integers must fit in 64 bits ({INT64_MIN}..{UINT64_MAX}), got {value}; "
            f"write it as a string"
        )
    return value


def attr_name_problem(name: str) -> str | None:
    """Why HDF5 would refuse (or truncate) an attribute name, or None."""
    if not name:
        return "attribute names cannot be empty"
    if "\x00" in name:
        return f"attribute names cannot hold a NUL character (\\0), got {_shown(name)}"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return f"attribute names must be valid UTF-8, got {_shown(name)}"
    if size > MAX_ATTR_NAME_BYTES:
        return (
            f"attribute names must be at most {MAX_ATTR_NAME_BYTES} bytes of UTF-8, got {size} "
            f"({_shown(name)})"
        )
    return None


Text = Annotated[str, AfterValidator(_storable_text)]
AttrValue = Annotated[
    str | int | float | bool | list[str] | list[int] | list[float],
    AfterValidator(_storable_attr),
]
