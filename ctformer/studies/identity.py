r"""Identity of a computation: when a stored study case may be reused.

A stored case is reused only when it is the same computation (design notes, section 9). Its
key is a SHA-256 hash of

* the exact bytes of every parameter of the model (name, dtype, shape, values: from
  ``model.parameters()``) and of its structure: a canonical walk through the model that
  records every option (placements, activations, inverse temperatures, masks, eps), every
  array by its bytes, every number exactly (a 0-d array as its number), every module-level
  function or class by its qualified name, a ``functools.partial`` by its function,
  arguments and keywords, a bound method by its function and its instance, and any other
  object by what pickle keeps of it (class, constructor arguments, full state);
* each discretization (name, n, domain), the scheme and its full state (not its ``repr``),
  the steps per layer;
* the initial data as the exact array sampled on the case's own grid;
* the evaluation grid and the level.

Nothing is rounded and nothing is probed on a small grid, so a change anywhere (one weight of
a final LayerNorm, an initial state that vanishes on a coarse grid) gives another key. What has
no stable description (a lambda, a local function or class, an object that cannot be pickled,
a cycle) raises :class:`TypeError`: such a study runs without a store.
"""
from __future__ import annotations

import hashlib
import json
import types

import array_api_compat
import numpy as np

from ..backend import to_host

__all__ = ["model_identity", "array_identity", "describe"]


def _update_array(digest, name: str, values) -> None:
    array = np.ascontiguousarray(to_host(values))
    digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
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


def _describe_function(obj, path: str):
    """A module-level function, class or ufunc by its qualified name; lambdas are refused."""
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    if "<lambda>" in name or "<locals>" in name:
        raise _Unhashable(f"{path} is a lambda or a local function ({name})")
    return {"function": f"{getattr(obj, '__module__', None) or type(obj).__module__}.{name}"}


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
        return _describe_function(obj, path)
    if id(obj) in stack:
        raise _Unhashable(f"{path} refers back to itself")
    stack = stack | {id(obj)}
    if isinstance(obj, (list, tuple)):
        return [_describe(v, f"{path}[{i}]", stack) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
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
