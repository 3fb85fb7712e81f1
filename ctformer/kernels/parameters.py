"""A kernel's numbers: where they live, and how they are handed out.

A parameter is either on the host (NumPy arrays, numbers), where the kernel's discretizations
are cached, or an array of another namespace (a torch tensor handed in by ``with_parameters``),
assembled afresh in that namespace at every use (:func:`is_host`). ``parameters()`` hands host
arrays out as read-only views (:func:`read_only`); a user's function adds its own
``parameters()`` when it has that method (:func:`callable_parameters`).
"""
from __future__ import annotations

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
