"""A kernel's numbers: where they live, and how they are handed out.

A parameter is either on the host (NumPy arrays, numbers), where the kernel's discretizations
are cached, or an array of another namespace (a torch tensor handed in by ``with_parameters``),
assembled afresh in that namespace at every use (:func:`is_host`). ``parameters()`` hands host
arrays out as read-only views (:func:`read_only`); a user's function adds its own
``parameters()`` when it has that method (:func:`callable_parameters`).
"""
from __future__ import annotations

import hashlib

import array_api_compat
import numpy as np

from ..backend import to_host


def _to_host(x):
    """Host NumPy copy of an array of any namespace (other inputs pass through)."""
    return to_host(x) if hasattr(x, "__array_namespace__") or hasattr(x, "detach") else x


def is_host(value) -> bool:
    """True for parameters held on the host (NumPy, numbers): discretizations of them are
    cached. Arrays of another namespace (torch tensors handed in by ``with_parameters``) are
    assembled afresh in their own namespace at every use, so autograd sees them and an
    in-place update is never hidden behind a cached copy."""
    if type(value) is np.ndarray or type(value) is float or value is None:
        return True
    return isinstance(value, (np.ndarray, np.generic)) or not array_api_compat.is_array_api_obj(value)


def read_only(value):
    """``value`` as a read-only view when it is a host array (no copy), else unchanged.

    What ``parameters()`` hands out: editing a model's arrays in place raises
    :class:`ValueError` (``v *= 2``: ``output array is read-only``; ``v[0] = 1``: ``assignment
    destination is read-only``) instead of changing values that cached discretizations and
    pickled copies do not see. Tensors (handed in by
    ``with_parameters`` for autograd) are returned as they are: an optimizer updates them in
    place, and operators holding them are never cached.
    """
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def read_only_parameters(parameters) -> dict:
    """A ``parameters()`` mapping with every host array a read-only view (:func:`read_only`)."""
    return {name: read_only(value) for name, value in dict(parameters).items()}


def callable_parameters(function) -> dict:
    """The numbers of a user's function: its own ``parameters()`` (read-only views) if it has
    that method, else ``{}``.

    A kernel's function, a convolution profile or a feature function may be a plain Python
    function (no numbers of its own) or an object with a ``parameters()`` method returning a
    mapping ``name -> array`` (a parametrized function, whose numbers ``with_parameters``
    replaces); this is the one place that tells the two apart.
    """
    own = getattr(function, "parameters", None)
    return read_only_parameters(own()) if callable(own) else {}


# -- a kernel's value: what equality and hashing read ----------------------------------------
#: entries of a kernel's ``__dict__`` that are not part of its value (the freeze flag, the
#: cached hash and keys): never pickled or copied
_BOOKKEEPING = frozenset({"_frozen", "_hash", "_hash_key", "_full_key"})
#: array entries read for the hash (evenly spaced, in logical order): O(1) whatever the size
_SAMPLES = 64


class _Same:
    """An unhashable attribute compared by identity (its own ``==`` cannot be hashed)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _digest(a: np.ndarray) -> bytes:
    """BLAKE2b digest of the bytes of ``a`` in C order; a strided or transposed view is read
    in blocks of about 4 MiB along its first axis, never copied whole."""
    h = hashlib.blake2b(digest_size=32)
    if a.ndim == 0 or a.size == 0:
        h.update(a.tobytes())
    elif a.flags.c_contiguous:
        h.update(memoryview(a).cast("B"))
    else:
        rows = max(1, (1 << 22) // max(1, a[0].nbytes))
        for start in range(0, a.shape[0], rows):
            h.update(np.ascontiguousarray(a[start:start + rows]).tobytes())
    return h.digest()


def _field(value, full: bool):
    """The part of a kernel's key for one attribute, or None for a tensor (compared by identity).

    Arrays give ``(dtype, shape, bytes)``: the full digest when ``full``, else evenly spaced
    entries (the hash). Values that hash are compared with ``==`` (numbers, names, a user's
    function, by identity unless its class defines equality); others by identity. A function
    with ``parameters()`` adds its numbers (:func:`_with_own_numbers`)."""
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if full:
            content = _digest(a)
        else:
            step = max(1, a.size // _SAMPLES)
            content = a.reshape(-1)[::step].tobytes() if a.flags.c_contiguous else \
                a.flat[np.arange(0, a.size, step)].tobytes()
        return ("array", a.dtype.str, a.shape, content)
    if not is_host(value):
        return None
    if isinstance(value, (list, tuple)):
        parts = tuple(_field(v, full) for v in value)
        return None if any(p is None for p in parts) else (type(value).__name__, parts)
    parametrized = not isinstance(value, type) and callable(getattr(value, "parameters", None))
    try:
        hash(value)
        key = value
    except TypeError:
        key = _Same(value)
    return _with_own_numbers(value, key) if parametrized else key


def _with_own_numbers(function, key):
    """The key of a parametrized function (one with ``parameters()``): ``key`` (the function,
    by its own equality, or by identity where it does not hash) and the full digests of its
    numbers as they are now; None where they are tensors.

    Its numbers are the kernel's, yet the user's object holds them writable: without them a
    kernel built after ``f.a[0] = 2`` was equal to one built before (the same ``f``) and
    shared its matrix. Full digests even in the hash key, since the full key is read only on
    a hash collision, possibly after the change it must tell apart."""
    numbers = []
    for name, number in dict(function.parameters()).items():
        part = _field(number, True)
        if part is None:
            return None
        numbers.append((name, part))
    return ("parametrized", key, tuple(numbers))


def value_key(kernel, full: bool):
    """``(type, (name, field), ...)`` over the kernel's attributes, or None when it holds
    tensors (an optimizer updates them in place: such a kernel is only equal to itself).

    ``full=False`` is the hash key (array samples, O(1)); ``full=True`` adds every byte
    (digests, O(size) once): kernels with equal full keys compute the same bits."""
    cached = "_full_key" if full else "_hash_key"
    if cached in kernel.__dict__:
        return kernel.__dict__[cached]
    skip = _BOOKKEEPING | getattr(kernel, "_settings", frozenset())
    key = None
    if kernel._host():
        fields = tuple((name, _field(value, full)) for name, value in sorted(kernel.__dict__.items())
                       if name not in skip)
        if all(part is not None for _, part in fields):
            key = (type(kernel).__qualname__, fields)
    kernel.__dict__[cached] = key
    return key
