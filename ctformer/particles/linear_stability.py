r"""Linear stability: the growth of the mean field's modes, and of a scheme's steps.

* :func:`linear_growth_rate`: linearized about the uniform density, the mode
  :math:`\cos(k\theta)` of the circle mean field grows like :math:`e^{\lambda_k t}`,

  .. math::

      \lambda_k = \frac{k^2 I_k(\beta)}{\beta I_0(\beta)} \;\text{(SA)}, \qquad
      \lambda_k = \frac{k^2 I_k(\beta)}{\beta} \;\text{(USA, mass one)},

  computed as :math:`k\,\tfrac12\big(I_{k-1}(\beta) - I_{k+1}(\beta)\big)` (equal to
  :math:`k^2 I_k(\beta)/\beta`, no division by a small :math:`\beta`) from the exponentially
  scaled :math:`I_k(\beta) e^{-|\beta|}` (:func:`scipy.special.ive`).
* :func:`stability_function`: :math:`R(z)`, one step of :math:`u' = \lambda u` from
  :math:`u = 1` with :math:`z = \lambda\,\Delta t`, for any scheme (RK4:
  :math:`1 + z + z^2/2 + z^3/6 + z^4/24`); :meth:`~ctformer.particles.CircleMeanField.stable_step`
  bounds :math:`|R(iy)|` over the transport eigenvalues, :math:`|y| \le \Delta t\, K V`.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from .. import solvers
from ..validation import boolean
from .particle_checks import _check_beta

__all__ = ["linear_growth_rate", "stability_function"]

_LOG_FLOAT_MAX = math.log(np.finfo(np.float64).max)


def _plain_circle(dimension, noise) -> bool:
    """d = 2 without noise: the circle's own formula (anything else, bad input included, goes on)."""
    plain = (isinstance(dimension, (int, np.integer)) and not isinstance(dimension, bool) and dimension == 2)
    return plain and isinstance(noise, (int, float, np.integer, np.floating)) and noise == 0


def linear_growth_rate(k, beta, normalized=True, dimension=2, noise=0.0):
    r"""Growth rate of the mode :math:`\cos(k\theta)` of the linearization about the uniform density.

    .. math::

        \lambda_k = \frac{k^2 I_k(\beta)}{\beta I_0(\beta)} \;\text{(SA)}, \qquad
        \lambda_k = \frac{k^2 I_k(\beta)}{\beta} \;\text{(USA, mass one)}.

    With ``dimension=d`` or ``noise=nu``: degree-:math:`l` harmonics on :math:`S^{d-1}` under
    :math:`\nu\Delta_S` (:func:`ctformer.particles.zonal.linear_growth_rate`), for SA
    :math:`\sigma_l = l(l+d-2)\big(I_{l+d/2-1}(\beta)/(\beta I_{d/2-1}(\beta)) - \nu\big)`.

    Parameters
    ----------
    k : int or array of int
        Wavenumbers (>= 0).
    beta : float
        Inverse temperature, finite; at :math:`\beta = 0` the limit
        :math:`k(I_{k-1}(0) - I_{k+1}(0))/2`: 1/2 for :math:`k = 1`, 0 for the other modes (the
        velocity :math:`\int \sin(\varphi - \theta)\rho\,d\varphi` moves only the first mode).
    normalized : bool
        SA (True) or USA (False).
    dimension : int
        :math:`d \ge 2`, tokens on :math:`S^{d-1}`; 2 is the circle.
    noise : float
        :math:`\nu \ge 0`, the coefficient of the diffusion :math:`\nu\Delta_S`.

    Returns
    -------
    float or numpy.ndarray

    Raises
    ------
    ValueError
        For a ``beta`` that is not finite, wavenumbers that are not non-negative integers, a
        ``dimension`` below 2 or a negative ``noise``; for USA with :math:`|\beta| > 700`
        where ``dimension`` or ``noise`` is given.
    TypeError
        For a ``normalized`` other than True or False (``bool("False")`` would be SA).
    OverflowError
        USA on the circle without noise with :math:`|\beta|` above :func:`math.log` of the
        largest float64 (about 709.8), where :math:`e^{|\beta|}` overflows.
    """
    if not _plain_circle(dimension, noise):
        # every other sphere, or noise: the general formula (equal on the circle to rounding)
        from .sphere_basis import linear_growth_rate as on_the_sphere
        return on_the_sphere(k, beta, normalized, dimension, noise)
    beta, normalized = _check_beta(beta), boolean(normalized, "normalized")
    if not normalized and abs(beta) >= _LOG_FLOAT_MAX:
        raise OverflowError(f"USA (normalized=False) growth rates carry exp(|beta|) = exp({abs(beta)}), "
                            f"beyond the float64 range (|beta| < {_LOG_FLOAT_MAX:.1f}); use the "
                            "normalized rates or a smaller beta")
    k = np.asarray(k)
    if not np.issubdtype(k.dtype, np.integer) or np.any(k < 0):
        raise ValueError(f"k must be non-negative integer wavenumbers (the modes cos(k theta) of "
                         f"the circle), got {k.tolist()!r}")
    # k I_k / beta = (I_{k-1} - I_{k+1}) / 2 avoids dividing by a small beta.
    half_diff = 0.5 * (special.ive(k - 1, beta) - special.ive(k + 1, beta))
    if normalized:
        return k * half_diff / special.ive(0, beta)
    return k * half_diff * math.exp(abs(beta))


def stability_function(scheme, z):
    r"""The stability function :math:`R(z)` of a scheme: one step of :math:`u' = \lambda u`
    from :math:`u = 1` with :math:`\lambda\,\Delta t = z`.

    Computed by running ``scheme.step`` on the scalar linear split problem (one flow, no
    projection), so it holds for every scheme of :func:`ctformer.solvers.available` (with one
    flow ``lie`` and ``parallel`` are explicit Euler, ``strang`` is Heun) and for user schemes.

    Parameters
    ----------
    scheme : str or Scheme
    z : complex or array of complex

    Returns
    -------
    numpy.ndarray of complex
        E.g. RK4: :math:`1 + z + z^2/2 + z^3/6 + z^4/24`.
    """
    scheme = solvers.get(scheme)
    z = np.asarray(z, dtype=np.complex128)
    problem = solvers.SplitProblem(flows=(lambda u: z * u,))
    return scheme.step(problem, np.ones_like(z), 1.0)
