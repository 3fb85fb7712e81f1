r"""The lower tail of the standard normal distribution in float64, in one branch-free formula.

For :math:`a \ge 0`,

.. math::

    \Phi(-a) = e^{-a^2/2}\, M(a), \qquad
    M(a) = \tfrac12\, e^{a^2/2} \operatorname{erfc}(a / \sqrt 2),

and :math:`M` (a multiple of Mills' ratio) is smooth and slowly varying on
:math:`[0, \infty)`: :math:`M(0) = 1/2`, :math:`M(a) \sim 1 / (a \sqrt{2\pi})`. With the
rational change of variable :math:`t = c / (c + a)` (here :math:`c = 3`), the scaled function
:math:`G = M / t` tends to a constant at both ends, and on :math:`a \in [0, A]`,
:math:`A = 38.5` (beyond which :math:`\Phi(-a) < 10^{-322}` is no longer a normal number), it
is smooth in

.. math::

    x = \frac{2t - (1 + t_0)}{1 - t_0} = \frac{c - \gamma a}{c + a} \in [-1, 1], \qquad
    t_0 = \frac{c}{c + A}, \quad \gamma = \frac{A + 2c}{A}.

Its Chebyshev coefficients fall below :math:`10^{-16}` relative to :math:`G` after 24 terms
(the only singularity of :math:`G` in :math:`t` is at :math:`t = 0`, :math:`a = \infty`,
outside the interval). The library evaluates that degree-23 interpolant (at 80 Chebyshev
points, in 40-digit arithmetic) in power form, :math:`G(x) \approx \sum_k g_k x^k`, by
Horner's rule: the power form is well conditioned here (:math:`\sum_k |g_k| = 0.51` against
:math:`G \ge 0.13`), and one chain of multiply-adds is what a compiler vectorizes.
:func:`power_coefficients` recomputes the coefficients (the tests check them, and the formula,
against mpmath). In float64 :math:`G` has a relative error of about 3 ulp; the Gaussian factor
is evaluated as :math:`e^{-p/2}(1 - e/2)` with :math:`a^2 = p + e` split exactly (a fused
multiply-add when compiled, Veltkamp's splitting in NumPy), so that the rounding of
:math:`a^2`, which would cost :math:`a^2/2` ulps, does not enter.

Every step is a multiply-add, one division or one exponential, with no branch:
:mod:`ctformer._numerics.compiled` uses it for the float64 GELU,
:math:`z \Phi(z) = \max(z, 0) - |z| \Phi(-|z|)`. :func:`lower_tail` is the same formula in
NumPy, the reference for the compiled loop.

The module also holds the two other constants that the NumPy and the compiled activations
share: :data:`ERFC_COEFFICIENTS`, the coefficients :math:`c_0, \dots, c_9` of Numerical
Recipes' erfc approximation (Press et al., 2nd ed., section 6.2),
:math:`\operatorname{erfc}(a) \approx t \exp(-a^2 + \sum_k c_k t^k)`, :math:`t = 1/(1 + a/2)`,
relative error below :math:`1.2 \cdot 10^{-7}` (the float32 GELU), and :data:`TANH_GELU`
:math:`= 2\sqrt{2/\pi}`, the slope of the logistic approximation
:math:`\Phi(z) \approx \sigma\big(2\sqrt{2/\pi}\,(z + 0.044715 z^3)\big)` (the tanh GELU).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["lower_tail", "power_coefficients", "C", "A", "GAMMA", "POWER", "ERFC_COEFFICIENTS",
           "TANH_GELU"]

# Numerical Recipes' erfcc coefficients, P_9(t) = c_0 + c_1 t + ... + c_9 t^9.
ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                     0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)
TANH_GELU = 2.0 * math.sqrt(2.0 / math.pi)

C = 3.0
A = 38.5
GAMMA = (A + 2 * C) / A
# G(x) = sum_k POWER[k] x^k on x in [-1, 1] (see the module docstring; power_coefficients()).
POWER = (
    0.2557074777140804, 0.1680120695611605, 0.06882700596830106, 0.011678925032102199,
    -0.0031824137691785705, -0.0014700978498283542, 0.00032189741961001256,
    0.00017191545852204566, -6.180348435660916e-05, -1.616098668129874e-05,
    1.3013193201265801e-05, -4.1615359511477545e-07, -2.171681554891241e-06,
    7.539562027718136e-07, 1.5398855696714663e-07, -2.0697989121199892e-07,
    5.2884114358456034e-08, 2.243758825647497e-08, -2.3098532293796518e-08,
    4.299742145543489e-09, 4.2294619107978166e-09, -2.083017323096425e-09,
    -3.2901736582654825e-10, 2.730091304674545e-10,
)


def power_coefficients(terms=len(POWER), nodes=80, digits=40):
    r"""The power-form coefficients of the Chebyshev interpolant of :math:`G` (needs mpmath).

    The Chebyshev coefficients are
    :math:`c_k = \frac{2 - \delta_{k0}}{n} \sum_j G(x_j) \cos(k \theta_j)`,
    :math:`x_j = \cos\theta_j`, :math:`\theta_j = \pi (j + 1/2) / n`, ``n = nodes``, for
    :math:`k <` ``terms``; the series :math:`\sum_k c_k T_k(x)` is then expanded in powers of
    :math:`x` with :math:`T_{k+1} = 2x T_k - T_{k-1}`, all in ``digits``-digit arithmetic.
    """
    import mpmath

    with mpmath.workdps(digits):
        c, big = mpmath.mpf(C), mpmath.mpf(A)
        t0 = c / (c + big)
        thetas = [mpmath.pi * (j + mpmath.mpf(1) / 2) / nodes for j in range(nodes)]

        def g(x):
            t = (t0 + 1) / 2 + (1 - t0) / 2 * x
            a = c * (1 - t) / t
            return mpmath.erfc(a / mpmath.sqrt(2)) / 2 * mpmath.exp(a * a / 2) / t

        values = [g(mpmath.cos(theta)) for theta in thetas]
        power = [mpmath.mpf(0)] * terms
        previous, current = [], [mpmath.mpf(1)]  # T_{k-1}, T_k in powers of x
        for k in range(terms):
            ck = (2 - (k == 0)) * mpmath.fsum(v * mpmath.cos(k * th) for v, th in zip(values, thetas)) / nodes
            for i, b in enumerate(current):
                power[i] += ck * b
            following = [mpmath.mpf(0)] + [(1 if k == 0 else 2) * b for b in current]
            for i, b in enumerate(previous):
                following[i] -= b
            previous, current = current, following
        return tuple(float(v) for v in power)


def lower_tail(a):
    r""":math:`\Phi(-a)` for float64 ``a >= 0`` by the formula of the module docstring (NumPy).

    Parameters
    ----------
    a : array_like of float64
        Non-negative arguments (``inf`` gives 0).

    Returns
    -------
    numpy.ndarray
        :math:`\Phi(-a)`, to a few ulps relative where it is a normal number (zero or
        subnormal below about :math:`10^{-308}`).
    """
    a = np.asarray(a, dtype=np.float64)
    if np.any(np.isnan(a)) or np.any(a < 0):
        raise ValueError("lower_tail needs a >= 0 (not NaN); for a < 0 use Phi(-a) = 1 - Phi(a)")
    b = np.minimum(a, A)
    r = 1.0 / (C + b)
    x = (C - GAMMA * b) * r
    g = np.full_like(x, POWER[-1])
    for c in POWER[-2::-1]:
        g = g * x + c
    # a^2 = p + e exactly (Veltkamp's split; NumPy never fuses the products)
    a = np.minimum(a, 1e18)
    split = 134217729.0 * a
    hi = split - (split - a)
    lo = a - hi
    p = a * a
    e = ((hi * hi - p) + 2 * hi * lo) + lo * lo
    with np.errstate(under="ignore"):
        return np.exp(-0.5 * p) * (1 - 0.5 * e) * (g * C * r)
