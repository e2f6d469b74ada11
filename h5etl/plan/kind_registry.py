"""A whole spec's kinds, built through the kind registry (``h5etl.config.fields.registry``).

Parent side only (it reads the pydantic config); workers receive the built kinds. Each field's
registry entry builds its behaviour from its config model and a ``BuildContext`` view of the
spec; the layout record of a kind that is not built in carries its reader hints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from h5etl.config.fields import ImageField, MaskField
from h5etl.config.fields.builtin import array_layout
from h5etl.config.fields.entry import BuildContext
from h5etl.config.fields.registry import REGISTRY, entry_of
from h5etl.config.spec import Spec
from h5etl.errors import ConfigError
from h5etl.format.codec import ChunkLayout
from h5etl.format.contract import FieldRecord
from h5etl.format.reader_hints import HINTS_KEY
from h5etl.inputs import extras, urls
from h5etl.kinds.base import Kind

if TYPE_CHECKING:
    from h5etl.plan.user_code import UserCode


def build_context(spec: Spec, name: str) -> BuildContext:
    """What the builder of field ``name`` may know of ``spec``."""
    return BuildContext(
        name=name,
        sources=tuple(spec.sources),
        source=spec.source_of(name),
        source_dirs={n: s.dir for n, s in spec.sources.items()},
        source_globs={n: s.glob for n, s in spec.sources.items()},
        fields=dict(spec.fields),
        storage=spec.storage,
        pad=spec.pad,
    )


def layout_of(spec: Spec, name: str) -> ChunkLayout:
    """How an array field is stored: shape, dtype, chunks and filters."""
    field = spec.fields[name]
    assert isinstance(field, ImageField | MaskField)
    return array_layout(field, build_context(spec, name))


def kinds_of(spec: Spec) -> tuple[Kind, ...]:
    """Every field's behaviour, in config order (a field a user function derives holds its
    resolved call: ``h5etl.plan.user_code``)."""
    kinds = tuple(
        entry_of(field.kind).build(name, field, build_context(spec, name))
        for name, field in spec.fields.items()
    )
    if any(isinstance(f, ImageField) and f.derive and f.derive.call for f in spec.fields.values()):
        from h5etl.plan.user_code import with_derive_calls

        kinds = with_derive_calls(spec, kinds)
    return kinds


def plugin_notes(spec: Spec) -> list[str]:
    """What ``h5etl validate`` says of the kinds ``spec`` takes from plugins (third-party
    code a build runs), and of plugins set aside."""
    notes = [
        f"note: fields.{name}: kind {field.kind} comes from {REGISTRY.plugins[field.kind]}"
        for name, field in spec.fields.items()
        if field.kind in REGISTRY.plugins
    ]
    return notes + [f"note: {line}" for line in REGISTRY.ignored]


def check_user_code(spec: Spec) -> UserCode:
    """Resolve ``spec``'s calls now (``validate``, every build): a call that cannot run stops
    it before any work.

    Raises:
        ConfigError: as ``user_code``.
    """
    from h5etl.plan.user_code import user_code

    return user_code(spec, kinds_of(spec))


def user_code_notes(spec: Spec) -> list[str]:
    """What ``validate`` says of a config that names user code: that building it runs that
    code, and which modules it imported (none named: nothing said)."""
    code = check_user_code(spec)
    if code.transforms is None:
        return []
    modules = ", ".join(
        f"{m.name} ({m.path})" if m.origin == "beside_config" else f"{m.name} (installed)"
        for m in code.imported
    )
    calls = sum(len(c.calls) for c in code.transforms.chains)
    calls += len(code.transforms.sample_calls) + len(code.transforms.derived)
    lines = [f"note: this config runs code: {calls} transform call(s)"]
    if modules:
        lines[0] += f"; building it runs the modules {modules}, with your permissions"
    else:
        lines[0] += " (built-ins of h5etl only)"
    return lines


def worker_modules(spec: Spec) -> tuple[str, ...]:
    """What a worker imports to decode ``spec``'s fields, and to read its sources when they
    are on object storage, each module once."""
    modules = [m for kind in kinds_of(spec) for m in kind.worker_modules]
    if any(urls.is_remote(str(source.dir)) for source in spec.sources.values()):
        modules += urls.REMOTE_READING
    return tuple(dict.fromkeys(modules))


def check_installed(spec: Spec) -> None:
    """Every optional library ``spec``'s fields are read with is installed (``h5etl
    validate``, every build and dry run, ``demo``): found before any work, not as a reject
    per sample.

    Raises:
        ConfigError: one line naming the fields, the libraries and the extra to install.
    """
    missing: dict[str, list[str]] = {}  # module -> the fields that need it
    for kind in kinds_of(spec):
        for module in kind.optional_modules:
            if not extras.installed(module):
                missing.setdefault(module, []).append(kind.name)
    if not missing:
        return
    fields = dict.fromkeys(name for names in missing.values() for name in names)
    kinds = dict.fromkeys(spec.kind_of(name) for name in fields)
    raise ConfigError(
        f"fields {', '.join(fields)} ({', '.join(kinds)}) are read with "
        f"{' and '.join(missing)}, not installed here: {extras.install_hint(missing)}",
        path=spec.config_file,
    )


def decode_order(kinds: Sequence[Kind]) -> tuple[int, ...]:
    """Positions of ``kinds`` in an order where each comes after the fields it depends on."""
    by_name = {kind.name: i for i, kind in enumerate(kinds)}
    order: list[int] = []
    placed: set[int] = set()

    def visit(i: int) -> None:
        if i in placed:
            return
        placed.add(i)
        for dependency in kinds[i].depends_on:
            visit(by_name[dependency])
        order.append(i)

    for i in range(len(kinds)):
        visit(i)
    return tuple(order)


def layout_records(kinds: Sequence[Kind]) -> dict[str, FieldRecord]:
    """Each field's layout record; a plugin kind's carries its reader hints (readers cannot
    ask the registry), a built-in kind's does not (``h5etl.format.reader_hints`` has them)."""
    return {kind.name: _record(kind) for kind in kinds}


def _record(kind: Kind) -> FieldRecord:
    record = kind.record()
    if REGISTRY.is_builtin(kind.kind) or kind.kind not in REGISTRY.entries:
        return record
    hints = entry_of(kind.kind).reader_hints.as_json()
    return replace(record, extra={**record.extra, HINTS_KEY: hints})
