r"""Scale safety of quadrature attention: inputs rescaled by powers of two so that no score
or weighted sum overflows, whatever the size of ``q``, ``k``, ``v`` and ``beta``.

With :math:`a_q, a_k, a_v` the largest magnitudes of ``q``, ``k``, ``v``, the scores are bounded
by :math:`|\beta|\, a_q a_k d` and the weighted sums by :math:`M a_v` (``d`` features, ``M``
keys). While both stay below :math:`\mathrm{finfo.max} / 8` (room for the log-weights, the
row-maximum subtraction and the sum over keys) nothing is changed. Otherwise each (batch, head)
problem is rescaled on its own, exactly: :math:`\hat q = 2^{-e_q} q`, :math:`\hat k = 2^{-e_k} k`
with entries at most 1 and :math:`c = \beta\, 2^{e_q + e_k}` folded into the queries (clamped at
:math:`\mathrm{finfo.max} / (8 d)`, beyond which the softmax is its hard-max limit either way),
and :math:`\hat v = 2^{-e_v} v` with the output multiplied by :math:`2^{e_v}` afterwards (each
factor a power of two, so the scaling itself is exact). The Notes of
:func:`ctformer.operators.quadrature_attention` state the guarantee.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

__all__ = ["finite_abs_max", "global_abs_max", "scale_safe_inputs", "scaled_inputs", "times_pow2"]

# Scores and weighted sums are kept below finfo.max / _HEADROOM (room for the log-weights,
# the row-maximum subtraction and the sum over keys).
_HEADROOM = 8.0


def scale_safe_inputs(xp, q, k, v, beta):
    """``(q, beta, k, v, e_v)`` as :func:`~ctformer.operators.quadrature_attention` computes with ``check=True``:
    the inputs unchanged, or rescaled by powers of two so that no score or weighted sum
    overflows; the output is then to be multiplied by ``2^e_v`` (:func:`times_pow2`; ``e_v``
    None: nothing to do). ``beta`` is a float or an array broadcasting as ``(..., 1, 1)``.

    Raises
    ------
    ValueError
        If ``q``, ``k`` or ``v`` holds NaN or inf (the message names it).
    TypeError
        If one of them is not a real floating array (integers, complex; the message names it).
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        kind = getattr(a.dtype, "kind", None)  # NumPy's at once; other libraries by the standard
        if not (kind == "f" if kind is not None else xp.isdtype(a.dtype, "real floating")):
            raise TypeError(f"q, k, v must be real floating arrays, got dtype {a.dtype} for {name}: "
                            "convert them first (e.g. .astype(np.float64))")
    return scaled_inputs(xp, q, k, v, beta, finite_abs_max(xp, q, k, v))


def times_pow2(xp, out, e):
    """``out * 2^e`` per leading index (exact); ``e`` None returns ``out``."""
    return out if e is None else _pow2(xp, out, e)


def finite_abs_max(xp, q, k, v):
    """(max|q|, max|k|, max|v|) as Python floats, one reduction per distinct array (the
    attention of a state with itself, ``q is k is v``, reduces it once); ValueError naming
    the array that holds NaN or inf (they propagate through the maximum)."""
    aq = global_abs_max(xp, q)
    ak = aq if k is q else global_abs_max(xp, k)
    amax = (aq, ak, aq if v is q else ak if v is k else global_abs_max(xp, v))
    for name, a in zip("qkv", amax):
        if not math.isfinite(a):
            raise ValueError(f"{name} must be finite; it contains NaN or inf")
    return amax


def scaled_inputs(xp, q, k, v, beta, amax):
    """(q, beta, k, v, None), or power-of-two rescaled inputs (scaled queries and beta = 1)
    and the output's exponent.

    ``amax`` holds max |q|, max |k|, max |v| over all entries (Python floats): when they bound
    everything well below overflow (the usual case) nothing else is computed. Otherwise the
    maxima of each (batch, head) problem are taken and the inputs of each problem rescaled
    on their own. See the Notes of :func:`~ctformer.operators.quadrature_attention`.
    """
    big = float(xp.finfo(q.dtype).max) / _HEADROOM
    d, m = max(1, q.shape[-1]), k.shape[-2]
    aq, ak, av = amax
    b = abs(beta) if isinstance(beta, float) else global_abs_max(xp, beta)
    # |beta q| and every partial sum of (beta q) . k stay below finfo.max / 8 (Python floats
    # overflow to inf, which fails the test)
    score_ok = b * aq * max(ak, 1.0) * d <= big
    sum_ok = av * m <= big
    if score_ok and sum_ok:
        return q, beta, k, v, None
    if score_ok:
        qs = q * beta
    else:
        eq, ek = _exponent(_abs_max(xp, q)), _exponent(_abs_max(xp, k))
        learnable = bool(getattr(beta, "requires_grad", False))
        beta_np = np.asarray(_to_numpy(beta.detach() if learnable else beta), dtype=np.float64)
        beta_np = beta_np[..., 0, 0] if beta_np.ndim else beta_np
        # c = beta 2^(eq + ek), clamped where it would exceed finfo.max / (8 d)
        with np.errstate(over="ignore"):
            c = np.ldexp(np.abs(beta_np), eq + ek)
        c = np.copysign(np.minimum(c, big / d), beta_np)
        qs = _pow2(xp, q, -eq) * (_learnable(xp, beta, beta_np, c, q) if learnable else _lead_array(xp, c, q))
        k = _pow2(xp, k, -ek)
    v_scale = None
    if not sum_ok:
        ev = _exponent(_abs_max(xp, v))
        v = _pow2(xp, v, -ev)
        v_scale = ev  # the output is scaled back by 2^ev
    return qs, 1.0, k, v, v_scale


def _learnable(xp, beta, beta_np, c, like):
    """c as beta * (c / beta), so that a torch beta in autograd keeps its gradient."""
    with np.errstate(all="ignore"):
        ratio = np.where(beta_np != 0, c / np.where(beta_np != 0, beta_np, 1.0), 0.0)
    if not np.all(np.isfinite(ratio)):
        raise FloatingPointError("beta requires a gradient, but q and k are so large that the "
                                 "rescaled scores cannot carry it; scale q and k down (e.g. "
                                 "normalize them) or detach beta")
    return beta * _lead_array(xp, ratio, like)


def _to_numpy(a):
    """Host NumPy view of a (small) array of any namespace; Python floats pass through."""
    if isinstance(a, (float, np.ndarray)):
        return a
    if array_api_compat.is_cupy_array(a):
        return a.get()
    try:
        return np.from_dlpack(a)
    except Exception:  # pragma: no cover - namespaces without DLPack
        return np.asarray(a)


def _abs_max(xp, a):
    """max |a| over the last two axes, as float64 NumPy (shape a.shape[:-2]); NaN propagates."""
    if math.prod(a.shape[-2:]) == 0:
        return np.zeros(a.shape[:-2])
    if isinstance(a, np.ndarray):  # two passes, no temporary of a's size
        return np.maximum(np.max(a, axis=(-2, -1)), -np.min(a, axis=(-2, -1))).astype(np.float64)
    return np.asarray(_to_numpy(xp.max(xp.abs(a), axis=(-2, -1))), dtype=np.float64)


def _exponent(a):
    """Integer e with a <= 2^e (0 where a == 0), elementwise on float64 NumPy values."""
    mant, e = np.frexp(a)
    return np.where(a > 0, e, 0).astype(np.int64)


def _pow2(xp, a, e):
    """a * 2^e per leading index (exact: two power-of-two factors, each representable)."""
    e = np.asarray(e)
    half = e // 2
    f1 = _lead_array(xp, np.ldexp(np.ones(e.shape), half), a)
    f2 = _lead_array(xp, np.ldexp(np.ones(e.shape), e - half), a)
    return (a * f1) * f2


def _lead_array(xp, values, like):
    """Per-leading-index float64 NumPy values as an array (..., 1, 1) of like's namespace/dtype."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim:
        values = values[..., None, None]
    if isinstance(like, np.ndarray):
        return values.astype(like.dtype)
    return xp.asarray(values.tolist(), dtype=like.dtype, device=array_api_compat.device(like))


def global_abs_max(xp, a) -> float:
    """max |a| as a Python float (0 for an empty array; NaN if a holds a NaN)."""
    if math.prod(a.shape) == 0:
        return 0.0
    if isinstance(a, np.ndarray):
        return max(float(a.max()), -float(a.min()))
    detach = getattr(a, "detach", None)  # a torch tensor in autograd: the value only
    return float(xp.max(xp.abs(a if detach is None else detach())))
