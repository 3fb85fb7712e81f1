r"""Stationary states of the noisy mean field on :math:`S^{d-1}`: the Gibbs fixed point (zonal).

With noise :math:`\nu > 0` and USA (:math:`X = \nabla_S G/\beta`) the zero-flux condition
:math:`\rho\nabla_S G/\beta = \nu\nabla_S\rho` gives the self-consistent Gibbs states

.. math::

    \rho = \frac{1}{Z} \exp\Big(\frac{G}{\beta\nu}\Big), \qquad
    G = \sum_l \lambda_l(\beta)\, c_l\varphi_l, \qquad Z: \int\rho\,d\sigma = 1,

solved for the zonal coefficients by a Newton-type method (:func:`scipy.optimize.root`,
``hybr``) on :math:`c - \Pi(c) = 0`, :math:`\Pi` the Gauss-node projection of the right-hand
side. The uniform density is always one; it loses stability at :math:`\nu_c = \lambda_1 /
(\beta|S^{d-1}|)`. For :math:`\beta < \beta^*(d)`, :math:`I_{d/2+1}(\beta^*)/I_{d/2}(\beta^*) = 1/d`,
the clustered branch meets it there continuously; above, it extends past :math:`\nu_c`
and the order parameter jumps (Mun and Rosenzweig 2026). (SA: :math:`\rho \propto G^{1/(\beta\nu)}`
from :math:`\nabla_S G/(\beta G)`, :math:`\log G` in place of :math:`G`.) At :math:`\beta = 0` the
limit: :math:`G/\beta` less its constant is :math:`\sum_{l \ge 1}(\lambda_l/\beta)c_l\varphi_l`
(:func:`~ctformer.particles.sphere_basis.gradient_multipliers`), divided by :math:`G` for SA.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from .sphere_basis import gradient_multipliers, kernel_multipliers, sphere_area

__all__ = ["stationary_state"]


def stationary_state(field, guess, *, tol=1e-13):
    r"""A stationary zonal density of ``field`` (a noisy :class:`ZonalMeanField`) near ``guess``.

    Parameters
    ----------
    field : ZonalMeanField
        With ``noise > 0``.
    guess : array, shape (L + 1,)
        Starting coefficients (mass one: :math:`c_0 = |S^{d-1}|^{-1/2}`).
    tol : float
        Tolerance of :func:`scipy.optimize.root`.

    Returns
    -------
    numpy.ndarray, shape (L + 1,)
        The coefficients of the fixed point (mass one).

    Raises
    ------
    ValueError
        Without noise, for a ``guess`` that is not :math:`L + 1` finite numbers, or if the
        iteration does not converge.
    """
    if field.noise <= 0:
        raise ValueError("stationary_state needs noise > 0 (without noise the stationary states are Diracs)")
    b = field.basis
    lam = kernel_multipliers(np.arange(field.degree + 1), field.beta, field.dimension, field.normalized)
    c0 = 1.0 / math.sqrt(sphere_area(field.dimension))
    grad = gradient_multipliers(np.arange(field.degree + 1), field.beta, field.dimension, field.normalized)

    def gibbs(c):
        g = b.values @ (lam * c)
        if field.beta == 0:  # the limit beta -> 0 of G / beta (USA) or log G / beta (SA), less constants
            exponent = (b.values @ (grad * c)) / (field.noise * (g if field.normalized else 1.0))
        elif field.normalized:
            exponent = np.log(g) / (field.beta * field.noise)
        else:
            exponent = g / (field.beta * field.noise)
        rho = np.exp(exponent - exponent.max())
        return b.project(rho / (rho @ b.weights))

    def residual(tail):
        c = np.concatenate([[c0], tail])
        return tail - gibbs(c)[1:]

    guess = np.asarray(guess, dtype=np.float64)
    if guess.shape != (field.degree + 1,) or not np.all(np.isfinite(guess)):
        raise ValueError(f"guess must be the {field.degree + 1} finite Gegenbauer coefficients c_0..c_L of "
                         f"this field (degree={field.degree}), got shape {guess.shape}"
                         f"{'' if np.all(np.isfinite(guess)) else ' with NaN or infinite entries'}; "
                         "build one with field.coefficients_of(rho)")
    out = optimize.root(residual, guess[1:], method="hybr", tol=tol)
    if not out.success or np.max(np.abs(residual(out.x))) > 1e-9:
        raise ValueError(f"the Gibbs fixed point did not converge from this guess ({out.message})")
    return np.concatenate([[c0], out.x])
