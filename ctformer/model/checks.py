"""The checks a model's parameters pass: names, kinds, shapes and values, one device.

:meth:`ctformer.model.ContinuousTransformer.with_parameters` takes a mapping with exactly the
names of ``parameters()`` (``_check_parameter_names``), turns each value into a read-only
float64 host copy or keeps it as the tensor it is (``_checked_parameter``: real, finite, of the
parameter's shape), requires every tensor to share one namespace, device and dtype
(``_check_tensor_kinds``) and, when there are tensors, turns the host values into tensors like
them (``_as_tensors_like``). ``_device`` reads the device of an array of any namespace.
"""
from __future__ import annotations

from numbers import Real

import array_api_compat
import numpy as np

from ..kernels import is_host
from ..model_inputs import refuse_meta as _refuse_meta
from ..shared_tensors import check_unchanged


def _check_parameter_names(own: dict, params) -> None:
    """``params`` must be a mapping with exactly the names of ``own`` (KeyError listing them)."""
    if not hasattr(params, "items") or not hasattr(params, "keys"):
        raise TypeError(f"params must be a mapping name -> array (like parameters()), got "
                        f"{type(params).__name__}")
    missing, unknown = sorted(set(own) - set(params)), sorted(set(params) - set(own))
    if missing or unknown:
        raise KeyError(f"params must have exactly the names of parameters(): missing {missing[:5]}"
                       f"{' ...' if len(missing) > 5 else ''}, unknown {unknown[:5]}"
                       f"{' ...' if len(unknown) > 5 else ''}")


def _checked_parameter(name: str, value, shape: tuple):
    """``value`` as the new parameter ``name`` of ``shape``: a read-only float64 host copy, or
    the tensor itself. Real numbers only, finite, of the parameter's shape."""
    what = f"params[{name!r}]"
    if not is_host(value):   # a tensor of another namespace: kept, so autograd sees it
        _refuse_meta(value, what)
        xp = array_api_compat.array_namespace(value)
        if not xp.isdtype(value.dtype, "real floating"):
            raise TypeError(f"{what} is a tensor of dtype {value.dtype}; parameters are real: "
                            "pass a real floating tensor (e.g. torch.float64)")
        _check_parameter_shape(what, tuple(value.shape), shape)
        if not bool(xp.all(xp.isfinite(value))):
            raise ValueError(f"{what} holds NaN or inf; parameters must be finite")
        return value
    if np.ma.is_masked(value):  # np.asarray would silently use the hidden entries
        raise ValueError(f"{what} is a masked array with masked entries; a parameter has a value "
                         f"at every entry: pass {what}.filled(value)")
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic, Real, list, tuple)) \
        else None
    if array is None or array.dtype.kind not in "iuf":
        kind = "complex numbers" if array is not None and array.dtype.kind == "c" else \
            f"a {type(value).__name__}"
        raise TypeError(f"{what} must be a real array of shape {shape} (a NumPy array, a number "
                        f"or a torch tensor), got {kind}")
    _check_parameter_shape(what, array.shape, shape)
    array = np.array(array, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} holds NaN or inf; parameters must be finite")
    array.setflags(write=False)
    return array


def _check_parameter_shape(what: str, got: tuple, shape: tuple) -> None:
    if tuple(got) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(got)}, the parameter has shape {tuple(shape)}")


def _device(array):
    """The device of an array of any namespace (``"cpu"`` for NumPy)."""
    return array_api_compat.device(array)


def _same_kind(a, b) -> bool:
    """Whether ``a`` and ``b`` live in one namespace and on one device: a ``torch.nn.Parameter``
    is a tensor like any other (comparing types refused a Parameter beside a plain tensor)."""
    return (array_api_compat.array_namespace(a) is array_api_compat.array_namespace(b)
            and _device(a) == _device(b))


def _check_tensor_kinds(params: dict) -> None:
    """Tensor parameters must share one namespace, device and dtype (TypeError naming the odd one)."""
    tensors = [(name, v) for name, v in params.items() if not is_host(v)]
    for name, value in tensors[1:]:
        first, like = tensors[0]
        if not _same_kind(value, like) or value.dtype != like.dtype:
            raise TypeError(
                f"params[{name!r}] is a {type(value).__name__} of dtype {value.dtype} on "
                f"{_device(value)}, params[{first!r}] one of dtype {like.dtype} "
                f"on {_device(like)}: give every tensor parameter one dtype and "
                "device")


def _as_tensors_like(params: dict) -> dict:
    """With tensors among ``params``, every host value as a tensor of their namespace, dtype
    and device (a copy outside autograd's graph); without tensors, ``params`` as it is.

    A solve assembles mixed operators in the tensors' namespace anyway; converting here, once,
    from a private writable copy keeps torch from wrapping read-only NumPy memory (its
    "non-writable" warning) at every solve. A value too large for a narrower dtype (1e300 as
    float32) is refused by name instead of becoming inf.
    """
    tensors = [v for v in params.values() if not is_host(v)]
    if not tensors:
        return params
    like = tensors[0]
    xp = array_api_compat.array_namespace(like)
    out = {}
    for name, value in params.items():
        if is_host(value):
            value = xp.asarray(np.array(value), dtype=like.dtype, device=_device(like))
            if not bool(xp.all(xp.isfinite(value))):
                raise ValueError(f"params[{name!r}] overflows {like.dtype}, the dtype of the tensor "
                                 "parameters it joins: pass values within that dtype's range, or "
                                 "every tensor in a wider dtype")
        out[name] = value
    return out


def _checked_parameters(model, params) -> dict:
    """``params`` checked against the parameters of ``model`` (names, shapes, values, one
    tensor dtype and device), NumPy values beside tensors made tensors like them. A converted
    model whose module changed in place is refused first: the copy made with the new values
    would no longer be watched, and would keep what was computed from the old ones."""
    check_unchanged(model)
    own = model.parameters()
    _check_parameter_names(own, params)
    checked = {name: _checked_parameter(name, value, np.shape(own[name]))
               for name, value in params.items()}
    _check_tensor_kinds(checked)
    return _as_tensors_like(checked)


def _copy_to_assign(model):
    """A deep copy of ``model`` whose every parameter is assigned next: its tensor parameters
    are kept, not copied (torch deep-copies graph leaves only: a tensor computed from one, a
    reparametrized weight, raised), as the assignment replaces each of them anyway."""
    import copy

    return copy.deepcopy(model, {id(v): v for v in model.parameters().values() if not is_host(v)})


def _check_shared(model, given: dict):
    """``model`` (parameters just assigned from ``given``), checked: names that hold one weight
    after the assignment (layers sharing it, as ALBERT's) were given equal values. The model
    keeps one value per shared weight, the last assigned: a different earlier one was dropped
    silently."""
    held: dict = {}
    for name, value in model.parameters().items():
        held.setdefault(id(value), []).append(name)
    for names in held.values():
        first = given[names[0]]
        for other in names[1:]:
            if not _equal(first, given[other]):
                raise ValueError(f"params[{names[0]!r}] and params[{other!r}] set one weight of this "
                                 f"model (its layers share it) to different values: the model keeps "
                                 f"one of them; give every name of a shared weight the same value")
    return model


def _equal(a, b) -> bool:
    if a is b:
        return True
    if is_host(a) and is_host(b):
        return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    xp = array_api_compat.array_namespace(a, b)
    return a.shape == b.shape and bool(xp.all(a == b))
