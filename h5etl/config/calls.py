"""The config keys that name user code (issue 28): a field's ``transform`` chain, the
sample-level ``transforms`` and a derive's ``call``. Only their shape is checked here; the
calls themselves are resolved (their modules imported, their arguments bound) by
``h5etl.plan.user_code``, at ``validate``, before any work."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from h5etl.config.sections import Strict

__all__ = ["CallModel", "SampleCallModel"]


class CallModel(Strict):
    """One call: ``package.module:function`` (or ``module:function`` with ``module.py``
    beside the config, or a built-in's name) and its keyword arguments."""

    call: Annotated[str, Field(min_length=1)]
    args: dict[str, Any] = Field(default_factory=dict)


class SampleCallModel(CallModel):
    """A sample-level call: gets ``{field: value}`` of ``fields``, returns the same fields."""

    fields: Annotated[list[str], Field(min_length=1)]
