r"""Gauss-Legendre nodes and weights for any ``n`` in :math:`O(n)` memory and near :math:`O(n)` time.

For ``n <= SMALL_N`` the rule is NumPy's :func:`numpy.polynomial.legendre.leggauss`
(eigenvalues of the Jacobi matrix plus a Newton step, :math:`O(n^3)`). Above, every node is
found by Newton's method in the angle :math:`\theta` (:math:`t = \cos\theta`), from
asymptotic initial guesses, with :math:`P_n(\cos\theta)` and :math:`dP_n/d\theta` evaluated in
:math:`O(1)` per node except near the ends:

* **interior** nodes: Stieltjes' expansion (Szegő, *Orthogonal Polynomials*, (8.21.14))

  .. math::

      P_n(\cos\theta) = C_n \sum_{m=0}^{M-1} h_{n,m}
          \frac{\cos\big((n + m + \tfrac12)\theta - (m + \tfrac12)\tfrac{\pi}{2}\big)}
               {(2 \sin\theta)^{m + 1/2}}, \qquad
      C_n = \frac{4}{\pi} \prod_{j=1}^{n} \frac{j}{j + 1/2}, \quad
      h_{n,m} = \prod_{j=1}^{m} \frac{(j - 1/2)^2}{j (n + j + 1/2)},

  whose remainder is bounded by twice the first omitted term; it is used where that bound
  falls below :math:`10^{-17}` of the leading term (:math:`n \sin\theta \gtrsim 20`), with
  as many terms as each node needs. Initial guesses: Tricomi's
  :math:`\theta_k \approx \phi_k + \cot(\phi_k) / (8 \rho^2)`,
  :math:`\phi_k = (k - 1/4)\pi/\rho`, :math:`\rho = n + 1/2`.
* the few **boundary** nodes (about 7 at each end, independent of ``n``): the three-term
  recurrence written in :math:`\delta = t - 1 = -2 \sin^2(\theta/2)`,

  .. math::  P_{k+1} - P_k = \tfrac{2k + 1}{k + 1}\, \delta P_k + \tfrac{k}{k + 1} (P_k - P_{k-1}),

  which keeps full relative accuracy in :math:`\theta` near :math:`t = \pm 1` (where
  :math:`t` itself cannot resolve :math:`\theta`), from Gatteschi's guesses
  :math:`\theta_k \approx j_{0,k} / \sqrt{\rho^2 + 1/12}` (:math:`j_{0,k}` the zeros of
  :math:`J_0`). For ``n > RECURRENCE_N`` the recurrence (an :math:`O(n)` loop) is replaced
  by the Bessel expansion of Hilb's type

  .. math::

      P_n(\cos\theta) \approx \sqrt{\tfrac{\theta}{\sin\theta}}
          \Big[J_0(\rho\theta) + \frac{\cot\theta - 1/\theta}{8\rho} J_1(\rho\theta)\Big],

  whose error :math:`O(\theta^2 \rho^{-2})` is below rounding at those nodes
  (:math:`\rho\theta \lesssim 25`, :math:`\rho > 8000`).

The weights are :math:`w_k = 2 / (dP_n/d\theta)^2(\theta_k)` (since
:math:`(1 - t^2) P_n'(t)^2 = (dP_n/d\theta)^2`). The rule is symmetric by construction.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.special

from .. import validation

__all__ = ["gauss_legendre", "SMALL_N", "RECURRENCE_N"]

#: Up to this ``n`` NumPy's ``leggauss`` is used (bit-compatible with earlier versions).
SMALL_N = 100
#: Up to this ``n`` the boundary nodes use the exact recurrence, above it the Bessel expansion.
RECURRENCE_N = 8_000
_TOL = 1e-17
_MAX_TERMS = 60


def _log_cn(n: int) -> float:
    r""":math:`\log C_n` as an exactly rounded sum of :math:`\log(1 - 1/(2j + 1))`."""
    j = np.arange(1, n + 1, dtype=np.float64)
    return math.log(4.0 / math.pi) + math.fsum(np.log1p(-1.0 / (2.0 * j + 1.0)))


def _stieltjes(theta, n: int, cn: float):
    r"""``P_n(cos theta)`` and ``dP_n/dtheta`` by Stieltjes' expansion (interior nodes)."""
    s = np.sin(theta)
    cot = np.cos(theta) / s
    two_s = 2.0 * s
    p = np.zeros_like(theta)
    dp = np.zeros_like(theta)
    active = np.arange(theta.size)
    factor = 1.0 / np.sqrt(two_s)  # h_{n,m} / (2 sin theta)^(m + 1/2)
    for m in range(_MAX_TERMS):
        th = theta[active]
        alpha = (n + m + 0.5) * th - (m + 0.5) * (0.5 * math.pi)
        ca, sa = np.cos(alpha), np.sin(alpha)
        p[active] += factor * ca
        dp[active] -= factor * ((n + m + 0.5) * sa + (m + 0.5) * cot[active] * ca)
        factor = factor * ((m + 0.5) ** 2 / ((m + 1) * (n + m + 1.5))) / two_s[active]
        keep = factor * np.sqrt(two_s[active]) > _TOL
        if not keep.any():
            break
        active, factor = active[keep], factor[keep]
    return cn * p, cn * dp


def _interior_ok(theta, n: int) -> np.ndarray:
    """Where Stieltjes' expansion reaches the tolerance with at most ``_MAX_TERMS`` terms."""
    two_s = 2.0 * np.sin(theta)
    ratio = np.ones_like(theta)
    best = np.ones_like(theta)
    for m in range(_MAX_TERMS):
        ratio = ratio * ((m + 0.5) ** 2 / ((m + 1) * (n + m + 1.5))) / two_s
        best = np.minimum(best, 2.0 * ratio)
    return best < _TOL


def _recurrence(theta, n: int):
    r"""``P_n(cos theta)`` and ``dP_n/dtheta`` by the recurrence in :math:`\delta = t - 1`."""
    delta = -2.0 * np.sin(0.5 * theta) ** 2
    k = np.arange(1, n, dtype=np.float64)
    a = (2.0 * k + 1.0) / (k + 1.0)
    b = k / (k + 1.0)
    p_prev = np.ones_like(theta)
    p = 1.0 + delta
    d = delta.copy()
    for i in range(n - 1):
        d = a[i] * delta * p + b[i] * d
        p_prev = p
        p = p + d
    x = 1.0 + delta
    s = np.sin(theta)
    # dP/dtheta = -sin(theta) P_n'(x) = n (x P_n - P_{n-1}) / sin(theta)
    return p, n * (x * p - p_prev) / s


def _bessel(theta, n: int):
    r"""``P_n(cos theta)`` and ``dP_n/dtheta`` by the Bessel expansion (boundary, large ``n``)."""
    rho = n + 0.5
    z = rho * theta
    small = theta < 1e-3
    t2 = theta * theta
    # cot(theta) - 1/theta and its derivative 1/theta^2 - 1/sin^2(theta), by series when small
    g = np.where(small, -theta / 3.0 - theta * t2 / 45.0 - 2.0 * theta * t2 * t2 / 945.0,
                 np.cos(theta) / np.sin(theta) - 1.0 / theta)
    dg = np.where(small, -1.0 / 3.0 - t2 / 15.0 - 2.0 * t2 * t2 / 189.0,
                  1.0 / t2 - 1.0 / np.sin(theta) ** 2)
    j0, j1 = scipy.special.j0(z), scipy.special.j1(z)
    f = j0 + g / (8.0 * rho) * j1
    # d/dtheta: J0' = -rho J1, J1'(z) = J0 - J1/z
    df = -rho * j1 + dg / (8.0 * rho) * j1 + g / 8.0 * (j0 - j1 / z)
    root = np.sqrt(theta / np.sin(theta))
    # d sqrt(theta / sin theta) / dtheta = root * (1/theta - cot theta) / 2 = -root * g / 2
    return root * f, root * (df - 0.5 * g * f)


def _newton(evaluate, theta, dp, subset) -> None:
    r"""Newton's method in place on ``theta[subset]``; stores :math:`dP_n/d\theta` in ``dp``.

    A node is done when its step is below :math:`10^{-15}\theta`: the derivative of that
    last evaluation is then exact to :math:`\cot\theta \cdot` step (the relative change of
    :math:`dP_n/d\theta` near a zero, by Legendre's equation), far below rounding. Each
    evaluation covers only the nodes not yet done.
    """
    active = subset
    for iteration in range(12):
        th = theta[active]
        p, d = evaluate(th)
        step = p / d
        theta[active] = th - step
        dp[active] = d
        done = np.abs(step) <= 1e-15 * th
        if done.all():
            return
        active = active[~done]
    raise FloatingPointError(f"Gauss-Legendre: Newton's method did not converge at {active.size} nodes")


def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    r"""Gauss-Legendre nodes (ascending) and weights on :math:`[-1, 1]`.

    Parameters
    ----------
    n : int
        Number of points, ``n >= 1``.

    Returns
    -------
    t, w : ndarray of shape (n,)
        Nodes and weights; :math:`\sum_k w_k p(t_k) = \int_{-1}^1 p` for every polynomial
        of degree below :math:`2n`. See the module docstring for the algorithm: :math:`O(n)`
        memory, :math:`O(n)` time for ``n > RECURRENCE_N`` and :math:`O(n)` plus a loop of
        ``n`` vectorized steps over a few boundary nodes below.
    """
    n = validation.integer(n, "n")
    if n <= SMALL_N:
        return np.polynomial.legendre.leggauss(n)
    m = (n + 1) // 2  # nodes with theta in (0, pi/2], from t = 1 inwards
    rho = n + 0.5
    k = np.arange(1, m + 1, dtype=np.float64)
    phi = (k - 0.25) * math.pi / rho
    theta = phi + np.cos(phi) / np.sin(phi) / (8.0 * rho * rho)
    if n % 2:
        theta[-1] = 0.5 * math.pi  # the middle node of odd n
    probe = min(m, 200)
    interior = np.ones(m, dtype=bool)
    interior[:probe] = _interior_ok(theta[:probe], n)
    boundary = np.flatnonzero(~interior)
    if boundary.size:
        theta[boundary] = scipy.special.jn_zeros(0, boundary.size) / math.sqrt(rho * rho + 1.0 / 12.0)
    cn = math.exp(_log_cn(n))
    dp = np.empty(m)
    inner = np.flatnonzero(interior)
    boundary_eval = _recurrence if n <= RECURRENCE_N else _bessel
    for subset, evaluate in ((inner, lambda th: _stieltjes(th, n, cn)),
                             (boundary, lambda th: boundary_eval(th, n))):
        if not subset.size:
            continue
        _newton(evaluate, theta, dp, subset)
    if n % 2:
        theta[-1] = 0.5 * math.pi
    x = np.cos(theta)
    w = 2.0 / dp**2
    if n % 2:
        x[-1] = 0.0
        t = np.concatenate([-x, x[-2::-1]])
        w = np.concatenate([w, w[-2::-1]])
    else:
        t = np.concatenate([-x, x[::-1]])
        w = np.concatenate([w, w[::-1]])
    return t, w
