"""apply: a sample's transforms run in a worker, after decode and fit, before padding.

Each field's chain runs first (value in, value out, in the config's order), then the
sample-level calls (a dict of their fields in, the same fields out), in order. What comes out
of a field any transform touched must match the field's ``Expectation``. A failure costs the
sample, never the build: an exception in user code is a ``transform_error`` reject (its type,
message and the traceback's last frame), a result the field cannot store is a
``transform_output`` reject. A transform with an ``rng`` parameter gets a generator seeded from
(config seed, sample key, its place in the config), so any ``--jobs``, a resume and a Dask
build give every sample the same numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5etl.errors import RejectError
from h5etl.transforms.loading import CallSpec, canonical_json, function_of

__all__ = [
    "DerivedCall",
    "Expectation",
    "FieldChain",
    "SampleCall",
    "TransformRejected",
    "Transforms",
    "apply_transforms",
    "chain_site",
    "check_results",
    "derive_site",
    "rng_for",
    "run_chain",
    "run_derive",
    "run_sample_calls",
    "sample_site",
]

_MESSAGE = 300  # longest exception message kept (a reject detail is one line)
_SHOWN = 5  # stray labels named in a message


class TransformRejected(RejectError):
    """A sample a transform rejected; ``frame``: where user code raised (``file:line in
    function``), for the rejects file. Pickles whole (workers send it to the parent)."""

    def __init__(self, reason: str, message: str, *, frame: str = ""):
        super().__init__(reason, message)
        self.frame = frame

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.message), {"frame": self.frame, "path": self.path})


@dataclass(frozen=True, slots=True)
class Expectation:
    """What a field stores, as a transform's result must match it (None: not checked).

    ``shape``: exact, None for an axis of any length; ``max_shape``: each axis at most this
    (a field padded to its shape afterwards); ``values``: the mask labels allowed;
    ``classes``: integer labels 0..classes-1.
    """

    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None
    max_shape: tuple[int, ...] | None = None
    values: frozenset[int] | None = None
    classes: int | None = None
    # the dtype itself, made once: numpy's dtypes are shared objects, so a sample's is most
    # often this very one (``dtype.name`` is worked out on every access)
    numpy_dtype: np.dtype[Any] | None = dataclasses.field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        if self.dtype is not None:
            made = np.dtype(self.dtype)
            object.__setattr__(self, "dtype", made.name)
            object.__setattr__(self, "numpy_dtype", made)

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` for this field, or None when it fits."""
        if not isinstance(value, np.ndarray | np.generic | int | float):
            return f"expected {self._what()}, got a {type(value).__name__}"
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        want = self.numpy_dtype
        # ``name`` is the same for either byte order (the row takes either exactly)
        wrong = want is not None and array.dtype is not want and array.dtype.name != self.dtype
        if wrong or not self._fits(array.shape):
            return f"expected {self._what()}, got {array.dtype} {_dims(array.shape)}"
        if self.values is None and self.classes is None:
            return None
        return self._labels(array)

    def _fits(self, shape: tuple[int, ...]) -> bool:
        exact, most = self.shape, self.max_shape
        if exact is not None:
            if len(shape) != len(exact):
                return False
            for have, want in zip(shape, exact, strict=True):
                if want is not None and have != want:
                    return False
        if most is not None:
            if len(shape) != len(most):
                return False
            for have, limit in zip(shape, most, strict=True):
                if have > limit:
                    return False
        return True

    def _labels(self, array: np.ndarray) -> str | None:
        if array.dtype.kind not in "iu":
            return f"expected integer labels, got {array.dtype}"
        found = np.unique(array)
        allowed = self.values if self.values is not None else range(self.classes or 0)
        stray = [int(v) for v in found if int(v) not in allowed]
        if not stray:
            return None
        shown = ", ".join(map(str, stray[:_SHOWN])) + (", ..." if len(stray) > _SHOWN else "")
        if self.values is not None:
            return f"expected mask values in {sorted(self.values)}, got {shown}"
        return f"expected class labels 0..{(self.classes or 0) - 1}, got {shown}"

    def _what(self) -> str:
        parts = [self.dtype or "an array"]
        if self.shape is not None:
            parts.append(_dims(self.shape))
        if self.max_shape is not None:
            parts.append(f"at most {_dims(self.max_shape)}")
        return " ".join(parts)


def _dims(shape: tuple[int | None, ...]) -> str:
    return "(" + " x ".join("any" if n is None else str(n) for n in shape) + ")"


@dataclass(frozen=True, slots=True)
class FieldChain:
    """One field's transforms, value in, value out, in order."""

    field: str
    calls: tuple[CallSpec, ...]


@dataclass(frozen=True, slots=True)
class SampleCall:
    """A sample-level call: gets ``{field: value}`` of ``fields``, returns the same fields."""

    call: CallSpec
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DerivedCall:
    """A field a user function computes from other fields (``derive: {from, call}``): it gets
    the value of the one field in ``sources`` (a dict of them for several), after their
    chains. Its kind runs it (``run_derive``); here for the record and the digests."""

    field: str
    call: CallSpec
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Transforms:
    """Everything a worker needs to run a build's transforms: plain, frozen, picklable."""

    seed: int
    chains: tuple[FieldChain, ...] = ()
    sample_calls: tuple[SampleCall, ...] = ()
    expect: tuple[tuple[str, Expectation], ...] = ()
    derived: tuple[DerivedCall, ...] = ()  # in decode order
    # the fields whose stored value a transform makes, in order of first mention, and their
    # expectations: worked out once, not per sample
    touched: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    checks: tuple[tuple[str, Expectation], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    chain_of: dict[str, FieldChain] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [c.field for c in self.chains] + [f for s in self.sample_calls for f in s.fields]
        touched = tuple(dict.fromkeys(names))
        expect = dict(self.expect)
        object.__setattr__(self, "touched", touched)
        object.__setattr__(self, "checks", tuple((n, expect[n]) for n in touched if n in expect))
        object.__setattr__(self, "chain_of", {c.field: c for c in self.chains})

    def narrowed(self, fields: frozenset[str]) -> Transforms:
        """Only the calls that make ``fields`` (an incremental build making some fields
        again): their chains, derives and the sample-level calls all of whose fields are
        among them. A sample-level call keeps its place among the calls on the same fields
        (``sample_site``), so every random draw is the one a full build makes."""
        return Transforms(
            self.seed,
            tuple(c for c in self.chains if c.field in fields),
            tuple(s for s in self.sample_calls if set(s.fields) <= fields),
            tuple((n, e) for n, e in self.expect if n in fields),
            tuple(d for d in self.derived if d.field in fields),
        )


def chain_site(field: str, position: int) -> str:
    """Where a call of a field's chain sits, for its seed: ``image[0]``."""
    return f"{field}[{position}]"


def sample_site(fields: tuple[str, ...], seen: dict[tuple[str, ...], int]) -> str:
    """Where a sample-level call sits, for its seed: ``sample:image+mask[0]``, counted among
    the calls on the same fields only (``seen`` counts them, in order), so a call added for
    other fields changes no draw of these."""
    position = seen.get(fields, 0)
    seen[fields] = position + 1
    return f"sample:{'+'.join(fields)}[{position}]"


def rng_for(seed: int, key: str, site: str) -> np.random.Generator:
    """The generator of the transform at ``site`` (``chain_site``, ``sample_site``) for sample
    ``key``: SHA-256 of the three, so it depends on nothing a process or a worker has."""
    digest = hashlib.sha256(canonical_json([seed, key, site]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def apply_transforms(transforms: Transforms, key: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a sample's decoded, fitted fields) after ``transforms``; a new dict.

    The three steps (``run_chain``, ``run_sample_calls``, ``check_results``) are public for
    a decoder that runs a field's chain as soon as the field is decoded, so the fields
    derived from it see its transformed value.

    Raises:
        TransformRejected: ``transform_error`` (user code raised) or ``transform_output``
            (a result the field cannot store, or a sample call's result not its fields).
        CodeChanged, CallError: the code cannot be had in this process (not the sample's
            fault: the build stops).
    """
    out = dict(values)
    for chain in transforms.chains:
        out[chain.field] = run_chain(transforms, chain, key, out[chain.field])
    out.update(run_sample_calls(transforms, key, out))
    check_results(transforms, out)
    return out


def run_chain(transforms: Transforms, chain: FieldChain, key: str, value: Any) -> Any:
    """One field's value after its chain (sample ``key``)."""
    for position, spec in enumerate(chain.calls):
        site = chain_site(chain.field, position)
        value = _run(spec, value, transforms.seed, key, site, chain.field)
    return value


def run_sample_calls(transforms: Transforms, key: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values the sample-level calls make, in order, each seeing the ones before."""
    out: dict[str, Any] = {}
    seen: dict[tuple[str, ...], int] = {}
    for step in transforms.sample_calls:
        where = "+".join(step.fields)
        given = {name: out[name] if name in out else values[name] for name in step.fields}
        site = sample_site(step.fields, seen)
        result = _run(step.call, given, transforms.seed, key, site, where)
        if not isinstance(result, Mapping) or set(result) != set(step.fields):
            came = sorted(result) if isinstance(result, Mapping) else f"a {type(result).__name__}"
            raise TransformRejected(
                "transform_output",
                f"{where}: {step.call.text}: expected a dict of {list(step.fields)}, got {came}",
            )
        out.update({name: _contiguous(value) for name, value in result.items()})
    return out


def derive_site(field: str) -> str:
    """Where a derive call sits, for its seed: ``derive:edges``."""
    return f"derive:{field}"


def run_derive(
    call: CallSpec, field: str, seed: int, key: str, value: Any, expectation: Expectation
) -> Any:
    """Field ``field``'s value computed by ``call`` from ``value`` (its source's, or a dict of
    its sources'), checked against ``expectation``; failures as in a chain."""
    result = _run(call, value, seed, key, derive_site(field), field)
    if (problem := expectation.problem(result)) is not None:
        raise TransformRejected("transform_output", f"{field}: {call.text}: {problem}")
    return result


def _run(spec: CallSpec, value: Any, seed: int, key: str, site: str, where: str) -> Any:
    function = function_of(spec)  # outside the try: missing code stops the build
    args = spec.args
    if spec.wants_rng:
        args["rng"] = rng_for(seed, key, site)
    try:
        result = function(value, **args)
    except MemoryError:
        raise  # the decode stage names it memory_error
    except RejectError as exc:  # a built-in refusing a value (cast out of range)
        reason = "transform_output" if exc.reason == "transform_output" else "transform_error"
        raise TransformRejected(reason, f"{where}: {spec.text}: {exc.message}") from exc
    except (Exception, SystemExit) as exc:  # user code: the sample's problem, not the build's
        raise TransformRejected(
            "transform_error",
            f"{where}: {spec.text}: {_described(exc, spec)}",
            frame=_frame(exc, spec),
        ) from exc
    return _contiguous(result)


def _contiguous(value: Any) -> Any:
    """An array result in C order (a crop's view is not; the sink and the digests want it)."""
    return np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value


def check_results(transforms: Transforms, values: Mapping[str, Any]) -> None:
    """Each touched field's final value against its ``Expectation``."""
    for name, expectation in transforms.checks:
        if (problem := expectation.problem(values[name])) is not None:
            raise TransformRejected("transform_output", f"{name}: {problem}")


def _described(exc: BaseException, spec: CallSpec) -> str:
    kind = type(exc)
    module = kind.__module__
    if module == spec.module.loaded_name:
        module = spec.module.name  # an exception class of the module beside the config
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    words = " ".join(str(exc).split())
    if len(words) > _MESSAGE:
        words = words[: _MESSAGE - 3] + "..."
    return f"{name}: {words}" if words else name


def _frame(exc: BaseException, spec: CallSpec) -> str:
    """The deepest frame in the transform's own module file, else the traceback's last one."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    own = [f for f in frames if spec.module.path is not None and f.filename == spec.module.path]
    last = (own or frames)[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"
