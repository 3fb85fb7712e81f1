r"""The log of the attention normalizer, :math:`\log Z_i`, computed without overflow.

.. math::

    \log Z_i = \log \sum_j w_j m_{ij} e^{\beta\, q_i \cdot k_j}
             = s^\ast_i + \log \sum_j e^{\beta\, q_i \cdot k_j + \log w_j - s^\ast_i},
    \qquad s^\ast_i = \max_j \big(\beta\, q_i \cdot k_j + \log w_j\big),

the maximum and the sum over the kept keys (:math:`m_{ij} = 1`), in blocks of query rows of
about :math:`2^{20}` scores. Every term of the sum is at most one and the largest is one, so
:math:`\log Z_i` is finite for every finite input. The unnormalized dynamics (USA) multiply
the SA velocity by :math:`Z_i = \exp(\log Z_i)`; :func:`ctformer.particles.energy` sums it.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import array_api_compat
import numpy as np

from .._numerics.blas_limits import single_thread_blas as _single_thread_blas

from .particle_checks import _as_real_floating, _check_beta, _host_real

__all__ = ["log_partition"]

_CHUNK_ELEMENTS = 1 << 20


def log_partition(q, k, *, beta, weights=None, mask=None, chunk=None):
    r"""The log of the attention normalizer, computed stably.

    .. math::

        \log Z_i = \log \sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)
                 = s^\ast_i + \log \sum_j \exp(\beta\, q_i\cdot k_j + \log w_j - s^\ast_i),

    with :math:`s^\ast_i` the row maximum of the exponent (log-sum-exp), in chunks of query rows.

    Parameters
    ----------
    q : array, shape (..., N, m)
    k : array, shape (..., M, m)
    beta : float
        Finite inverse temperature.
    weights : array, shape (M,), optional
        Positive token weights; default :math:`w_j = 1/M`. Their logarithm is taken in the
        wider of their precision and ``q``'s, so float64 weights beyond ``q``'s range (1e-50
        with float32 ``q``) count with their value.
    mask : None, "causal" or bool array broadcasting to (..., N, M)
        Entries kept (``"causal"``: :math:`j \le i`).
    chunk : int, optional
        Query rows per block (default: about a million scores per block).

    Returns
    -------
    array, shape (..., N)
        Finite for every finite input (no overflow at large :math:`\beta`).

    Raises
    ------
    TypeError
        For complex or non-numeric ``q``, ``k`` or ``weights`` (integers become float64).
    ValueError
        For a non-finite ``beta``, no keys, bad weights, a mask that is not boolean or
        keeps no key in some row.
    """
    # Integers become float64: the weights are cast to q's dtype (integer 1.5 would be 1).
    q, k = _as_real_floating(q, "q"), _as_real_floating(k, "k")
    xp = array_api_compat.array_namespace(q, k)
    beta = _check_beta(beta)
    n, m = q.shape[-2], k.shape[-2]
    if m == 0:
        raise ValueError(f"k must hold at least one key (shape (..., M >= 1, m)), got shape "
                         f"{tuple(k.shape)}: log Z of an empty sum is -inf")
    log_w = -math.log(m) if weights is None else _log_weights(xp, weights, m, q)
    if isinstance(mask, str):
        if mask != "causal" or n != m:
            raise ValueError(f"mask must be None, 'causal' (square) or a boolean array, got {mask!r}")
    elif mask is not None:
        mask = xp.asarray(mask)
        if mask.dtype != xp.bool:
            raise ValueError(f"mask must be None, 'causal' or a boolean array, got dtype {mask.dtype}; "
                             "pass mask.astype(bool) if nonzero means kept")
        if not bool(xp.all(xp.any(mask, axis=-1))):
            raise ValueError("mask removes every key for some query row (log Z would be -inf); each "
                             "row needs one True")
    if chunk is None:
        batch = math.prod(q.shape[:-2]) or 1
        chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, m * batch)))
    return _log_partition(xp, q, k, beta, log_w, mask, chunk)


def _log_weights(xp, weights, m, like):
    r""":math:`\log w_j` in the namespace, device and dtype of ``like``, checked (shape (m,),
    positive, finite) and taken in the wider of the weights' and ``like``'s precisions: float64
    weights of 1e-50 are 0 in float32, where :math:`\log w = -115.1` is an ordinary number.
    Weights of ``like``'s namespace stay in it (differentiable); others go through the host."""
    if (array_api_compat.is_array_api_obj(weights) and array_api_compat.array_namespace(weights) is xp
            and not xp.isdtype(weights.dtype, "complex floating")):  # complex: refused on the host
        w = xp.astype(weights, xp.result_type(weights.dtype, like.dtype))
    else:
        w = _host_real(weights, "weights")
    wxp = array_api_compat.array_namespace(w)
    if w.ndim != 1 or w.shape[0] != m:
        raise ValueError(f"weights must have shape ({m},), one per key, got {tuple(w.shape)}")
    if not bool(wxp.all(w > 0)) or not bool(wxp.all(wxp.isfinite(w))):
        raise ValueError("weights must be positive and finite; drop the tokens of weight zero")
    if wxp is xp:
        return xp.astype(xp.log(w), like.dtype)
    return xp.asarray(np.log(w), dtype=like.dtype, device=array_api_compat.device(like))


def _log_partition(xp, q, k, beta, log_w, mask, chunk):
    """log Z without checks (inputs validated where they entered)."""
    n, m = q.shape[-2], k.shape[-2]
    causal = isinstance(mask, str)
    kt = xp.matrix_transpose(k)
    cols = xp.arange(m)
    blocks = []
    # NumPy's products on one BLAS thread: OpenBLAS's threaded product rounds otherwise, and
    # the library's bits never depend on the thread count
    limit = _single_thread_blas() if isinstance(q, np.ndarray) else None
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        with limit if limit is not None else nullcontext():
            s = (q[..., start:stop, :] @ kt) * beta + log_w
        if causal:
            s = xp.where(cols[None, :] <= xp.arange(start, stop)[:, None], s, -xp.inf)
        elif mask is not None:
            s = xp.where(mask[..., start:stop, :], s, -xp.inf)
        s_max = xp.max(s, axis=-1, keepdims=True)
        blocks.append(s_max[..., 0] + xp.log(xp.sum(xp.exp(s - s_max), axis=-1)))
    return xp.concat(blocks, axis=-1) if len(blocks) > 1 else blocks[0]
