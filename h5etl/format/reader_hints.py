"""What a reader may assume of a field's values, by kind: one table for the built-in kinds.

Readers cannot import the kinds nor the config (layers), so what they need to know of a kind
lives here. The kind registry's built-in entries take their hints from ``BUILTIN_HINTS``; a
plugin kind's hints travel in its field's layout record (``HINTS_KEY``), written only for
kinds that are not built in, so that releases of built-in kinds keep their bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from h5etl.format.contract import FieldRecord

__all__ = ["BUILTIN_HINTS", "HINTS_KEY", "ReaderHints", "hints_of"]

HINTS_KEY = "reader_hints"  # the layout record's key of a plugin kind's hints

KerasRole = Literal["input", "target"]


@dataclass(frozen=True, slots=True)
class ReaderHints:
    """What readers may assume of a field's main column (its other columns: nothing).

    ``channels_first``: a fixed (N, C, H, W) array; a channels-last batch moves its axis.
    ``class_indices``: integer class indices into the record's ``classes``, read as int64.
    ``keras``: the part the field plays in Keras's default ``(x, y)``; among fields of one
    role the lowest ``keras_rank`` wins (then the layout's order).
    """

    channels_first: bool = False
    class_indices: bool = False
    keras: KerasRole | None = None
    keras_rank: int = 9

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ReaderHints:
        """Hints as a layout record holds them; unknown keys (a newer h5etl's) are ignored."""
        if not isinstance(data, Mapping):
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


BUILTIN_HINTS: dict[str, ReaderHints] = {
    "image": ReaderHints(channels_first=True, keras="input", keras_rank=0),
    "mask": ReaderHints(channels_first=True, keras="target", keras_rank=0),
    "label": ReaderHints(class_indices=True, keras="target", keras_rank=1),
    "text": ReaderHints(),
    "value": ReaderHints(),
    "volume": ReaderHints(),
    "series": ReaderHints(),
}


def hints_of(record: FieldRecord) -> ReaderHints:
    """The hints of a field (or of one of its storage columns) as its release records it."""
    builtin = BUILTIN_HINTS.get(record.kind)
    if builtin is not None:
        return builtin
    return ReaderHints.from_json(record.extra.get(HINTS_KEY))
