"""The ``filesize`` kind's behaviour: decoded in the workers, free of pydantic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from h5etl.errors import RejectError
from h5etl.kinds.base import Kind, SampleContext
from h5etl.kinds.columns import Column, ScalarColumn, StatsKind

HEAD = 4  # bytes of each file kept in ``<field>_head`` (zeros past a shorter file's end)


@dataclass(frozen=True, slots=True)
class FileSizeKind(Kind):
    kind: ClassVar[str] = "filesize"
    max_bytes: int | None = None  # a larger file is rejected

    @property
    def columns(self) -> Mapping[str, Column]:
        return {
            self.name: ScalarColumn("int64", attrs={"units": "bytes"}),
            f"{self.name}_head": ScalarColumn("uint8", (HEAD,)),
        }

    @property
    def stats(self) -> StatsKind:
        return "channels"

    def decode(self, context: SampleContext) -> dict[str, Any]:
        assert self.source_index is not None
        data = context.contents[self.source_index]
        if self.max_bytes is not None and len(data) > self.max_bytes:
            path = context.path(self.source_index)
            raise RejectError(
                "too_large", f"{path}: {len(data)} bytes, over {self.max_bytes}", path=path
            )
        head = np.zeros(HEAD, np.uint8)
        head[: min(HEAD, len(data))] = np.frombuffer(data[:HEAD], np.uint8)
        return {self.name: len(data), f"{self.name}_head": head}
