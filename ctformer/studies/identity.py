r"""Identity of a computation: when a stored study case may be reused.

A stored case is reused only when it is the same computation. Its
key is a SHA-256 hash of

* the exact bytes of every parameter of the model (name, dtype, shape, values: from
  ``model.parameters()``) and of its structure: a canonical walk through the model that
  records every option (placements, activations, inverse temperatures, masks, eps), every
  array by its bytes (and, for a torch or CuPy array, its library, device and own dtype),
  every number exactly (a 0-d array as its number), every module-level function or class by
  its qualified name (one of another installed library also by that library's version, one
  of the user's own code by its bytecode, defaults and the module-level values it names, a
  class by its body), a ``functools.partial`` by its
  function, arguments and keywords, a bound method by its function and its instance, and any
  other object by what pickle keeps of it (class, constructor arguments, full state);
* each discretization (name, n, domain), the scheme and its full state (not its ``repr``),
  the steps per layer;
* the initial data as the exact array sampled on the case's own grid;
* the evaluation grid and the level; :func:`ctformer.studies.store.case_key` adds the
  library's version.

Nothing is rounded and nothing is probed on a small grid, so a change anywhere (one weight of
a final LayerNorm, an initial state that vanishes on a coarse grid) gives another key. What has
no stable description (a lambda, a local function or class, an object that cannot be pickled,
a cycle) raises :class:`TypeError`: such a study runs without a store.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import types

import array_api_compat
import numpy as np

from ..backend import to_host

__all__ = ["model_identity", "array_identity", "describe"]


def _origin(values) -> str:
    """Where an array computes: ``""`` for NumPy, else its namespace, device type and own dtype
    (a torch state computes in torch, on its device; a bfloat16 tensor reaches the host as
    float32, so its own dtype tells the two apart)."""
    if isinstance(values, np.ndarray):
        return ""
    device = getattr(values, "device", None)
    kind = getattr(device, "type", None) or str(device)
    return f"{type(values).__module__}.{type(values).__qualname__}@{kind}:{values.dtype}|"


def _update_array(digest, name: str, values) -> None:
    array = np.ascontiguousarray(to_host(values))
    digest.update(f"{name}|{_origin(values)}{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.tobytes())


def array_identity(values) -> str:
    """SHA-256 of an array's dtype, shape and exact bytes."""
    digest = hashlib.sha256()
    _update_array(digest, "array", values)
    return digest.hexdigest()


class _Unhashable(TypeError):
    pass


def _is_array(obj) -> bool:
    return isinstance(obj, np.ndarray) or array_api_compat.is_array_api_obj(obj)


def _describe_function(obj, path: str, stack: set):
    """A module-level function, class or ufunc by its qualified name; lambdas are refused.

    One defined outside the installed libraries (a script's, a notebook's) is also identified
    by what it computes: a function by its code (:func:`_describe_code`), defaults and the
    module-level values its code names, a class by its own namespace (methods, class
    attributes) and bases. An edited ``def act(z)`` is then another computation.
    """
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    if "<lambda>" in name or "<locals>" in name:
        raise _Unhashable(f"{path} is a lambda or a local function ({name})")
    module = _ufunc_home(obj) if isinstance(obj, np.ufunc) else \
        getattr(obj, "__module__", None) or type(obj).__module__
    described = {"function": f"{module}.{name}"}
    if id(obj) in stack:  # a recursion
        return described
    if _installed(obj):  # fixed by the installed version: another library's is in the key
        release = _release(module)
        return described if release is None else {**described, "release": release}
    stack = stack | {id(obj)}
    if isinstance(obj, types.FunctionType):
        described.update(code=_describe_code(obj.__code__, path, stack),
                         defaults=_describe(obj.__defaults__, path, stack),
                         keywords=_describe(obj.__kwdefaults__, path, stack),
                         reads=_describe(_named_globals(obj), f"{path} (module-level values)", stack))
    elif isinstance(obj, type):
        described.update(bases=[_describe(base, path, stack) for base in obj.__bases__],
                         namespace=_class_namespace(obj, f"{path} (class body)", stack))
    return described


def _installed(obj) -> bool:
    """True for what the installed packages define (ctformer's own included, whose version is
    in every case key), and for what has no Python source (builtins, ufuncs)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    top = (getattr(obj, "__module__", None) or "").partition(".")[0]
    if top == __name__.partition(".")[0] or top in sys.stdlib_module_names:
        return True
    where = getattr(module, "__file__", None)
    if where is None:
        return not isinstance(obj, (types.FunctionType, type))
    return any(os.path.abspath(where).startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def _ufunc_home(ufunc) -> str:
    """The module that offers ``ufunc`` under its name: a ufunc names no module (SciPy's
    ``erf`` read as ``numpy.erf``), so the loaded public modules are searched, NumPy first."""
    if getattr(np, ufunc.__name__, None) is ufunc:
        return "numpy"
    for name, module in sorted(sys.modules.items()):
        if not any(part.startswith("_") for part in name.split(".")) and \
                getattr(module, "__dict__", {}).get(ufunc.__name__) is ufunc:
            return name
    return "numpy"


def _release(module) -> str | None:
    """The installed version of the library that defines ``module`` (``scipy.special``: SciPy's),
    or None for ctformer (its version is in every case key), the standard library, and a module
    with no version to read: a library upgrade that changes what a function computes (SciPy's
    ``erf``, torch's ``gelu``) is then another computation, not a stored result to reuse."""
    top = str(module or "").partition(".")[0]
    if not top or top == __name__.partition(".")[0] or top in sys.stdlib_module_names:
        return None
    version = getattr(sys.modules.get(top), "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(top)
        except (metadata.PackageNotFoundError, ValueError):
            return None
    return str(version)


_LIBRARY_ROOTS = tuple(sorted({os.path.abspath(path) for key, path in sysconfig.get_paths().items()
                               if key in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _describe_code(code, path: str, stack: set):
    """A code object by its bytecode, constants (nested code objects alike), names and
    arguments; not by its line numbers, so a comment or a blank line changes nothing."""
    consts = [_describe_code(c, path, stack) if isinstance(c, types.CodeType)
              else _describe(c, f"{path} (a constant)", stack) for c in code.co_consts]
    return {"bytecode": hashlib.sha256(code.co_code).hexdigest(), "constants": consts,
            "names": list(code.co_names), "arguments": list(code.co_varnames[:code.co_argcount]),
            "flags": code.co_flags}


def _named_globals(function) -> dict:
    """The module-level values that ``function``'s code names (its helpers, constants,
    arrays); a module by its name."""
    names, codes = set(), [function.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    found = {}
    for name in sorted(names & function.__globals__.keys()):
        value = function.__globals__[name]
        found[name] = {"module": value.__name__} if isinstance(value, types.ModuleType) else value
    return found


def _class_namespace(cls, path: str, stack: set) -> list:
    """A class's own attributes: methods (static, class, properties, cached properties) by
    their functions, other attributes by their description where they have one (an enum's
    members refer back to their class, a dataclass's field records hold Python's own
    machinery: those by their type)."""
    described = []
    for name, value in sorted(vars(cls).items()):
        if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__") \
                or isinstance(value, types.MemberDescriptorType):  # slots: in the instances
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            value = (value.fget, value.fset, value.fdel)
        elif isinstance(value, functools.cached_property):
            value = value.func
        try:
            described.append([name, _describe(value, f"{path}[{name!r}]", stack)])
        except _Unhashable:
            if isinstance(value, (types.FunctionType, tuple)):  # code itself stays identified
                raise
            described.append([name, {"unidentified": f"{type(value).__module__}.{type(value).__qualname__}"}])
    return described


def _describe_reduced(obj, path: str, stack: set):
    r"""An object by what pickle would store of it: ``__reduce_ex__(4)``.

    That is the constructor with its arguments and the full state (``__getstate__``, or the
    instance dictionary and slots), plus list and dictionary items: exactly what a process or
    Dask worker rebuilds the object from. A ``functools.partial`` is thereby identified by its
    function, arguments and keywords, any object by all of its attributes.
    """
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception as exc:  # noqa: BLE001 - any failure means: no stable description
        raise _Unhashable(f"{path} ({type(obj).__qualname__}) cannot be pickled ({exc}), so it "
                          "has no stable description") from None
    if isinstance(reduced, str):   # a module-level singleton, stored by name
        return {"global": f"{getattr(obj, '__module__', type(obj).__module__)}.{reduced}"}
    constructor, args, state, items, pairs = (tuple(reduced) + (None,) * 5)[:5]
    return {"type": f"{type(obj).__module__}.{type(obj).__qualname__}",
            "constructor": _describe(constructor, f"{path} (constructor)", stack),
            "args": _describe(args, f"{path} (arguments)", stack),
            "state": _describe(state, path, stack),
            "items": None if items is None else _describe(list(items), path, stack),
            "pairs": None if pairs is None else _describe(dict(pairs), path, stack)}


def _describe_scalar(obj, path: str, stack: set):
    """Numbers: Python floats and float64 scalars alike by their exact hex form."""
    if isinstance(obj, float):
        return {"float": obj.hex()}
    return {"scalar": obj.dtype.str, "value": _describe(obj.item(), path, stack)}


def _describe(obj, path: str, stack: set):
    """A canonical JSON-able description of ``obj`` (arrays by hash, functions by name).

    A 0-d NumPy array is described as its scalar, so ``1.5`` and ``np.asarray(1.5)`` (what
    ``parameters()`` hands out for a number) are one computation. A bound method is its
    function and the full state of its instance.
    """
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, (bytes, bytearray)):
        return {"bytes": hashlib.sha256(obj).hexdigest()}
    if isinstance(obj, (float, np.generic)):
        return _describe_scalar(obj, path, stack)
    if isinstance(obj, np.ndarray) and obj.ndim == 0 and obj.dtype.kind in "biuf":
        return _describe_scalar(obj[()], path, stack)
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:   # its bytes are addresses
        return {"objects": list(obj.shape),
                "items": _describe(obj.reshape(-1).tolist(), path, stack)}
    if _is_array(obj):
        return {"array": array_identity(obj)}
    if isinstance(obj, np.dtype):
        return {"dtype": obj.str}
    bound_to = getattr(obj, "__self__", None)
    if isinstance(obj, (types.MethodType, types.BuiltinMethodType)) and bound_to is not None \
            and not isinstance(bound_to, types.ModuleType):
        function = obj.__func__ if isinstance(obj, types.MethodType) else type(bound_to)
        return {"method": getattr(obj, "__name__", ""),
                "of": _describe(function, path, stack),
                "instance": _describe(bound_to, f"{path} (instance)", stack)}
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, np.ufunc)):
        return _describe_function(obj, path, stack)
    if id(obj) in stack:
        raise _Unhashable(f"{path} refers back to itself")
    stack = stack | {id(obj)}
    if type(obj) in (list, tuple):   # a subclass (a namedtuple) by its type, through pickle
        return [_describe(v, f"{path}[{i}]", stack) for i, v in enumerate(obj)]
    if type(obj) is dict:
        return [[_describe(k, path, stack), _describe(v, f"{path}[{k!r}]", stack)]
                for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(obj, (set, frozenset)):   # in a canonical order, not the hash order
        return {"set": sorted((_describe(v, path, stack) for v in obj), key=_canonical)}
    return _describe_reduced(obj, path, stack)


def _walk(obj, path: str):
    """:func:`_describe` from the top; a structure nested beyond Python's recursion limit has
    no description either."""
    try:
        return _describe(obj, path, set())
    except RecursionError:
        raise _Unhashable(f"{path} is nested too deeply to be described") from None


def _canonical(description) -> str:
    return json.dumps(description, separators=(",", ":"))


def describe(obj, what: str | None = None):
    """A canonical JSON-able description of ``obj`` (arrays by hash, functions by name).

    Objects are described by everything pickle keeps of them (constructor, arguments and
    full state), ``functools.partial`` objects by function, arguments and keywords, bound
    methods by function and instance; two objects with the same description are the same
    computation.

    Parameters
    ----------
    obj : object
        What to describe.
    what : str, optional
        How to call ``obj`` in the error message (default: its type name).

    Raises
    ------
    TypeError
        If ``obj`` holds a lambda, a local function, a cycle or an object that cannot be
        pickled: its identity could not be told apart from another one's.
    """
    try:
        return _walk(obj, what or type(obj).__name__)
    except _Unhashable as exc:
        raise TypeError(
            f"no stable description: {exc}, so a stored case could belong to another "
            "computation; build it from module-level functions and picklable objects, or run "
            "the study without a store") from None


def model_identity(model) -> str:
    """SHA-256 of a model's parameters (exact bytes) and of its structure.

    Parameters
    ----------
    model : object
        Anything with ``solve``; ``parameters()`` (a mapping of named arrays) is hashed when
        present, and the model's attributes are walked to capture its structure.

    Raises
    ------
    TypeError
        If the model holds a lambda, a local function or another object without a stable
        description: its identity could not be told apart from another model's, so no
        stored case may be reused for it.
    """
    digest = hashlib.sha256()
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for name, values in sorted(parameters().items()):
            _update_array(digest, name, values)
    try:
        structure = _walk(model, "model")
    except _Unhashable as exc:
        raise TypeError(
            f"the model's identity cannot be hashed: {exc}, so a stored case could belong to "
            "another model; build it from module-level functions, or run the study without a "
            "store"
        ) from None
    digest.update(json.dumps(structure, separators=(",", ":")).encode())
    return digest.hexdigest()
