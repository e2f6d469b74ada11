"""Per-sample JSON sidecars: a source of ``.json`` files paired with the others by stem."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from h5etl.errors import RejectError
from h5etl.kinds.base import SampleContext


def json_value(context: SampleContext, source_index: int, key: str) -> Any:
    """The value at ``key`` (dots go deeper: ``scanner.model``) of the sample's JSON sidecar,
    or None when it has no such key; the document is parsed once per sample."""
    document = context.parsed.get(source_index)
    if document is None:
        path = context.path(source_index)
        try:
            document = json.loads(context.contents[source_index])
        except (UnicodeDecodeError, ValueError) as exc:
            raise RejectError("bad_sidecar", f"not valid JSON: {exc}", path=path) from exc
        if not isinstance(document, dict):
            raise RejectError(
                "bad_sidecar",
                f"a sidecar must be a JSON object, got {type(document).__name__}",
                path=path,
            )
        context.parsed[source_index] = document
    value: Any = document
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def typed_value(value: Any, dtype: str, where: str) -> Any:
    """``value`` as a number of ``dtype``, exactly, or a ``bad_value`` reject saying why."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):  # JSON 0/1, as the CSV cells "0"/"1"
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in {"true", "false", "1", "0"}:
            return value.strip().lower() in {"true", "1"}
        raise RejectError("bad_value", f"{where}: expected true or false, got {value!r}")
    number = _number(value, where)
    if kind == "i":
        info = np.iinfo(dtype)
        if isinstance(number, float):
            if not number.is_integer():
                raise RejectError("bad_value", f"{where}: expected an integer, got {value!r}")
            number = int(number)
        if not info.min <= number <= info.max:
            raise RejectError("bad_value", f"{where}: {number} is outside {dtype}")
        return number
    as_float = float(number)
    if not math.isfinite(as_float):
        raise RejectError("bad_value", f"{where}: {value!r} is not a finite number")
    with np.errstate(over="ignore"):  # beyond float32: inf, which is no exact value either
        narrowed = float(np.float32(as_float)) if dtype == "float32" else as_float
    if narrowed != as_float:
        raise RejectError(
            "bad_value", f"{where}: {value!r} is not exact in float32; use dtype float64"
        )
    return as_float


def text_value(value: Any, where: str) -> str:
    """A cell or JSON value as text: strings as they are, numbers and true/false as JSON
    writes them (``41``, ``2.5``, ``true``); a list or an object is a ``bad_value``."""
    if isinstance(value, str):
        if "\x00" in value:  # HDF5 strings end at a NUL: the build could not store it
            raise RejectError("bad_value", f"{where}: text holds a NUL character (\\0)")
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    raise RejectError(
        "bad_value", f"{where}: expected text, a number or true/false, got {json.dumps(value)}"
    )


def _number(value: Any, where: str) -> int | float:
    if isinstance(value, bool):  # JSON true is no number: 1.0 would be a silent guess
        raise RejectError("bad_value", f"{where}: expected a number, got {json.dumps(value)}")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                pass
    raise RejectError("bad_value", f"{where}: expected a number, got {value!r}")
