r"""Clustering diagnostics for particles on the sphere (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025).

For positions :math:`x_1, \dots, x_n \in S^{d-1}` (arrays of shape (n, d), or (batch, n, d)
where stated) and token weights :math:`w_i` (default :math:`1/n`):

* the Gram matrix :math:`G_{ij} = \langle x_i, x_j\rangle` and the histogram of its
  off-diagonal entries (the figure of the paper's ALBERT experiment),
* the number of clusters at a distance tolerance (single linkage),
* the interaction energy :math:`E_\beta = \frac{1}{2\beta}\sum_{ij} w_i w_j e^{\beta\langle x_i, x_j\rangle}`,
  which (SA) and (USA) with :math:`Q = K = V = I` increase, with maximum
  :math:`e^\beta/(2\beta)` at a single cluster when :math:`\sum_i w_i = 1`,
* the distance to the nearest single-cluster state,
* whether the points lie in an open hemisphere (then they collapse to one cluster),
* the attention matrix, its numerical rank and its row entropies.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np
from scipy.optimize import linprog
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import pdist, squareform

from ..backend import to_host
from ..validation import real
from ..operators.quadrature_attention import quadrature_attention
from .dynamics import _check_beta, log_partition
from .partition import _log_weights
from .particle_checks import _as_real_floating

__all__ = [
    "gram",
    "inner_product_histogram",
    "cluster_count",
    "energy",
    "single_cluster_distance",
    "in_open_hemisphere",
    "attention_matrix",
    "attention_rank",
    "row_entropy",
]


def _points(x, batch=True):
    # Integers become float64 here: weights are cast to the points' dtype, and integer weights
    # 1/n would be 0.
    x = _as_real_floating(x, "x")
    allowed = (2, 3) if batch else (2,)
    if x.ndim not in allowed:
        shapes = "(n, d) or (batch, n, d)" if batch else "(n, d)"
        raise ValueError(f"x must have shape {shapes}, got shape {tuple(x.shape)}")
    if x.shape[-2] == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must hold n >= 1 points of dimension d >= 1, got shape {tuple(x.shape)}")
    xp = array_api_compat.array_namespace(x)
    if not bool(xp.all(xp.isfinite(x))):
        raise ValueError("x contains NaN or inf; pass finite points (a diverged solve is "
                         "reported by solve itself)")
    return x


def _unit_weights(weights, x):
    r"""The normalized weights :math:`w_i / \sum_j w_j` like ``x`` (default :math:`1/n`),
    normalized from their logarithms (:func:`_log_weights`, checked, in the wider precision):
    float64 weights of 1e-50 are 0 in float32, their normalized values are not."""
    xp = array_api_compat.array_namespace(x)
    n = x.shape[-2]
    if weights is None:
        return xp.full((n,), 1.0 / n, dtype=x.dtype, device=array_api_compat.device(x))
    log_w = _log_weights(xp, weights, n, x)
    w = xp.exp(log_w - xp.max(log_w))
    return w / xp.sum(w)


def gram(x):
    r"""The Gram matrix :math:`G_{ij} = \langle x_i, x_j\rangle`.

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)

    Returns
    -------
    array, shape (n, n) or (batch, n, n)

    Raises
    ------
    ValueError
        For a wrong shape or NaN or inf in ``x`` (as every diagnostic of this module).
    """
    x = _points(x)
    xp = array_api_compat.array_namespace(x)
    return x @ xp.matrix_transpose(x)


def inner_product_histogram(x, bins=50, *, density=False):
    r"""Histogram of the pairwise inner products :math:`\langle x_i, x_j\rangle`, :math:`i < j`, on [-1, 1].

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)
        Points on the sphere; a batch pools the pairs of every member.
    bins : int or sequence of float
        Number of equal bins on [-1, 1], or the bin edges.
    density : bool
        Normalize to a probability density on [-1, 1] instead of counts.

    Returns
    -------
    counts : numpy.ndarray
    edges : numpy.ndarray

    Raises
    ------
    ValueError
        For fewer than two points.
    """
    g = to_host(gram(x), np.float64)
    n = g.shape[-1]
    if n < 2:
        raise ValueError("inner_product_histogram needs at least two points")
    i, j = np.triu_indices(n, k=1)
    values = np.clip(g[..., i, j].reshape(-1), -1.0, 1.0)
    return np.histogram(values, bins=bins, range=(-1.0, 1.0), density=density)


def cluster_count(x, tol):
    r"""Number of clusters: connected components of the graph :math:`\|x_i - x_j\| \le \mathrm{tol}`.

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)
    tol : float
        Euclidean distance below which two points are linked (single linkage), >= 0.

    Returns
    -------
    int or numpy.ndarray of int
        One count, or one per batch member.

    Raises
    ------
    ValueError
        For a negative or non-finite ``tol``.
    """
    x = _points(x)
    tol = real(tol, "tol", nonnegative=True)
    host = to_host(x, np.float64)

    def count(points):
        if points.shape[0] == 1:
            return 1
        adjacency = squareform(pdist(points)) <= tol
        return int(connected_components(adjacency, directed=False)[0])

    if host.ndim == 2:
        return count(host)
    return np.array([count(p) for p in host])


def energy(x, beta, weights=None, *, log=False):
    r"""The interaction energy :math:`E_\beta = \frac{1}{2\beta}\sum_{i,j} w_i w_j e^{\beta\langle x_i, x_j\rangle}`.

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)
    beta : float
        Finite and positive.
    weights : array, shape (n,), optional
        Positive weights; default :math:`1/n` (then the maximum over the sphere is
        :math:`e^\beta / (2\beta)`, at a single cluster). Their logarithm is taken in the
        wider of their precision and ``x``'s (float64 weights of 1e-50 with float32 points
        give :math:`\log E_\beta \approx -230`).
    log : bool
        Return :math:`\log E_\beta` instead, computed by log-sum-exp: finite for any
        finite :math:`\beta`, whereas :math:`E_\beta` itself overflows float64 for
        :math:`\beta \gtrsim 709`.

    Returns
    -------
    float or array, shape (batch,)

    Raises
    ------
    ValueError
        For a non-positive or non-finite ``beta`` or bad weights.
    OverflowError
        If :math:`E_\beta` exceeds the floating-point range (use ``log=True``).
    """
    x = _points(x)
    xp = array_api_compat.array_namespace(x)
    beta = _check_beta(beta)
    if beta <= 0:
        raise ValueError(f"energy needs beta > 0, got {beta}")
    n = x.shape[-2]
    log_w = -math.log(n) if weights is None else _log_weights(xp, weights, n, x)
    log_z = log_partition(x, x, beta=beta, weights=weights)  # log sum_j w_j e^{beta <x_i, x_j>}
    terms = log_z + log_w
    top = xp.max(terms, axis=-1)
    log_e = top + xp.log(xp.sum(xp.exp(terms - top[..., None]), axis=-1)) - math.log(2 * beta)
    if log:
        return float(log_e) if log_e.ndim == 0 else log_e
    limit = math.log(xp.finfo(x.dtype).max)
    if float(xp.max(log_e)) >= limit:
        raise OverflowError(
            f"E_beta = exp({float(xp.max(log_e)):.1f}) exceeds the {x.dtype} range; use energy(..., log=True)"
        )
    e = xp.exp(log_e)
    return float(e) if e.ndim == 0 else e


def single_cluster_distance(x, weights=None):
    r"""Distance to the nearest single-cluster state.

    .. math::

        \min_{z \in S^{d-1}} \Big(\sum_i \bar w_i \|x_i - z\|^2\Big)^{1/2}
        = \sqrt{2\,(1 - \|m\|)}, \qquad m = \sum_i \bar w_i x_i,

    with normalized weights :math:`\bar w_i = w_i / \sum_j w_j`. The minimizer is
    :math:`z = m / \|m\|` for any points (any :math:`z` when :math:`m = 0`), and the sum is
    evaluated there term by term: the closed form loses :math:`\sqrt{\varepsilon}` to the
    cancellation in :math:`1 - \|m\|` (it gave 0 for a distance of :math:`10^{-9}`); the
    direct sum is accurate down to distances of order :math:`\varepsilon`, since a rounding
    error :math:`\delta` in :math:`z` changes the sum only by :math:`O(\delta^2)`. Off the
    sphere it is still the distance to the nearest single-cluster state,
    :math:`(\sum_i \bar w_i \|x_i\|^2 - 2\|m\| + 1)^{1/2}`. Zero (to rounding) at a single
    cluster.

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)
        Points, normally on the unit sphere.
    weights : array, shape (n,), optional

    Returns
    -------
    float or array, shape (batch,)
    """
    x = _points(x)
    xp = array_api_compat.array_namespace(x)
    w = _unit_weights(weights, x)
    m = xp.sum(w[:, None] * x, axis=-2)
    norm = xp.sqrt(xp.sum(m * m, axis=-1, keepdims=True))
    first = xp.astype(xp.arange(x.shape[-1]) == 0, x.dtype)  # any unit vector serves when m = 0
    z = xp.where(norm > 0, m / xp.where(norm > 0, norm, 1.0), first)
    diff = x - z[..., None, :]
    r = xp.sqrt(xp.sum(w[:, None] * diff * diff, axis=(-2, -1)))
    return float(r) if r.ndim == 0 else r


def in_open_hemisphere(x, *, tol=1e-9):
    r"""Whether all points lie in an open hemisphere: some :math:`u` has :math:`\langle u, x_i\rangle > 0` for all i.

    Solved as the linear program :math:`\max\{s : \langle u, x_i\rangle \ge s,\ -1 \le u_k \le 1,\ s \le 1\}`
    (:func:`scipy.optimize.linprog`, HiGHS); the points lie in an open hemisphere iff the
    optimum :math:`s^\ast > 0` (reported as ``s* > tol``).

    Parameters
    ----------
    x : array, shape (n, d)
        Points, normally on the sphere; each row is divided by its norm first (the answer
        depends on the directions only), and a zero row lies in no open hemisphere.
    tol : float
        Margin below which :math:`s^\ast` (for the unit rows) counts as zero (points on a
        closed but not open hemisphere, e.g. an antipodal pair); finite and >= 0.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        For a negative or non-finite ``tol``.

    Notes
    -----
    For SA and USA with :math:`Q = K = V = I`, points that start in an open hemisphere converge
    to a single cluster (Geshkovski et al.).
    """
    pts = to_host(_points(x, batch=False), np.float64)
    tol = real(tol, "tol", nonnegative=True)
    # The answer depends on the directions only; tol is a margin for unit rows (a row 1e-12 long
    # had s* <= 1e-12 < tol). A zero row lies in no open hemisphere.
    scale = np.max(np.abs(pts), axis=1, keepdims=True)
    if np.any(scale == 0):
        return False
    pts = pts / scale
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    n, d = pts.shape
    # variables (u_1..u_d, s); maximize s  <=>  minimize -s;  s - <u, x_i> <= 0
    cost = np.zeros(d + 1)
    cost[-1] = -1.0
    a_ub = np.hstack([-pts, np.ones((n, 1))])
    result = linprog(cost, A_ub=a_ub, b_ub=np.zeros(n), bounds=[(-1.0, 1.0)] * d + [(None, 1.0)], method="highs")
    if result.status != 0:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"hemisphere linear program failed: {result.message}")
    return bool(-result.fun > tol)


def attention_matrix(x, beta, *, Q=None, K=None, weights=None, mask=None):
    r"""The attention matrix :math:`A_{ij} = \frac{w_j m_{ij} e^{\beta\langle Q x_i, K x_j\rangle}}{\sum_k w_k m_{ik} e^{\beta\langle Q x_i, K x_k\rangle}}`.

    Computed by :func:`ctformer.operators.quadrature_attention` with the identity as values
    (so every row is a probability vector, stable for large :math:`\beta`).

    Parameters
    ----------
    x : array, shape (n, d) or (batch, n, d)
    beta : float
    Q, K : array, shape (m, d), optional
        Default: identity.
    weights : array, shape (n,), optional
    mask : None, "causal" or bool array (n, n)

    Returns
    -------
    array, shape (n, n) or (batch, n, n)

    Raises
    ------
    ValueError
        For a wrong shape or NaN or inf in ``x`` (as every diagnostic of this module).
    """
    x = _points(x)
    xp = array_api_compat.array_namespace(x)
    beta = _check_beta(beta)
    n, d = x.shape[-2], x.shape[-1]
    q, k = x, x
    for name, a in (("Q", Q), ("K", K)):
        if a is None:
            continue
        a = xp.asarray(a, dtype=x.dtype)
        if a.ndim != 2 or a.shape[1] != d:
            raise ValueError(f"{name} must have shape (m, {d}), got {tuple(a.shape)}")
        if name == "Q":
            q = x @ xp.matrix_transpose(a)
        else:
            k = x @ xp.matrix_transpose(a)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"Q and K must have the same number of rows, got {q.shape[-1]} and {k.shape[-1]}")
    eye = xp.eye(n, dtype=x.dtype)
    return quadrature_attention(q, k, eye, beta=beta, weights=weights, mask=mask)


def attention_rank(a, rtol=None):
    r"""Numerical rank of an attention matrix (number of singular values above ``rtol`` times the largest).

    Parameters
    ----------
    a : array, shape (n, n) or (batch, n, n)
    rtol : float, optional
        Relative threshold; default ``n * eps`` as in :func:`numpy.linalg.matrix_rank`.

    Returns
    -------
    int or numpy.ndarray of int

    Raises
    ------
    ValueError
        For a wrong shape, NaN or inf entries, or a negative or non-finite ``rtol``.
    """
    host = to_host(a, np.float64)
    if host.ndim not in (2, 3):
        raise ValueError(f"a must have shape (n, n) or (batch, n, n), got {host.shape}")
    if not np.all(np.isfinite(host)):
        raise ValueError("a has NaN or inf entries: an attention matrix has none")
    s = np.linalg.svd(host, compute_uv=False)
    if rtol is None:
        rtol = max(host.shape[-2:]) * np.finfo(host.dtype).eps
    rtol = real(rtol, "rtol", nonnegative=True)
    rank = np.sum(s > rtol * s[..., :1], axis=-1)
    return int(rank) if rank.ndim == 0 else rank


def row_entropy(a):
    r"""Shannon entropy of each row, :math:`H_i = -\sum_j A_{ij}\log A_{ij}` (with :math:`0 \log 0 = 0`).

    :math:`H_i = \log n` for a uniform row, 0 for a one-hot row.

    Parameters
    ----------
    a : array, shape (..., n)
        Rows of probabilities.

    Returns
    -------
    array, shape (...)

    Raises
    ------
    ValueError
        For NaN, inf or negative entries (rows of probabilities have none).
    """
    xp = array_api_compat.array_namespace(a)
    if not bool(xp.all(xp.isfinite(a) & (a >= 0))):  # one host sync: NaN would read as 0 below
        raise ValueError("a must hold probabilities: finite and >= 0 entries, got NaN, inf or "
                         "negative ones")
    positive = a > 0
    return -xp.sum(xp.where(positive, a * xp.log(xp.where(positive, a, 1.0)), 0.0), axis=-1)
