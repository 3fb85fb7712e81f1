r"""One-pass normalization of NumPy states by the compiled loops (LayerNorm, RMSNorm, sphere).

:func:`normalized_rows` gives :math:`g (u - \mu) / \sqrt{\sigma^2 + \varepsilon} + c` for
every token of a float32 or float64 NumPy state in one compiled pass
(:func:`ctformer._numerics.normalization_loops.normalize_rows`) where the plain formula is the
scale-safe one, else None: the NumPy engine is in use, or some token is too large or too small
to square, or (:math:`\varepsilon = 0`) has no variance to speak of. The callers in
:mod:`ctformer.operators.normalization` then evaluate their scale-safe NumPy formulas, which
also name a degenerate token. A normalization evaluated this way makes one pass over the state
and one call instead of about ten array operations, which is most of its cost on small states.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import compiled as _compiled

__all__ = ["normalized_rows", "rows_plan"]

_EMPTY = np.empty(0)
# With eps = 0: the largest entry a row may have (sums of squares in float64 stay finite and normal), and
# the rounding noise of a variance relative to the largest entry, per input dtype.
_LIMITS = {np.dtype(np.float64): (2.0 ** 400, 64.0 * float(np.finfo(np.float64).eps)),
           np.dtype(np.float32): (2.0 ** 126, 64.0 * float(np.finfo(np.float32).eps))}
# With eps > 0: the smallest variance + eps taken without rescaling, per input dtype (float32
# rows are summed in float64, where their squares never underflow).
_SMALLEST = {np.dtype(np.float64): 2.0 ** -800, np.dtype(np.float32): 0.0}


@lru_cache(maxsize=1)
def _kernel():
    from . import normalization_loops as _loops

    return _compiled._compiling_uninterrupted(_loops.normalize_rows)


def normalized_rows(u, w, eps: float, centre: bool, gain=None, shift=None):
    """The normalized state (a new array of ``u``'s shape and dtype), or None (see the module).

    ``w``: feature weights (d,) summing to 1; ``gain``, ``shift``: (d,) or None; NumPy arrays.
    """
    plan = rows_plan(u, w, eps, centre, gain, shift)
    return None if plan is None else plan(u)


def rows_plan(like, w, eps: float, centre: bool, gain=None, shift=None):
    """:func:`normalized_rows` for C-contiguous NumPy states of ``like``'s shape and dtype, as
    a callable ``u -> new array or None``, with every check that does not depend on the
    values made now; None where the compiled pass does not apply to such states."""
    if type(like) is not np.ndarray or like.dtype not in _LIMITS or like.ndim < 1 or like.size == 0:
        return None
    d = like.shape[-1]
    if (not _vector(w, d) or (gain is not None and not _vector(gain, d))
            or (shift is not None and not _vector(shift, d)) or _compiled.loop_engine() != "numba"):
        return None
    shape, rows, dtype, kernel = like.shape, (like.size // d, d), like.dtype, _kernel()
    arguments = (w, float(eps), centre, _EMPTY if gain is None else gain, _EMPTY if shift is None else shift,
                 *_LIMITS[dtype], _SMALLEST[dtype])

    def normalized(u):
        out = np.empty(rows, dtype=dtype)
        return out.reshape(shape) if kernel(u.reshape(rows), *arguments, out) else None

    return normalized


def _vector(a, d: int) -> bool:
    return type(a) is np.ndarray and a.shape == (d,) and a.dtype.kind == "f"
