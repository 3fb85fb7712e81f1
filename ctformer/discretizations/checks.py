r"""Checks of discretized values and of domains, with the messages that name what is wrong.

Values: :func:`real_host_array` turns array-likes into host float64 arrays (refusing complex
numbers and non-numbers), :func:`as_values` and :func:`check_values` accept arrays of any
array-API namespace of length ``n`` along an axis and all finite; :func:`is_native_array`
tells NumPy and CuPy arrays from the others.

Domains: an interval :math:`(a, b)` is representable when :math:`a < b`, both are finite,
:math:`\max(|a|, |b|)` is at most half the largest float64 and
:math:`b - a \ge 64\,\mathrm{ulp}(\max(|a|, |b|))` (:func:`check_domain`); neighbouring nodes
must be at least :math:`4\,\mathrm{ulp}(\max(|a|, |b|))` apart (:func:`check_node_gaps`).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..backend import to_host

__all__ = ["real_host_array", "host_points", "as_values", "check_values", "MIN_DOMAIN_ULPS", "MIN_NODE_GAP_ULPS",
           "check_domain", "check_node_gaps", "is_native_array", "is_half", "through_float32"]


def real_host_array(values, argname: str = "values") -> np.ndarray:
    """``values`` (any array-like of real numbers) as a host float64 array.

    Raises
    ------
    TypeError
        For complex numbers (never silently truncated to their real part) and for anything
        that is not numbers (strings, objects, ragged nested lists).
    """
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{argname} must be an array of real numbers ({exc})") from None
    if np.iscomplexobj(arr):
        raise TypeError(f"{argname} must be real, got complex values (dtype {arr.dtype}); "
                        "pass the real and imaginary parts separately")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{argname} must be an array of real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def host_points(points, argname: str = "points") -> np.ndarray:
    """Evaluation points (a host or device array of any namespace, or a list) as a host float64
    array: complex points are refused, never cut to their real part (:func:`real_host_array`)."""
    if array_api_compat.is_array_api_obj(points) and not isinstance(points, np.ndarray):
        points = to_host(points)  # device arrays and torch bfloat16, which NumPy cannot read
    return real_host_array(points, argname)


def as_values(values, n: int, axis: int, argname: str = "values", allow_complex: bool = False):
    """Accept an array-like of discretized values and validate it (see :func:`check_values`).

    Arrays of any array-API namespace are kept as they are; lists, tuples and other
    array-likes become host float64 arrays; NumPy integer and boolean arrays become float64.

    Returns
    -------
    values, xp, axis
        The array, its namespace and the normalized (non-negative) axis.

    Raises
    ------
    TypeError
        For complex values (unless ``allow_complex``) or values that are not numbers.
    ValueError
        As :func:`check_values`.
    """
    if isinstance(values, np.ndarray) and values.dtype.kind in "biu":
        values = values.astype(np.float64)
    elif not array_api_compat.is_array_api_obj(values) or isinstance(values, np.generic):
        values = real_host_array(values, argname)
    xp = array_api_compat.array_namespace(values)
    if not allow_complex and xp.isdtype(values.dtype, "complex floating"):
        raise TypeError(f"{argname} must be real, got complex values (dtype {values.dtype}); "
                        "pass the real and imaginary parts separately")
    if not xp.isdtype(values.dtype, ("real floating", "complex floating")):
        raise TypeError(f"{argname} must be an array of real numbers, got dtype {values.dtype}")
    xp, axis = check_values(values, n, axis, argname)
    return values, xp, axis


def check_values(values, n: int, axis: int, argname: str = "values"):
    """Validate an array of discretized values: length ``n`` along ``axis`` and all finite.

    Returns the array namespace of ``values`` and the normalized (non-negative) axis.
    """
    xp = array_api_compat.array_namespace(values)
    ndim = values.ndim
    if ndim == 0:
        raise ValueError(f"{argname} must have at least one dimension, got a scalar")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {argname} with {ndim} dimensions")
    axis = axis % ndim
    if values.shape[axis] != n:
        raise ValueError(
            f"{argname} has length {values.shape[axis]} along axis {axis}, expected n = {n}"
        )
    if not bool(xp.all(xp.isfinite(values))):
        raise ValueError(f"{argname} contains NaN or inf")
    return xp, axis


#: A domain ``(a, b)`` must be at least this many ulps of ``max(|a|, |b|)`` long, and
#: neighbouring nodes at least :data:`MIN_NODE_GAP_ULPS` ulps apart.
MIN_DOMAIN_ULPS = 64
MIN_NODE_GAP_ULPS = 4
# Endpoints beyond this magnitude make b - a, a + b or 2 x overflow.
_MAX_ENDPOINT = np.finfo(np.float64).max / 2


def check_domain(domain) -> tuple[float, float]:
    r"""Validate an interval ``(a, b)`` and return it as a pair of floats.

    The interval must be representable with room for its nodes: :math:`a < b`, both finite,
    :math:`\max(|a|, |b|) \le` half the largest float64 (so :math:`b - a`, :math:`a + b`
    and :math:`2x` never overflow), and
    :math:`b - a \ge 64\,\mathrm{ulp}(\max(|a|, |b|))` (a shorter interval holds fewer than 64
    float64 numbers, and its nodes, weights and interpolants are rounding noise).

    Raises
    ------
    ValueError
        Naming the domain, the rule it breaks and the remedy.
    """
    try:
        ends = tuple(domain)
        # float() would read True as 1.0 and "0.5" as 0.5: neither is an interval end
        if any(isinstance(v, (bool, np.bool_, str, bytes)) for v in ends):
            raise TypeError
        a, b = (float(v) for v in ends)
    except (TypeError, ValueError):
        raise ValueError(f"domain must be a pair (a, b) of real numbers, got {domain!r}; pass "
                         "e.g. domain=(0.0, 1.0)") from None
    if not (math.isfinite(a) and math.isfinite(b)) or not a < b:
        raise ValueError(f"domain must be a finite interval (a, b) with a < b, got {domain!r}")
    scale = max(abs(a), abs(b))
    if scale > _MAX_ENDPOINT:
        raise ValueError(f"domain {domain!r}: endpoints must have magnitude at most "
                         f"{_MAX_ENDPOINT:.4g} (half the largest float64) so that b - a does not "
                         "overflow; rescale the variable to a smaller interval")
    ulp = float(np.spacing(scale))
    if b - a < MIN_DOMAIN_ULPS * ulp:
        raise ValueError(f"domain {domain!r} is too short to be represented: b - a = {b - a:.3g} is "
                         f"{(b - a) / ulp:.3g} ulp of its endpoints, at least {MIN_DOMAIN_ULPS} are "
                         "needed; shift the variable so the interval sits near 0, or lengthen it")
    return a, b


def check_node_gaps(nodes: np.ndarray, disc, what: str = "nodes") -> np.ndarray:
    r"""Refuse 1-D ``nodes`` whose neighbours are less than
    :data:`MIN_NODE_GAP_ULPS` ulps of ``max(|a|, |b|)`` apart (they would round together).

    Raises
    ------
    ValueError
        Naming the discretization, its ``n`` and domain, and the remedy.
    """
    a, b = disc.domain
    gap = MIN_NODE_GAP_ULPS * float(np.spacing(max(abs(a), abs(b))))
    if nodes.size > 1 and not np.all(np.diff(nodes) >= gap):
        raise ValueError(f"{type(disc).__name__}: the {what} of n = {disc.n} values on the domain ({a!r}, {b!r}) "
                         f"are not {MIN_NODE_GAP_ULPS} ulp apart in float64; use a smaller n or a "
                         "longer domain")
    return nodes


def is_native_array(x) -> bool:
    """True for NumPy and CuPy arrays (the libraries with a :class:`~ctformer.backend.Backend`)."""
    return array_api_compat.is_numpy_array(x) or array_api_compat.is_cupy_array(x)


def is_half(values) -> bool:
    """Whether ``values`` is a half-precision array: NumPy or CuPy float16, torch float16 or
    bfloat16 (sparse matrices and FFTs have none of these)."""
    return str(values.dtype).rsplit(".", 1)[-1] in ("float16", "bfloat16")


def through_float32(function, values, keep_complex: bool = False):
    """``function(values)`` for a half-precision ``values``, computed on float32 and rounded once
    to its dtype (a complex result stays complex64 with ``keep_complex``: there is no complex
    half)."""
    xp = array_api_compat.array_namespace(values)
    out = function(xp.astype(values, xp.float32))
    if keep_complex and xp.isdtype(out.dtype, "complex floating"):
        return out
    return xp.astype(out, values.dtype)
