r"""Identity of a computation: when a stored study case may be reused.

A stored case is reused only when it is the same computation (design notes, section 9). Its
key is a SHA-256 hash of

* the exact bytes of every parameter of the model (name, dtype, shape, values: from
  ``model.parameters()``) and of its structure: a canonical walk through the model's
  attributes that records every option (placements, activations, inverse temperatures,
  masks, eps), every array by its bytes and every function by its qualified name;
* each discretization (name, n, domain), the scheme and its options, the steps per layer;
* the initial data as the exact array sampled on the case's own grid;
* the evaluation grid and the level.

Nothing is rounded and nothing is probed on a small grid, so a change anywhere (one weight of
a final LayerNorm, an initial state that vanishes on a coarse grid) gives another key.
"""
from __future__ import annotations

import hashlib
import json
import types

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


def _describe(obj, path: str, stack: set):
    """A canonical JSON-able description of ``obj`` (arrays by hash, functions by name)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return {"float": obj.hex()}
    if isinstance(obj, (np.generic,)):
        return {"scalar": obj.dtype.str, "value": _describe(obj.item(), path, stack)}
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array_namespace__"):
        return {"array": array_identity(obj)}
    if isinstance(obj, np.dtype):
        return {"dtype": obj.str}
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type, np.ufunc)):
        name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
        if "<lambda>" in name or "<locals>" in name:
            raise _Unhashable(f"{path} is a lambda or a local function ({name})")
        return {"function": f"{getattr(obj, '__module__', None) or type(obj).__module__}.{name}"}
    if id(obj) in stack:
        raise _Unhashable(f"{path} refers back to itself")
    stack = stack | {id(obj)}
    if isinstance(obj, (list, tuple)):
        return [_describe(v, f"{path}[{i}]", stack) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return [[_describe(k, path, stack), _describe(v, f"{path}[{k!r}]", stack)]
                for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))]
    cls = type(obj)
    if hasattr(obj, "__getstate__") and cls.__getstate__ is not object.__getstate__:
        state = obj.__getstate__()
    elif hasattr(obj, "__dict__"):
        state = vars(obj)
    elif hasattr(cls, "__slots__"):
        state = {name: getattr(obj, name, None) for name in cls.__slots__ if name != "__weakref__"}
    else:
        raise _Unhashable(f"{path} ({cls.__qualname__}) has no inspectable state")
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "state": _describe(state, path, stack)}


def describe(obj):
    """A canonical JSON-able description of ``obj`` (arrays by hash, functions by name).

    Raises
    ------
    TypeError
        If ``obj`` holds a lambda, a local function or a cycle.
    """
    try:
        return _describe(obj, type(obj).__name__, set())
    except _Unhashable as exc:
        raise TypeError(f"no stable description: {exc}") from None


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
        structure = _describe(model, "model", set())
    except _Unhashable as exc:
        raise TypeError(
            f"the model's identity cannot be hashed: {exc}, so a stored case could belong to "
            "another model; build it from module-level functions, or run the study without a "
            "store"
        ) from None
    digest.update(json.dumps(structure, separators=(",", ":")).encode())
    return digest.hexdigest()
