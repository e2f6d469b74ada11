"""Where each config key belongs, and the config's words for pydantic's.

The keys of every section are read from the config models, so a key added to a model is
known here at once: a key written in the wrong section is told where it belongs
(``belongs``), and messages never show a model's class name (``plain_words``).
"""

from __future__ import annotations

import functools
import re

from pydantic import BaseModel

from h5etl.fieldspecs import FIELD_MODELS
from h5etl.spec import Compression, DecodeSpec, PadSpec, SourceSpec, Spec, StorageSpec
from h5etl.specparts import GroupBy

Key = tuple[str | int, ...]


def keys_of(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


FIELD_KEYS = sorted({k for m in FIELD_MODELS.values() for k in keys_of(m)})

# The keys of the mapping at each key path (None: any name), and how a message says where
# that mapping is: for "did you mean", and for "belongs under" when a key is in the wrong one.
SECTIONS: list[tuple[tuple[str | None, ...], list[str], str]] = [
    ((), [k for k in keys_of(Spec) if k != "group_by"], "at the top level"),
    (("storage",), keys_of(StorageSpec), "under storage:"),
    (("pad",), keys_of(PadSpec), "under pad:"),
    (("decode",), keys_of(DecodeSpec), "under decode:"),
    (("splits",), ["group_by"], "under splits:"),
    (("splits", "group_by"), keys_of(GroupBy), "under splits.group_by:"),
    (("sources", None), keys_of(SourceSpec), "under a source, sources.<name>:"),
    (("fields", None), FIELD_KEYS, "under a field, fields.<name>:"),
    (("storage", "compression"), keys_of(Compression), "under storage.compression:"),
    (("fields", None, "compression"), keys_of(Compression), "under fields.<name>.compression:"),
]
# Mappings of user-named entries: what one entry is called, and an example of the map.
NAMED = {
    "sources": ("source", "sources: {images: {dir: raw/images, glob: '*.png'}}"),
    "fields": ("field", "fields: {image: {shape: [3, 224, 224]}}"),
    "splits": ("split", "splits: {train: 0.8, valid: 0.2}"),
}


def matches(pattern: tuple[str | None, ...], parent: Key) -> bool:
    return len(pattern) == len(parent) and all(
        want is None or want == part for want, part in zip(pattern, parent, strict=True)
    )


def belongs(name: str, parent: Key) -> str | None:
    """Where a key that ``parent``'s mapping does not take belongs, if any other does:
    ``"compression belongs under storage: (or under a field, fields.<name>:)"``."""
    places = [
        where for pattern, keys, where in SECTIONS if name in keys and not matches(pattern, parent)
    ]
    if not places:
        return None
    more = f" (or {', '.join(places[1:3])})" if len(places) > 1 else ""
    return f"{name} belongs {places[0]}{more}"


@functools.cache
def _model_names() -> frozenset[str]:
    """The names of every config model class: internal words no message may show."""
    names, todo = set(), [BaseModel]
    while todo:
        for model in todo.pop().__subclasses__():
            todo.append(model)
            if model.__module__.startswith("h5etl."):
                names.add(model.__name__)
    return frozenset(names)


_INSTANCE_OF = re.compile(
    r"(a valid dictionary or )?(object to extract fields from|instance of \w+)"
)


def plain_words(message: str) -> str:
    """A pydantic message in the config's words: no model class names (``instance of
    SourceSpec`` is "a mapping of keys to values")."""
    message = _INSTANCE_OF.sub("a mapping of keys to values", message)
    for name in _model_names():
        message = re.sub(rf"\b{name}\b", "a mapping", message) if name in message else message
    return message
