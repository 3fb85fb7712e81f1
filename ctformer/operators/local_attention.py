r"""Attention with position-dependent kernels: sliding windows and ALiBi, computed by blocks.

Sliding-window attention (design notes, section 10) keeps the keys of a band,

.. math::  m(x, x') = 1\{0 \le p(x) - p(x') < W\},

a mask with compact support: a banded integral operator in the token variable. Its pattern
is stored sparsely (:func:`window_pattern`, a pydata ``sparse.COO`` array with
:math:`O(N W)` entries), and :func:`local_attention` visits only the key columns each block of
query rows needs: for rows :math:`[a, b)` the slab of keys :math:`[lo, hi)` spanned by the
pattern's entries in those rows, densified and passed as a boolean mask to
:func:`~ctformer.operators.quadrature_attention.quadrature_attention`. With blocks of about
:math:`W` rows the work and the extra memory are :math:`O(N W)`, not :math:`O(N^2)`.

ALiBi (Press, Smith, Lewis 2022) adds :math:`-m_h |p(x) - p(x')|` to the exponent of head
:math:`h`. That is not a product of a query and a key term, so :func:`local_attention` with
``slopes`` adds it to each block of scores as the block is computed (over every key, or the
causal ones, on the dense engine's threaded paths; with a pattern or a key mask by the slabs
above), with the row maximum subtracted:

.. math::

    \mathrm{out}_i = \frac{\sum_j m_{ij}\, e^{s_{ij} - \mu_i} v_j}{\sum_j m_{ij}\, e^{s_{ij} - \mu_i}},
    \qquad s_{ij} = \beta_h\, q_i \cdot k_j + \log w_j - m_h |p_i - p_j| \ (+ \log\tfrac12
    \text{ on the diagonal with the half-weight causal rule}),

where :math:`\mu_i` is the row maximum over kept entries (every exponent :math:`\le 0`). A
query that keeps no key (a padding token whose window holds only padding) attends to an
empty set: its output is zero. With ``check=True`` the inputs are validated and rescaled by
powers of two where the scores could overflow, as in ``quadrature_attention``.

:func:`mask_pattern` gives the pattern of any :class:`~ctformer.operators.masks.Mask`; the
blocks are computed by the prepared engine
:class:`~ctformer._numerics.banded.BandedAttention`, which the attention operator
builds once per discretization and :func:`local_attention` once per call.
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from .. import validation
from ..backend import to_host
from .._numerics.banded import BandedAttention, slopes_bias, window_block_rows
from .._numerics.dense import attention_with_terms
from .._numerics.score_terms import DistanceTerm, ScoreTerms
from .masks import keep_flags
from .quadrature_attention import _all_float16, in_float32

__all__ = ["window_pattern", "mask_pattern", "local_attention", "window_block_rows", "BandedAttention"]


def _check_positions(positions, name: str) -> np.ndarray:
    p = np.asarray(positions, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be a non-empty 1-D array of finite positions, got shape {p.shape}")
    if np.any(np.diff(p) < 0):
        raise ValueError(f"{name} must be sorted in increasing order (token nodes are)")
    return p


def _check_slopes(slopes, *leading) -> None:
    """Refuse ALiBi ``slopes`` that are not finite numbers >= 0 or do not broadcast against the
    leading (batch, head) axes of ``q``, ``k``, ``v`` (shapes ``leading``) without adding
    axes (O(heads))."""
    host = to_host(slopes, np.float64)
    if not (np.all(np.isfinite(host)) and np.all(host >= 0)):
        raise ValueError(f"slopes must be finite numbers >= 0 (the ALiBi slopes m_h), got {host.tolist()}")
    try:
        lead = np.broadcast_shapes(*(tuple(s) for s in leading))
    except ValueError:
        return  # q, k, v themselves do not broadcast: refused with their names further on
    try:
        fits = np.broadcast_shapes(host.shape, lead) == lead
    except ValueError:
        fits = False
    if not fits:
        heads = lead[-1] if lead else 1
        raise ValueError(f"slopes of shape {host.shape} do not broadcast against the leading (batch, head) "
                         f"axes {tuple(lead)} of q, k, v; pass one slope per head, e.g. shape ({heads},)")


def _check_beta(beta) -> None:
    """Refuse a ``beta`` that is not finite (``check=True``), as ``quadrature_attention`` does."""
    if isinstance(beta, (bool, str, bytes)):
        raise TypeError(f"beta must be a real number or an array of them, got {beta!r}")
    if not np.all(np.isfinite(to_host(beta, np.float64))):
        raise ValueError(f"beta must be finite, got {beta!r}")


def _check_window(window) -> float:
    return validation.real(window, "window (a length in positions)", positive=True)


def window_pattern(positions, window, key_positions=None):
    r"""The sliding-window pattern :math:`1\{0 \le p_i - p'_j < W\}` as a sparse boolean array.

    Parameters
    ----------
    positions : array_like of shape (N,)
        Query positions :math:`p_i`, increasing (e.g. :meth:`ctformer.Grids.positions`).
    window : float
        :math:`W > 0`, in units of positions (HuggingFace ``sliding_window``).
    key_positions : array_like of shape (M,), optional
        Key positions :math:`p'_j`, increasing; default ``positions``.

    Returns
    -------
    sparse.COO of shape (N, M), dtype bool
        Row-major sorted coordinates; :math:`O(N W)` entries for unit-spaced positions.

    Notes
    -----
    Both ends of the band are decided with a tolerance of 1000 units in the last place of the
    largest position (about :math:`2 \cdot 10^{-13}` times it), so positions that are integers up
    to rounding, as :meth:`ctformer.Grids.positions` gives for ``run``, select exactly the
    discrete window.

    Raises
    ------
    ValueError
        For positions that are not finite, not 1-D or not increasing, or a bad ``window``.
    """
    import sparse

    p = _check_positions(positions, "positions")
    pk = p if key_positions is None else _check_positions(key_positions, "key_positions")
    w = _check_window(window)
    # keys j with p_i - W < p'_j <= p_i, the ends decided with a tolerance of 1000 ulps of the
    # largest position: positions that are integers up to rounding give the discrete window
    tol = 1000 * np.finfo(np.float64).eps * max(1.0, w, float(np.abs(p).max()), float(np.abs(pk).max()))
    lo = np.searchsorted(pk, p - w + tol, side="right")
    hi = np.searchsorted(pk, p + tol, side="right")
    counts = np.maximum(hi - lo, 0)
    rows = np.repeat(np.arange(p.size), counts)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    cols = np.arange(rows.size) + starts
    coords = np.stack([rows, cols])
    return sparse.COO(coords, np.ones(rows.size, dtype=bool), shape=(p.size, pk.size),
                      has_duplicates=False, sorted=True, fill_value=False)


def mask_pattern(mask, positions, key_positions=None):
    r"""The entries that a :class:`~ctformer.operators.masks.Mask` keeps, as a sparse boolean array.

    The candidates of row :math:`i` are the columns of the mask's band (:meth:`Mask.band`),
    or every column when it has none; of those, the pairs with ``mask.keep(p_i, p'_j)`` are
    kept. ``Causal() & SlidingWindow(W)`` gives exactly :func:`window_pattern` on a grid's
    positions.

    Parameters
    ----------
    mask : Mask
        Its :meth:`~ctformer.operators.masks.Mask.keys` (padding) are ignored here.
    positions, key_positions : ndarray (N,), (M,) of float64
        Increasing query and key positions (``key_positions`` defaults to ``positions``).

    Returns
    -------
    sparse.COO of shape (N, M), dtype bool
    """
    import sparse

    p = np.asarray(positions, dtype=np.float64)
    pk = p if key_positions is None else np.asarray(key_positions, dtype=np.float64)
    band = mask.band(p, pk)
    if band is None:
        lo, hi = np.zeros(p.size, dtype=np.intp), np.full(p.size, pk.size, dtype=np.intp)
    else:
        lo, hi = (np.asarray(b, dtype=np.intp) for b in band)
    counts = np.maximum(hi - lo, 0)
    rows = np.repeat(np.arange(p.size), counts)
    cols = np.arange(rows.size) + np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    kept = np.asarray(mask.keep(p[rows], pk[cols]), dtype=bool)
    if kept.shape != rows.shape:
        raise ValueError(f"{mask!r}.keep(p, p_key) must return one boolean per pair (broadcasting "
                         f"its arguments), got shape {kept.shape} for {rows.size} pairs")
    coords = np.stack([rows[kept], cols[kept]])
    return sparse.COO(coords, np.ones(coords.shape[1], dtype=bool), shape=(p.size, pk.size),
                      has_duplicates=False, sorted=True, fill_value=False)


def local_attention(q, k, v, *, beta, pattern=None, weights=None, key_mask=None, slopes=None,
                    positions=None, key_positions=None, causal=False, diagonal="full",
                    block=None, fallback_to_self=False, check=False, bias=None):
    r"""Softmax attention restricted to a sparse pattern and/or with an ALiBi bias, by blocks.

    .. math::

        \mathrm{out}_i = \frac{\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j - m_h |p_i - p'_j|} v_j}
                              {\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j - m_h |p_i - p'_j|}}

    Parameters
    ----------
    q, k, v : arrays of shape (..., N, d), (..., M, d), (..., M, e)
        Queries, keys and values (leading axes broadcast, as in ``quadrature_attention``).
    beta : float or array
        Inverse temperature, broadcasting against the leading axes.
    pattern : sparse.COO of shape (..., N, M), optional
        Kept entries :math:`m_{ij}` (e.g. :func:`window_pattern`); only the key columns its
        rows reach are visited. Default: every key (with ``causal``, keys :math:`j \le i`).
    weights : array of shape (M,), optional
        Positive key quadrature weights (uniform by default).
    key_mask : bool array of shape (..., M), optional
        Keys to keep (padding masks), combined with the pattern; integers 0/1 (HuggingFace's
        ``attention_mask``) are read as ``key_mask == 1``, other integers are refused.
    slopes : array, optional
        ALiBi slopes :math:`m_h \ge 0`, broadcasting against the leading axes like ``beta``;
        needs ``positions``.
    positions, key_positions : array of shape (N,) and (M,), optional
        :math:`p_i` and :math:`p'_j` for the ALiBi term or ``bias`` (``key_positions``
        defaults to ``positions``).
    causal : bool
        Keep only :math:`j \le i` (needs N == M).
    diagonal : {"full", "half"}
        With ``causal`` and no ``pattern``: weight of the diagonal cell (``"half"``: second
        order on midpoint nodes).
    block : int, optional
        Query rows per block; default: about the widest row of the pattern, within a score
        budget of a few MiB per block.
    fallback_to_self : bool
        When a query keeps no key, attend to itself instead (needs N == M; that row's output
        is not meaningful). Default: such a query attends to an empty set of keys and its
        output is zero (the integral over the empty set), as in ``quadrature_attention``.
    check : bool, default False
        Refuse non-finite ``q``, ``k``, ``v`` and evaluate scale-safely: inputs whose scores
        or weighted sums could overflow are rescaled by powers of two first, as
        ``quadrature_attention(..., check=True)`` does (any finite input then gives a finite
        answer, e.g. ``1e300 * q`` or ``beta=1e308``: the hard-max limit). Off for the
        states of a solve, which were validated where they entered.
    bias : callable, optional
        A general additive score term of the positions (instead of ``slopes``):
        ``bias(difference)`` gets :math:`p_i - p'_j` of a block (an array ``(rows, cols)`` in the
        namespace and dtype of ``q``) and returns the term, broadcasting against the leading
        axes (e.g. ``(H, rows, cols)``); needs ``positions``.

    Returns
    -------
    array of shape (..., N, e)
        Same namespace and dtype as ``q`` (NumPy float16 is computed in float32 and rounded
        once to float16). Rows of queries that keep no key (pattern, causal order and ``key_mask`` together)
        are zero, unless ``fallback_to_self``.

    Raises
    ------
    ValueError
        For mismatched shapes, no keys (``M = 0``), a pattern of the wrong shape, ``slopes`` without
        ``positions``, negative or non-finite ``slopes`` or ones that do not broadcast against
        the leading axes, non-finite ``q``, ``k``, ``v`` or ``beta`` with ``check=True``, or
        bad options.
    TypeError
        For a pattern that is not a boolean pydata ``sparse`` array, or a ``key_mask`` that is
        not boolean.
    ctformer.discretizations.SizeTooLargeError
        (a ``ValueError`` and a ``MemoryError``) Where the output (its leading axes broadcast)
        or a ``block`` of query rows with its slab of keys would exceed the memory budget
        (``CTFORMER_MEMORY_BUDGET``), before either is allocated.
    """
    if _all_float16(q, k, v):
        # computed in float32 and rounded once, as quadrature_attention does (float16 scores lose most bits)
        return in_float32(local_attention, q, k, v, beta=beta, pattern=pattern, weights=weights,
                          key_mask=key_mask, slopes=slopes, positions=positions, key_positions=key_positions,
                          causal=causal, diagonal=diagonal, block=block, fallback_to_self=fallback_to_self,
                          check=check, bias=bias)
    xp = array_api_compat.array_namespace(q, k, v)
    n, m = q.shape[-2], k.shape[-2]
    diagonal = validation.one_of(diagonal, "diagonal", ("full", "half"))
    if diagonal == "half" and (not causal or pattern is not None):
        raise ValueError("diagonal='half' only applies with causal=True and no pattern")
    if (causal or fallback_to_self) and n != m:
        raise ValueError(f"causal=True and fallback_to_self need as many queries as keys, got {n} and {m}")
    if m == 0:  # as quadrature_attention: no softmax over an empty key set (NumPy's max raised)
        raise ValueError("k and v must hold at least one key token, got 0: pass keys of shape (..., M, d) "
                         "with M >= 1")
    if slopes is not None and bias is not None:
        raise ValueError("pass slopes (ALiBi) or bias, not both")
    p = pk = None
    if slopes is not None or bias is not None:
        if positions is None:
            raise ValueError(f"{'slopes (ALiBi)' if bias is None else 'bias'} need positions=...")
        p = _check_positions(positions, "positions")
        pk = p if key_positions is None else _check_positions(key_positions, "key_positions")
        if p.size != n or pk.size != m:
            raise ValueError(f"positions must have {n} entries and key_positions {m}, got {p.size} and {pk.size}")
    if slopes is not None:
        _check_slopes(slopes, q.shape[:-2], k.shape[:-2], v.shape[:-2])
        bias = slopes_bias(slopes)
    if check:
        _check_beta(beta)
    km = None
    if key_mask is not None:
        # booleans, or 0/1 integers; on q's device (a NumPy mask went to torch's default device)
        km = keep_flags(xp.asarray(key_mask, device=array_api_compat.device(q)), "key_mask")
        if km.ndim < 1 or km.shape[-1] != m:
            raise ValueError(f"key_mask must be a boolean array of shape (..., {m}), got {tuple(km.shape)}")
    if block is not None:
        block = validation.integer(block, "block")
    w_host = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w_host is not None and (w_host.shape != (m,) or not np.all(w_host > 0) or not np.all(np.isfinite(w_host))):
        raise ValueError(f"weights must be {m} positive finite numbers")
    if slopes is not None and pattern is None and km is None and block is None and not fallback_to_self:
        # ALiBi over every key (or the causal ones): the dense engine, its term evaluated by blocks
        term = DistanceTerm(to_host(slopes, np.float64)[..., None, None], p, pk)
        # NumPy: the float64 weights themselves, their logarithm taken in float64 (1e-50 is a
        # weight whose float32 is 0, whose log made rows of NaN)
        w = w_host if w_host is None or type(q) is np.ndarray else \
            xp.asarray(w_host, dtype=q.dtype, device=array_api_compat.device(q))
        return attention_with_terms(q, k, v, beta, w, "causal" if causal else None, diagonal, check,
                                    ScoreTerms(None, term))
    engine = BandedAttention(n, m, pattern=pattern, weights=w_host, bias=bias, positions=(p, pk),
                             causal=causal, diagonal=diagonal, block=block,
                             fallback_to_self=fallback_to_self)
    return engine(q, k, v, beta, key_mask=km, check=check)


