r"""The banded attention engine: softmax attention over the columns a pattern reaches, by blocks.

:class:`BandedAttention` is prepared once (a sparse pattern's row index, the key weights, the
positions and an additive score term) and then evaluated without checks: for each block of
query rows :math:`[a, b)` it densifies the slab of key columns :math:`[lo, hi)` spanned by the
pattern's entries in those rows and either passes it as a boolean mask to
the dense engine (:func:`~ctformer._numerics.dense.attend_trusted`), or, with a score term
:math:`b(p_i - p'_j)` (ALiBi), evaluates the exponent itself with the row maximum subtracted,

.. math::

    \mathrm{out}_i = \frac{\sum_j m_{ij}\, e^{s_{ij} - \mu_i} v_j}{\sum_j m_{ij}\, e^{s_{ij} - \mu_i}},
    \qquad s_{ij} = \beta\, q_i \cdot k_j + \log w_j + b(p_i - p'_j),

so that the work and the extra memory are :math:`O(N W)` for a band of :math:`W` keys. A query
that keeps no key gets output zero. :func:`~ctformer.operators.local_attention.local_attention`
is its validating front end.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..discretizations.memory import check_allocation
from .dense import attend_trusted, check_sizes, log_in
from .scale_safety import scale_safe_inputs, times_pow2
from .score_terms import ScoreTerms

__all__ = ["BandedAttention", "slopes_bias", "window_block_rows"]

# Score entries of one block (rows x slab columns x leading axes) for the score-term kernel and
# the default block size: about 32 MiB of float64 scores on the host.
_BLOCK_ELEMENTS = 1 << 22



def window_block_rows(pattern_width: int, lead: int = 1) -> int:
    """Query rows per block for a band of ``pattern_width`` keys per row: about the band's
    width (so a slab is at most about twice the band), within the score budget."""
    width = max(1, int(pattern_width))
    rows = max(16, width)
    budget = max(16, _BLOCK_ELEMENTS // max(1, lead * 2 * width))
    return int(min(rows, budget))


class _RowIndex:
    """Row-sorted coordinates of a sparse pattern, for slicing blocks of rows in O(entries)."""

    def __init__(self, pattern):
        import sparse

        if not isinstance(pattern, sparse.SparseArray):
            raise TypeError(f"pattern must be a pydata sparse array (e.g. window_pattern(...)), "
                            f"got {type(pattern).__name__}")
        pattern = sparse.COO(pattern)
        if pattern.ndim < 2:
            raise ValueError(f"pattern must have shape (..., N, M), got {pattern.shape}")
        if pattern.dtype != np.bool_:
            raise TypeError(f"pattern must be boolean, got dtype {pattern.dtype}")
        coords = pattern.coords
        data = np.asarray(pattern.data, dtype=bool)
        if not data.all():  # explicit False entries are not kept
            coords = coords[:, data]
        rows = coords[-2]
        if rows.size and np.any(rows[1:] < rows[:-1]):  # row-major already for 2-D patterns
            coords = coords[:, np.argsort(rows, kind="stable")]
        self.coords = coords
        self.shape = pattern.shape
        self.row_starts = np.searchsorted(self.coords[-2], np.arange(self.shape[-2] + 1))
        width = np.diff(self.row_starts)
        self.max_row = int(width.max()) if width.size else 0

    def slab(self, a, b, check=None):
        """``(lo, hi, dense)``: the key columns spanned by rows [a, b) and the dense slab;
        ``check(lo, hi)``, when given, runs before the slab is made (it may refuse it)."""
        s, e = self.row_starts[a], self.row_starts[b]
        c = self.coords[:, s:e]
        if c.shape[1] == 0:
            return 0, 1, np.zeros((*self.shape[:-2], b - a, 1), dtype=bool)
        lo, hi = int(c[-1].min()), int(c[-1].max()) + 1
        if check is not None:
            check(lo, hi)
        dense = np.zeros((*self.shape[:-2], b - a, hi - lo), dtype=bool)
        dense[(*c[:-2], c[-2] - a, c[-1] - lo)] = True
        return lo, hi, dense


def slopes_bias(slopes):
    r"""The ALiBi score term :math:`-m_h |p - p'|` as a ``bias`` for :class:`BandedAttention`:
    ``slopes`` broadcast against the leading axes like ``beta``."""
    def bias(difference):
        xp = array_api_compat.array_namespace(difference)
        return -(_leading(xp, slopes, difference.dtype) * xp.abs(difference))
    return bias


class BandedAttention:
    r"""The banded engine, prepared once: a pattern's row index, weights, positions and bias.

    Calls (``engine(q, k, v, beta, key_mask=None, check=False)``) run the blocks of
    :func:`local_attention` without validating anything: the caller (a discretized attention
    operator, or :func:`local_attention`) has checked the arguments once.

    Parameters
    ----------
    n, m : int
        Numbers of queries and keys.
    pattern : sparse.COO of shape (..., n, m), optional
        Kept entries; default every key (with ``causal``, keys :math:`j \le i`).
    weights : ndarray (m,) of float64, optional
        Positive key weights.
    bias : callable, optional
        ``bias(difference)``: the additive score term for the positions' differences
        :math:`p_i - p'_j` (an array ``(rows, cols)`` in the namespace and dtype of ``q``),
        broadcasting against the leading axes; needs ``positions``.
    positions : tuple of two ndarrays (n,), (m,) or None
    causal, diagonal, block, fallback_to_self
        As in :func:`local_attention`.
    cap : float, optional
        Soft-capping of the score, :math:`s \mapsto c \tanh(s / c)` on
        :math:`s = \beta\, q \cdot k` (before the key weights, the bias and the masks).
    """

    def __init__(self, n, m, *, pattern=None, weights=None, bias=None, positions=(None, None),
                 causal=False, diagonal="full", block=None, fallback_to_self=False, cap=None):
        self.index = None
        if pattern is not None:
            self.index = _RowIndex(pattern)
            if self.index.shape[-2:] != (n, m):
                raise ValueError(f"pattern must have shape (..., {n}, {m}), got {self.index.shape}")
        self.n, self.m, self.weights, self.bias = n, m, weights, bias
        self.p, self.pk = positions
        self.causal, self.half, self.block = causal, diagonal == "half", block
        self.fallback_to_self = fallback_to_self
        self.cap = cap

    def _block_rows(self, q, k) -> int:
        if not self.n:
            return 1
        if self.block is not None:
            return int(min(self.block, self.n))
        lead = math.prod(np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]))) or 1
        width = self.index.max_row if self.index is not None else self.m
        return int(min(window_block_rows(width, lead), self.n))

    def __call__(self, q, k, v, beta, key_mask=None, check=False):
        xp = array_api_compat.array_namespace(q, k, v)
        block, v_scale = self._block_rows(q, k), None
        lead = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
        check_sizes(lead, self.n, self.m, v.shape[-1], q.dtype)
        if check:
            leading = _leading(xp, beta, q.dtype)
            q, scaled, k, v, v_scale = scale_safe_inputs(xp, q, k, v, leading)
            beta = beta if scaled is leading else scaled  # rescaled: beta is folded into q
        out = [self._rows(xp, q, k, v, beta, key_mask, a, min(self.n, a + block))
               for a in range(0, self.n, block)]
        if not out:
            return xp.zeros((*np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2])), 0, v.shape[-1]),
                            dtype=q.dtype)
        return times_pow2(xp, xp.concat(out, axis=-2) if len(out) > 1 else out[0], v_scale)

    def _keep(self, xp, key_mask, a, b, problems=None):
        """``(lo, hi, keep)``: the key columns of rows [a, b) and their kept entries (or None);
        ``problems``: the (batch, head) problems whose scores the block holds, where it is to be
        checked against the memory budget (None: not checked)."""
        causal = self.causal
        if self.index is not None:
            lo, hi, keep = self.index.slab(a, b, None if problems is None else
                                           lambda lo, hi: _check_block(a, b, lo, hi, problems))
        else:
            lo, hi, keep = 0, (b if causal else self.m), None
            _check_block(a, b, lo, hi, problems)
        rows = np.arange(a, b)[:, None]
        cols = np.arange(lo, hi)[None, :]
        if causal and self.index is not None:
            keep = keep & (cols <= rows)
        keep_x = None if keep is None else xp.asarray(keep)
        if key_mask is not None:
            pad = key_mask[..., None, lo:hi]
            keep_x = pad if keep_x is None else (keep_x & pad)
        if keep_x is not None and self.fallback_to_self:
            empty = ~xp.any(keep_x, axis=-1)
            if bool(xp.any(empty)):
                inside = (rows >= lo) & (rows < hi)
                if not bool(np.all(inside)):
                    raise ValueError("fallback_to_self needs each query's own key inside its slab")
                keep_x = keep_x | (xp.asarray(cols == rows) & empty[..., None])
        return lo, hi, keep_x

    def _rows(self, xp, q, k, v, beta, key_mask, a, b):
        """The attention output of the query rows [a, b)."""
        # a block asked for is checked; the default ones hold at most _BLOCK_ELEMENTS scores
        problems = None if self.block is None else \
            math.prod(np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2])))
        lo, hi, keep_x = self._keep(xp, key_mask, a, b, problems)
        dtype = q.dtype
        w = None
        if self.weights is not None:  # NumPy: float64 weights, their log taken before the cast (log_in)
            w = self.weights[lo:hi] if type(q) is np.ndarray else xp.asarray(self.weights[lo:hi], dtype=dtype)
        qb, kb, vb = q[..., a:b, :], k[..., lo:hi, :], v[..., lo:hi, :]
        causal_rows = (a, lo) if self.causal else None
        bias = None if self.bias is None else \
            self.bias(xp.asarray(self.p[a:b, None] - self.pk[None, lo:hi], dtype=dtype))
        if self.half and self.causal:
            return _scored(xp, qb, kb, vb, beta, w, keep_x, bias, causal_rows=causal_rows,
                           half=self.half, cap=self.cap)
        if self.causal and self.index is None:  # keys [0, b): the block's lower triangle
            block = _causal_block(xp, a, b)
            keep_x = block if keep_x is None else keep_x & block
        # blocks of a validated state: the dense engine's unchecked entry (cap and score term included)
        terms = None if self.cap is None and bias is None else ScoreTerms(self.cap, bias)
        return attend_trusted(qb, kb, vb, beta, w, keep_x, "full", terms=terms)


def _check_block(a, b, lo, hi, problems):
    """Refuse a block of query rows [a, b) whose slab of keys [lo, hi) would not fit the memory
    budget (float64 scores of ``problems`` problems), before it is made. ``problems`` None:
    no check (the default blocks hold at most ``_BLOCK_ELEMENTS`` scores; a ``block`` asked
    for may hold more)."""
    if problems is not None:
        check_allocation(8.0 * problems * (b - a) * (hi - lo),
                         f"a block of {b - a} query rows x {hi - lo} keys of scores for {problems} "
                         "(batch, head) problems", "pass a smaller block (query rows per block), or block=None")


def _causal_block(xp, a, b):
    """Boolean mask of keys [0, b) for query rows [a, b): j <= i."""
    return xp.asarray(np.arange(b)[None, :] <= np.arange(a, b)[:, None])


def _scored(xp, q, k, v, beta, w, keep, bias, causal_rows=None, half=False, cap=None):
    """One block of softmax attention with an additive exponent term ``bias`` and an optional
    soft cap ``cap`` of the score, rows normalized by their max."""
    dtype = q.dtype
    beta = _leading(xp, beta, dtype)
    s = (q * beta) @ xp.matrix_transpose(k)
    if cap is not None:
        s = cap * xp.tanh(s / cap)
    if w is not None:
        s = s + log_in(xp, w, dtype)
    if bias is not None:
        s = s + bias
    if causal_rows is not None:
        a, lo = causal_rows
        r, c = s.shape[-2], s.shape[-1]
        i = np.arange(a, a + r)[:, None]
        j = np.arange(lo, lo + c)[None, :]
        s = xp.where(xp.asarray(j <= i), s, -xp.inf)
        if half:
            s = s + xp.asarray(np.where(j == i, math.log(0.5), 0.0), dtype=dtype)
    if keep is not None:
        s = xp.where(keep, s, -xp.inf)
    # a row without keys has maximum -inf: 0 instead gives p = 0 on the row, and a
    # denominator of 0 + 1 its output 0 (a kept row's denominator is >= 1: no change)
    top = xp.max(s, axis=-1, keepdims=True)
    top = xp.where(xp.isinf(top), xp.zeros_like(top), top)
    p = xp.exp(s - top)
    den = xp.sum(p, axis=-1, keepdims=True)
    return (p @ v) / (den + xp.astype(den == 0, dtype))


def _leading(xp, value, dtype):
    """A scalar, or an array over the leading axes reshaped to (..., 1, 1)."""
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    arr = xp.asarray(value, dtype=dtype)
    return arr if arr.ndim == 0 else arr[..., None, None]
