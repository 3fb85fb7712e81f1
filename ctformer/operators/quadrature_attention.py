r"""Quadrature attention: the functional core of self-attention as an integral operator.

For queries :math:`q_i`, keys :math:`k_j`, values :math:`v_j` at token nodes :math:`x_j` with
quadrature weights :math:`w_j` and a mask :math:`m_{ij} \in \{0, 1\}`,

.. math::

    \mathrm{out}_i = \frac{\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j} v_j}
                          {\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j}},

the quadrature of :math:`\int_X \gamma(x_i, x') v(x') dx'` with the state-dependent kernel
:math:`\gamma` of DESIGN.md section 1. Uniform weights cancel (ordinary softmax attention);
other weights enter as a log-weight bias, :math:`\mathrm{softmax}_j(\beta q_i\cdot k_j + \log w_j)`.

The sum is computed in query chunks with the row maximum subtracted (log-sum-exp), so memory
is :math:`O(\text{chunk} \times N)` and the result is finite in float32 and for very large
:math:`\beta`.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

__all__ = ["quadrature_attention"]

# Target size of one chunk of scores, in elements (8 MiB in float64).
_CHUNK_ELEMENTS = 1 << 20


def quadrature_attention(q, k, v, *, beta, weights=None, mask=None, diagonal="full", chunk=None):
    r"""Softmax attention as a quadrature of a nonlocal integral operator.

    .. math::

        \mathrm{out}_i = \frac{\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)\, v_j}
                              {\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)}

    Parameters
    ----------
    q : array, shape (..., N, d)
        Queries at the N query nodes.
    k : array, shape (..., M, d)
        Keys at the M key nodes.
    v : array, shape (..., M, e)
        Values at the M key nodes.
    beta : float or array
        Inverse temperature; a scalar or an array broadcasting against the leading (batch,
        head) axes, e.g. shape ``(H,)`` for one value per head when ``q`` is ``(B, H, N, d)``.
        Must be finite.
    weights : array, shape (M,), optional
        Positive quadrature weights of the key nodes. Default: uniform (plain softmax).
    mask : None, "causal" or bool array broadcasting to (..., N, M), optional
        ``"causal"`` keeps :math:`x_j \le x_i` (requires N == M). A boolean array keeps the
        entries that are True; every row must keep at least one entry.
    diagonal : {"full", "half"}
        With ``mask="causal"``: weight of the diagonal cell. ``"full"`` is the standard causal
        mask (first-order quadrature of :math:`\int_0^{x_i}`); ``"half"`` gives it weight
        :math:`w_i / 2` (second order on midpoint nodes, DESIGN.md section 2).
    chunk : int, optional
        Number of query rows processed at once. Default: chosen so that one block of scores
        has about a million entries.

    Returns
    -------
    array, shape (..., N, e)
        Same array library and dtype as ``q``.

    Raises
    ------
    ValueError
        For mismatched shapes, non-positive weights, non-finite ``beta`` or a bad mask.
    """
    xp = array_api_compat.array_namespace(q, k, v)
    q, k, v, beta, log_w, keep, diag_shift = _validate(xp, q, k, v, beta, weights, mask, diagonal)
    n, m = q.shape[-2], k.shape[-2]
    if chunk is None:
        batch = math.prod(q.shape[:-2]) or 1
        chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, m * batch)))
    elif isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    kt = xp.matrix_transpose(k)
    causal = isinstance(mask, str)
    cols = xp.arange(m)
    blocks = []
    for start in range(0, n, int(chunk)):
        stop = min(n, start + int(chunk))
        s = (q[..., start:stop, :] @ kt) * beta
        if log_w is not None:
            s = s + log_w
        if causal:
            rows = xp.arange(start, stop)[:, None]
            s = xp.where(cols[None, :] <= rows, s, -xp.inf)
            if diag_shift is not None:
                s = s + xp.where(cols[None, :] == rows, diag_shift, 0.0)
        elif keep is not None:
            s = xp.where(keep[..., start:stop, :], s, -xp.inf)
        s = s - xp.max(s, axis=-1, keepdims=True)
        p = xp.exp(s)
        blocks.append((p @ v) / xp.sum(p, axis=-1, keepdims=True))
    return xp.concat(blocks, axis=-2) if len(blocks) > 1 else blocks[0]


def _validate(xp, q, k, v, beta, weights, mask, diagonal):
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., tokens, features), got shape {tuple(a.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of tokens, got {k.shape[-2]} and {v.shape[-2]}")
    try:
        xp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"leading (batch, head) axes of q, k, v do not broadcast: "
            f"{tuple(q.shape[:-2])}, {tuple(k.shape[:-2])}, {tuple(v.shape[:-2])}"
        ) from None
    n, m = q.shape[-2], k.shape[-2]
    dtype = xp.result_type(q, k, v)
    if not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"q, k, v must be real floating arrays, got dtype {dtype}")

    # beta: scalar or array over the leading axes -> shape (..., 1, 1)
    if isinstance(beta, (int, float, np.floating, np.integer)) and not isinstance(beta, bool):
        if not math.isfinite(float(beta)):
            raise ValueError(f"beta must be finite, got {beta!r}")
        beta = float(beta)
    else:
        beta = xp.asarray(beta, dtype=dtype)
        if not bool(xp.all(xp.isfinite(beta))):
            raise ValueError("beta must be finite")
        if beta.ndim > 0:
            beta = beta[..., None, None]

    log_w = None
    if weights is not None:
        w = xp.asarray(weights, dtype=dtype)
        if w.ndim != 1 or w.shape[0] != m:
            raise ValueError(f"weights must have shape ({m},) (one per key token), got {tuple(w.shape)}")
        if not bool(xp.all(w > 0)) or not bool(xp.all(xp.isfinite(w))):
            raise ValueError("weights must be positive and finite")
        log_w = xp.log(w)

    if diagonal not in ("full", "half"):
        raise ValueError(f"diagonal must be 'full' or 'half', got {diagonal!r}")
    keep = None
    diag_shift = None
    if mask is None:
        if diagonal == "half":
            raise ValueError("diagonal='half' only applies with mask='causal'")
    elif isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or a boolean array, got {mask!r}")
        if n != m:
            raise ValueError(f"mask='causal' needs as many queries as keys, got {n} and {m}")
        if diagonal == "half":
            diag_shift = math.log(0.5)
    else:
        keep = xp.asarray(mask)
        if keep.dtype != xp.bool:
            raise ValueError(f"mask array must be boolean, got dtype {keep.dtype}")
        if keep.ndim < 2 or keep.shape[-2:] != (n, m):
            raise ValueError(f"mask array must have shape (..., {n}, {m}), got {tuple(keep.shape)}")
        if not bool(xp.all(xp.any(keep, axis=-1))):
            raise ValueError("mask removes every key for some query; each row needs one kept entry")
        if diagonal == "half":
            raise ValueError("diagonal='half' only applies with mask='causal'")
    return q, k, v, beta, log_w, keep, diag_shift
