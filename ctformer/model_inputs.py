r"""Where data enters a model: states, padding masks, step counts.

- :func:`as_state_array` accepts arrays of the supported namespaces (NumPy, CuPy, torch: kept
  where they live, so a torch state computes in torch and autograd sees every operation) and
  anything NumPy can read (lists);
- :func:`check_padding_mask` validates a padding mask (1 = real token);
- :func:`check_steps` validates a number of steps per layer; :func:`check_step_count` refuses
  more than :func:`max_steps` steps in one solve (default :data:`MAX_STEPS` = 10**8).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from .backend import to_host
from .validation import is_integer
from .environment import positive_int

__all__ = ["as_state_array", "check_padding_mask", "refuse_meta", "check_steps", "check_step_count", "max_steps",
           "MAX_STEPS"]


#: Most time steps one solve may take (all layers together); ``CTFORMER_MAX_STEPS`` overrides.
MAX_STEPS = 10**8
MAX_STEPS_ENV = "CTFORMER_MAX_STEPS"


def max_steps() -> int:
    """The step limit of one solve: ``CTFORMER_MAX_STEPS`` when set, else :data:`MAX_STEPS`.

    A solve of more steps is refused before its first step (at a microsecond a step, 10**8
    steps are minutes of a small model; a larger count is almost always a mistyped ``dt`` or
    ``t1``, and would run for hours or for ever).

    Raises
    ------
    ValueError
        If ``CTFORMER_MAX_STEPS`` is not a positive integer.
    """
    return positive_int(MAX_STEPS_ENV, MAX_STEPS)


def check_step_count(steps, what: str, remedy: str = "a larger dt or a shorter t1") -> int:
    """Refuse ``steps`` (an int, or a float such as ``t1 / dt``) above :func:`max_steps`.

    ``what`` names the arguments that set the count, e.g. ``"t1 / dt = 1e9 / 1e-3"``, and
    ``remedy`` says how to take fewer steps.

    Raises
    ------
    ValueError
        Naming ``what``, the count and the limit, before any step is taken.
    """
    limit = max_steps()
    if not steps <= limit:  # also catches inf and NaN
        count = f"{float(steps):.4g}" if math.isfinite(steps) else "an overflowing number of"
        raise ValueError(f"{what} asks for {count} time steps, more than the limit of "
                         f"{limit} steps per solve; use {remedy}, or raise the limit with the "
                         f"environment variable {MAX_STEPS_ENV}")
    return int(steps)


def check_steps(steps_per_layer, layers: int = 1) -> int:
    """A positive integer number of steps per layer, at most :func:`max_steps` in total.

    Parameters
    ----------
    steps_per_layer : int
        Steps of the time integrator per layer (a layer is a unit of time).
    layers : int, optional
        Number of layers; ``layers * steps_per_layer`` steps are taken in all.

    Raises
    ------
    ValueError
        If ``steps_per_layer`` is not a positive integer, or the total exceeds the limit.
    """
    # a ValueError for every kind of bad value (1.5, True, "2" included), as documented
    if not is_integer(steps_per_layer) or steps_per_layer < 1:
        raise ValueError(f"steps_per_layer must be a positive integer, got {steps_per_layer!r}")
    steps = int(steps_per_layer)
    check_step_count(steps * max(int(layers), 1),
                     f"steps_per_layer = {steps} over {layers} layer{'s' if layers != 1 else ''}",
                     "a smaller steps_per_layer")
    return steps


def _is_native(x) -> bool:
    """NumPy, CuPy and torch arrays stay in their namespace (and on their device)."""
    return (array_api_compat.is_numpy_array(x) or array_api_compat.is_cupy_array(x)
            or array_api_compat.is_torch_array(x))


def _plain(x, name):
    """The plain NumPy array of the values of ``x``, an instance of a subclass of it."""
    if np.ma.is_masked(x):
        raise ValueError(f"{name} is a masked array with masked entries; a state has a value at "
                         f"every token and feature: pass {name}.filled(value), and a padding_mask "
                         "for padded tokens")
    return np.asarray(x)


def as_state_array(x, name):
    """An array-API array from ``x`` (NumPy/CuPy kept, anything else through NumPy).

    Parameters
    ----------
    x : array_like
        NumPy or CuPy array, torch tensor, nested lists.
    name : str
        Argument name for error messages.

    Returns
    -------
    array, shape (..., tokens, features)
        A real floating array of at least two axes (integers are converted to float64; NumPy
        arrays of the other byte order to the machine's, of the same precision). A
        subclass of the NumPy array (``np.matrix``, a masked array, a memory map) becomes the
        plain array of its values: the subclasses' own arithmetic (``*`` is a product of
        matrices) is not NumPy's.

    Raises
    ------
    TypeError
        If ``x`` is not numeric, is boolean, or is complex.
    ValueError
        If ``x`` has fewer than two axes (a number, a NumPy scalar, a 0-d or 1-d array: a
        state has a token axis and a feature axis), or is a masked array with masked entries.
    """
    if isinstance(x, np.generic):  # a NumPy scalar is no array: refused below by its shape ()
        x = np.asarray(x)
    if _is_native(x):
        arr = _plain(x, name) if type(x) is not np.ndarray and isinstance(x, np.ndarray) else x
    else:
        try:
            arr = to_host(x)
        except Exception:
            raise TypeError(f"{name} must be an array, got {type(x).__name__}") from None
    xp = array_api_compat.array_namespace(arr)
    if xp.isdtype(arr.dtype, "complex floating"):
        raise TypeError(f"{name} must be a real array, got complex dtype {arr.dtype}")
    if not xp.isdtype(arr.dtype, "real floating"):
        if not xp.isdtype(arr.dtype, "integral"):
            raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype}")
        arr = xp.astype(arr, xp.float64)
    elif isinstance(arr, np.ndarray) and not arr.dtype.isnative:
        # big-endian data (read from a file): the same numbers in the machine's byte order,
        # which the sparse Galerkin matrices require (SciPy refuses '>f8') and the BLAS prefers
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.ndim < 2:
        remedy = (f"{name}[None, :] is one token with these features" if arr.ndim == 1 else
                  "a number is not a state: np.full((N, d), value) is a constant one of N tokens")
        raise ValueError(f"{name} must have shape (..., tokens, features), got shape "
                         f"{tuple(arr.shape)}: a state has a token axis and a feature axis; {remedy}")
    return arr


def refuse_meta(array, name: str) -> None:
    """Refuse a torch tensor on the ``meta`` device by ``name``: it has a shape and a dtype but
    no values, so a solve has nothing to compute with (torch's own error came from deep inside,
    "Tensor.item() cannot be called on meta tensors")."""
    if getattr(array, "is_meta", False):
        raise TypeError(f"{name} is a torch tensor on the 'meta' device, which holds a shape but no "
                        "values: pass a tensor with values, on 'cpu' or a GPU")


def check_padding_mask(mask, u):
    """A boolean padding mask of shape ``u.shape[:-1]`` (1 = real token) like ``u``.

    Parameters
    ----------
    mask : array_like of bool or 0/1, shape (..., N)
        1 (True) for a real token, 0 for padding.
    u : array, shape (..., N, d)
        The state the mask belongs to.

    Returns
    -------
    bool array, shape (..., N)
        In the namespace and on the device of ``u`` (a torch mask on another device is moved).

    Raises
    ------
    TypeError
        For a mask of complex numbers, strings or objects.
    ValueError
        For a ragged nested list, a wrong shape (the message names both token counts, or
        HuggingFace's extended form), values other than 0/1 (the first one, and the conversion
        of an additive mask: ``mask == 0``), or a sequence without real tokens (its index).
    """
    refuse_meta(mask, "padding_mask")
    xp = array_api_compat.array_namespace(u)
    if not _is_native(mask):
        try:
            mask = to_host(mask)
        except ValueError as exc:  # ragged nested lists
            raise ValueError(f"padding_mask must be a rectangular array of shape {tuple(u.shape[:-1])} "
                             f"(batch, tokens): {exc}") from None
    elif type(mask) is not type(u):  # a mask from another namespace (e.g. NumPy for torch)
        mask = to_host(mask)
    if isinstance(mask, np.ndarray) and mask.dtype == object:
        mask = _object_flags(mask)
    if isinstance(mask, np.ndarray) and mask.dtype.kind in "cUS" or getattr(mask, "is_complex", bool)():
        raise TypeError(f"padding_mask must be an array of booleans or 0/1, got dtype {mask.dtype}")
    _check_mask_shape(mask, u)
    if mask.dtype != bool:
        _refuse_values_other_than_0_and_1(mask)
        mask = mask == 1
    _refuse_empty_sequences(mask)
    if array_api_compat.is_torch_array(u) or array_api_compat.is_cupy_array(u):
        # on u's device even when the mask is already of u's kind (a CPU mask for a GPU state)
        return xp.asarray(mask, device=array_api_compat.device(u))
    return xp.asarray(mask)


def _object_flags(mask):
    """A NumPy object array of Python or NumPy booleans and real numbers (a column read with
    pandas, say) as a float array; any other element refused by its type, never by a
    conversion failing inside NumPy."""
    kinds = {type(v) for v in mask.flat}
    if mask.size and all(issubclass(k, (bool, int, float, np.bool_, np.integer, np.floating)) for k in kinds):
        return mask.astype(np.float64)
    names = sorted(k.__name__ for k in kinds) if mask.size else ["an empty object array"]
    raise TypeError(f"padding_mask must be an array of booleans or 0/1, got {', '.join(names)}: "
                    "pass a boolean array (1 or True for a real token)")


def _check_mask_shape(mask, u) -> None:
    """One flag per token of ``u``: the shape ``u.shape[:-1]``, named with the remedy."""
    want, got = tuple(u.shape[:-1]), tuple(mask.shape)
    if got == want:
        return
    axes = "(batch, tokens)" if len(want) == 2 else "(tokens,)" if len(want) == 1 else "(..., tokens)"
    if len(got) == len(want) + 2 and got[-3:-1] == (1, 1):
        remedy = ("this is HuggingFace's extended (batch, 1, 1, tokens) form: pass the 2-D "
                  "attention_mask the tokenizer returned")
    elif len(got) == len(want) and got[:-1] == want[:-1]:
        remedy = (f"the state has {want[-1]} tokens and the mask {got[-1]}: pass the attention_mask "
                  "of this very batch (same padding, same length)")
    else:
        remedy = "one flag per token of the state, 1 for a real token"
    raise ValueError(f"padding_mask must have shape {want} {axes}, got {got}: {remedy}")


def _refuse_values_other_than_0_and_1(mask) -> None:
    """Refuse values other than 0 and 1, naming the first and the conversion that fits it."""
    binary = (mask == 0) | (mask == 1)
    if bool(binary.all()):
        return
    flat_mask, flat_ok = (np.asarray(to_host(a)).reshape(-1) for a in (mask, binary))
    first = float(flat_mask[~flat_ok][0])
    if math.isnan(first):
        remedy = "a flag is a number 0 or 1, never NaN: mark padding with 0"
    elif first < 0 or math.isinf(first):
        remedy = ("an additive mask (0 for a real token, -inf or a large negative number for "
                  "padding, as torch's float src_key_padding_mask) converts with padding_mask == 0")
    else:
        remedy = "pass padding_mask != 0 if every nonzero value marks a real token"
    raise ValueError(f"padding_mask must be boolean or hold only 0 and 1 (1 = real token), got the "
                     f"value {first:g}; {remedy}")


def _refuse_empty_sequences(mask) -> None:
    """Refuse a mask with a sequence of padding only, naming the first such sequence."""
    real = np.asarray(to_host(mask.any(axis=-1)))
    if not real.all():
        first = tuple(int(i) for i in np.argwhere(~real)[0]) if real.ndim else ()
        place = "" if not first else f" at batch index {first[0] if len(first) == 1 else first}"
        raise ValueError(f"padding_mask has a sequence without any real token (a row of zeros){place}: every "
                         "sequence needs at least one real token; drop that sequence from the batch. "
                         "The mask holds 1 (True) for a real token, as HuggingFace's attention_mask; "
                         "torch's src_key_padding_mask is the opposite (True = padding): pass its "
                         "negation, ~src_key_padding_mask")
