"""loading: a call the config names (``mylab.prep:window``, ``crop``), resolved and checked.

The parent resolves each call once, at ``validate``: it imports the module the call names (and
no other), finds the function, and binds the call's arguments to its signature, so a call that
cannot run is a config error before any work. What it returns, a ``CallSpec``, is plain data:
workers (loky processes, threads, Dask workers) get the spec, never a function, and resolve it
again with ``function_of``, once per process.

Where a module comes from:

- a built-in (``crop``, no colon): ``h5etl.transforms.builtin``;
- a file beside the config (``prep:window`` and ``<config folder>/prep.py``): read once, its
  bytes and their SHA-256 travel in the spec, and every process runs those bytes under a name
  of their own (``_h5etl_user_prep_<sha>``). The file wins over an installed module of the
  same name; nothing is added to ``sys.path``, so the file's neighbours are not importable by
  accident (code split over files is a package: install it);
- otherwise an importable module (``importlib.import_module``): installed where h5etl is,
  on every worker; a worker checks the module's file still has the bytes the parent recorded.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from h5etl.errors import H5EtlError
from h5etl.transforms import builtin

__all__ = [
    "BUILTIN_MODULE",
    "CallError",
    "CallSpec",
    "CodeChanged",
    "Loader",
    "ModuleRef",
    "canonical_json",
    "function_of",
]

Origin = Literal["builtin", "beside_config", "installed"]
BUILTIN_MODULE = builtin.__name__
RNG = "rng"  # the parameter a transform declares to be given its per-sample generator

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_WORDS = 400  # longest argument text quoted in a message


class CallError(H5EtlError):
    """A call the config names cannot be used: not importable, not callable, or its arguments
    do not fit; one line naming the call. The config layer raises it as a ``ConfigError``."""

    exit_code = 2

    def __init__(self, call: str, problem: str):
        super().__init__(f"{call}: {problem}")
        self.call = call


class CodeChanged(H5EtlError):
    """A worker's copy of an installed transform module is not the code the build recorded
    (the file was edited mid-build, or a Dask worker has another version): its results would
    not be what the release says made them."""


@dataclass(frozen=True, slots=True)
class ModuleRef:
    """Where a call's module comes from; ``source`` (the file's bytes) only for a module
    beside the config, which workers run from these bytes rather than from the disk."""

    name: str
    origin: Origin
    path: str | None
    sha256: str | None
    source: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def loaded_name(self) -> str:
        """The name the module has in ``sys.modules`` of every process that runs it."""
        if self.origin == "beside_config":
            # the path too: the same bytes in two folders are two modules, each with its file
            # in tracebacks
            tag = _sha256(f"{self.path}\0{self.sha256}".encode())[:16]
            return f"_h5etl_user_{self.name}_{tag}"
        return self.name


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One resolved call, as workers get it: plain, frozen, picklable.

    ``text``: the call as the config wrote it; ``attr``: the attribute path in the module
    (``window``, ``Prep.window``); ``args_json``: its arguments as canonical JSON;
    ``wants_rng``: the function declares an ``rng`` parameter.
    """

    text: str
    module: ModuleRef
    attr: str
    args_json: str
    wants_rng: bool

    @property
    def args(self) -> dict[str, Any]:
        """A fresh copy of the arguments (a function that changes its dict changes no other
        sample's)."""
        if self.args_json == "{}":
            return {}
        args: dict[str, Any] = json.loads(self.args_json)
        return args


def canonical_json(value: object) -> str:
    """The one JSON text of ``value``: sorted keys, no spaces, no NaN; raises ``TypeError``
    or ``ValueError`` for what JSON cannot hold."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Loader:
    """Resolves the calls of one config, importing only the modules they name.

    ``config_dir``: the config's folder, where a module file beside the config is looked for
    (None: only built-ins and installed modules). ``imported``: every module resolved so far,
    in the order first named: what the build records as the code it ran.
    """

    def __init__(self, config_dir: Path | None):
        self.config_dir = config_dir
        self._modules: dict[str, tuple[ModuleRef, ModuleType]] = {}

    @property
    def imported(self) -> tuple[ModuleRef, ...]:
        return tuple(ref for ref, _ in self._modules.values() if ref.origin != "builtin")

    def resolve(self, text: str, args: Mapping[str, Any] | None = None) -> CallSpec:
        """The spec of the call ``text`` with ``args`` (keyword arguments after the value).

        Raises:
            CallError: the call is malformed, its module cannot be imported, the attribute is
                missing or not callable, or ``args`` are not JSON values or do not fit the
                function's signature.
        """
        module_name, attr = _split(text)
        ref, module = self._module(text, module_name)
        function = _attribute(text, module, attr)
        given = dict(args or {})
        try:
            args_json = canonical_json(given)
        except (TypeError, ValueError) as exc:
            raise CallError(text, f"arguments must be plain YAML values: {exc}") from exc
        wants_rng = _check_signature(text, function, given)
        if ref.origin == "builtin":
            _check_builtin(text, attr, given)
        return CallSpec(text, ref, attr, args_json, wants_rng)

    def _module(self, text: str, name: str) -> tuple[ModuleRef, ModuleType]:
        if name not in self._modules:
            self._modules[name] = _import(text, name, self.config_dir)
        return self._modules[name]


def _split(text: str) -> tuple[str, str]:
    """(module, attribute path) of ``package.module:function`` or of a built-in's name."""
    if ":" not in text:
        if text not in builtin.BUILTINS:
            names = ", ".join(sorted(builtin.BUILTINS))
            raise CallError(
                text,
                f"no built-in transform of that name (built-ins: {names}); "
                "name your own as module:function",
            )
        return BUILTIN_MODULE, text
    module, _, attr = text.partition(":")
    if not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(attr):
        raise CallError(text, "a call is package.module:function (dotted names, one colon)")
    return module, attr


def _import(text: str, name: str, config_dir: Path | None) -> tuple[ModuleRef, ModuleType]:
    if name == BUILTIN_MODULE:
        return ModuleRef(name, "builtin", None, None), builtin
    beside = config_dir / f"{name}.py" if config_dir is not None and "." not in name else None
    if beside is not None and beside.is_file():
        try:
            source = beside.read_bytes()
        except OSError as exc:
            raise CallError(text, f"cannot read {beside}: {exc.strerror or exc}") from exc
        ref = ModuleRef(name, "beside_config", str(beside), _sha256(source), source)
        return ref, _run_source(text, ref)
    module = _import_installed(text, name)
    return ModuleRef(name, "installed", module.__file__, _installed_sha256(text, module)), module


def _import_installed(text: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.split(".")[0] == exc.name.split(".")[0]:
            raise CallError(
                text,
                f"no module {name!r}: put {name.split('.')[0]}.py beside the config, "
                "or install the package that holds it",
            ) from exc
        raise CallError(text, f"importing {name} failed: {_one_line(exc)}") from exc
    except Exception as exc:  # the module's own code failed: say so, never crash validate
        raise CallError(text, f"importing {name} failed: {_one_line(exc)}") from exc


_HASHES: dict[
    str, str | None
] = {}  # an installed module's file, hashed when this process imported it


def _installed_sha256(text: str, module: ModuleType) -> str | None:
    """The SHA-256 of ``module``'s file as this process first saw it (the code it runs: a file
    edited later does not change a module already imported), None for one without a file."""
    if module.__name__ not in _HASHES:
        path = getattr(module, "__file__", None)
        try:
            _HASHES[module.__name__] = _sha256(Path(path).read_bytes()) if path else None
        except OSError as exc:
            raise CallError(text, f"cannot read {path}: {exc.strerror or exc}") from exc
    return _HASHES[module.__name__]


def _run_source(text: str, ref: ModuleRef) -> ModuleType:
    """The module ``ref``'s bytes make, registered under its ``loaded_name`` (once per
    process: dataclasses and pickling find a module by that name)."""
    name = ref.loaded_name
    if name in sys.modules:
        return sys.modules[name]
    assert ref.source is not None  # a module beside the config always has its bytes
    assert ref.path is not None
    module = ModuleType(name)
    module.__file__ = ref.path
    sys.modules[name] = module
    try:
        exec(compile(ref.source, ref.path, "exec"), module.__dict__)  # the user's own code
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CallError(text, f"running {ref.path} failed: {_one_line(exc)}") from exc
    return module


def _attribute(text: str, module: ModuleType, attr: str) -> Callable[..., Any]:
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError as exc:
            where = getattr(module, "__file__", None) or module.__name__
            raise CallError(text, f"{where} has no {attr!r}") from exc
    if not callable(found):
        raise CallError(text, f"{attr} is a {type(found).__name__}, not a function")
    function: Callable[..., Any] = found
    return function


def _check_signature(text: str, function: Callable[..., Any], args: dict[str, Any]) -> bool:
    """Whether ``function`` wants an ``rng``; raises ``CallError`` when ``args`` do not fit
    (the value comes first, positionally; ``rng`` is h5etl's to give)."""
    if RNG in args:
        raise CallError(text, f"{RNG!r} is given by h5etl (seeded per sample), not in args")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return False  # a C function without a signature: its arguments are checked when it runs
    wants_rng = RNG in signature.parameters
    try:
        signature.bind(object(), **args, **({RNG: None} if wants_rng else {}))
    except TypeError as exc:
        raise CallError(text, f"arguments {_shown(args)} do not fit {signature}: {exc}") from exc
    return wants_rng


def _check_builtin(text: str, attr: str, args: dict[str, Any]) -> None:
    entry = builtin.BUILTINS.get(attr)  # None: another function of the module, named in full
    if entry is None:
        return
    try:
        entry.check(**args)
    except (TypeError, ValueError) as exc:
        raise CallError(text, str(exc)) from exc


def _shown(args: Mapping[str, Any]) -> str:
    shown = canonical_json(dict(args))
    return shown if len(shown) <= _WORDS else shown[: _WORDS - 3] + "..."


def _one_line(exc: BaseException) -> str:
    words = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {words}" if words else type(exc).__name__


# --- worker side: a spec back to its function, once per process ----------------------------

_LOCK = threading.Lock()  # in-process threads resolve concurrently
_FUNCTIONS: dict[tuple[str, str | None, str | None, str], Callable[..., Any]] = {}


def function_of(spec: CallSpec) -> Callable[..., Any]:
    """The function ``spec`` names, in this process (cached: one import per process).

    Raises:
        CodeChanged: an installed module's file no longer has the bytes the parent recorded.
        CallError: the module cannot be imported here (a Dask worker without the package).
    """
    ref = spec.module
    key = (ref.name, ref.path, ref.sha256, spec.attr)  # per sample: no hashing of its own
    found = _FUNCTIONS.get(key)
    if found is not None:
        return found
    with _LOCK:
        if key not in _FUNCTIONS:
            _FUNCTIONS[key] = _attribute(spec.text, _module_here(spec), spec.attr)
        return _FUNCTIONS[key]


def _module_here(spec: CallSpec) -> ModuleType:
    ref = spec.module
    if ref.origin == "builtin":
        return builtin
    if ref.origin == "beside_config":
        return _run_source(spec.text, ref)
    module = _import_installed(spec.text, ref.name)
    here = _installed_sha256(spec.text, module)
    if here != ref.sha256:
        raise CodeChanged(
            f"{spec.text}: {module.__file__ or ref.name} is not the code this build recorded "
            f"(sha256 {here} here, {ref.sha256} when the build started): install the same "
            "version everywhere, and do not edit a transform's module during a build"
        )
    return module
