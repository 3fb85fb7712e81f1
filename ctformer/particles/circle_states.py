r"""The states of the circle mean field: density values, retained coefficients, saved results.

The density is given by its values at the angles :math:`\theta_j = 2\pi j / N`,
:math:`j = 0, \dots, N - 1` (``N = n_modes``); the state of a solve holds its retained ``rfft``
coefficients

.. math::

    c_k = \sum_{j=0}^{N-1} \rho(\theta_j)\, e^{-ik\theta_j} = N \hat\rho_k, \qquad 0 \le k \le K,

with mass :math:`\int_0^{2\pi} \rho\, d\theta = 2\pi c_0 / N` and the values back by ``irfft``
of length :math:`N`.

* ``_CircleStates``: the checked density values of ``rho0`` (a function of the angle or its
  :math:`N` values: real, finite, nonnegative, positive mass), the resolution check of each
  saved state and the :class:`MeanFieldSolution` of a solve of
  :class:`~ctformer.particles.CircleMeanField`.
* :class:`ResolutionWarning`: issued once when a saved density falls below :math:`-10^{-6}`
  times the uniform density :math:`m / (2\pi)` (``_NEGATIVE_TOLERANCE``): its clusters are
  narrower than the modes :math:`|k| \le K` resolve.
* ``_host_angles``: tracer angles as a finite host float64 vector.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import array_api_compat
import numpy as np

from ..backend import backend_of, get_backend, to_host
from ..labelled_methods import LabelledResult
from ..solvers.solution import same_fields

__all__ = ["MeanFieldSolution", "ResolutionWarning"]

# A saved density below -this times the uniform density means the modes no longer resolve it.
_NEGATIVE_TOLERANCE = 1e-6


class ResolutionWarning(UserWarning):
    r"""The mean-field density is no longer resolved: its clusters are narrower than the retained modes.

    Issued once per solve when the density goes negative (below -1e-6 times the uniform
    density) or, for the zonal and :math:`S^2` solvers, when the top quarter of the degrees
    holds more than 1e-6 of :math:`\|\rho\|^2`.
    """


@dataclass(eq=False)
class MeanFieldSolution(LabelledResult):
    r"""Saved states of :meth:`CircleMeanField.solve`.

    Attributes
    ----------
    times : numpy.ndarray, shape (T,)
        Saved times (first 0, last ``t1``).
    grid : numpy.ndarray, shape (N,)
        Angles :math:`2\pi j / N`, uniform on :math:`[0, 2\pi)`.
    density : array, shape (T, N)
        The density at the grid angles, one row per saved time.
    coefficients : array, shape (T, K + 1)
        The retained Fourier coefficients (``rfft`` normalization) per saved time.
    tracers : array, shape (T, m) or None
        Angles of tracer points moved along the characteristics
        :math:`\dot\theta = X[\rho_t](\theta)` (unwrapped, not reduced mod :math:`2\pi`).
    beta : float or None
        The inverse temperature :math:`\beta` of the field that solved it (None: not recorded).
    normalized : bool or None
        Whether that field was normalized (None: not recorded).
    noise : float or None
        The noise :math:`\nu` of that field, on the sphere (:class:`~ctformer.particles.ZonalSolution`,
        :class:`~ctformer.particles.SphericalSolution`); None on the circle, which has none.
    """

    times: np.ndarray
    grid: np.ndarray
    density: object
    coefficients: object
    tracers: object = None
    # what the field was: written to the file's attributes (a restart compares the fingerprint)
    beta: float | None = None
    normalized: bool | None = None
    noise: float | None = None

    # field by field, arrays by entries (a pickled or copied solution equals its original)
    __eq__, __hash__ = same_fields, None

    @property
    def mass(self):
        r"""Total mass :math:`\frac{2\pi}{N}\sum_j \rho(\theta_j)` per saved time."""
        xp = array_api_compat.array_namespace(self.density)
        return (2 * math.pi / self.grid.shape[0]) * xp.sum(self.density, axis=-1)


class _CircleStates:
    """Density values in, saved states out, for :class:`CircleMeanField` (reads its ``grid``,
    ``n_modes``, ``max_wavenumber`` and ``_backend_name``)."""

    def _density_values(self, rho0, name="rho0"):
        if callable(rho0):
            backend = get_backend(self._backend_name or "numpy")
            values = np.asarray(rho0(self.grid))
        else:
            backend = get_backend(self._backend_name) if self._backend_name else backend_of(rho0)
            values = rho0 if array_api_compat.is_array_api_obj(rho0) else np.asarray(rho0)
        xp0 = array_api_compat.array_namespace(values)
        if xp0.isdtype(values.dtype, "complex floating"):
            raise TypeError(f"{name} must be real (a density), got a complex array of dtype {values.dtype}")
        if not (xp0.isdtype(values.dtype, "real floating") or xp0.isdtype(values.dtype, "integral")):
            raise TypeError(f"{name} must be a real numeric array, got dtype {values.dtype}")
        if not array_api_compat.is_cupy_array(values):
            # torch and other namespaces through the host: NumPy reads no torch bfloat16
            values = to_host(values)
        rho = backend.asarray(values, dtype=np.float64)
        if tuple(rho.shape) != (self.n_modes,):
            raise ValueError(f"{name} must give {self.n_modes} values (one per grid angle), "
                             f"got shape {tuple(rho.shape)}")
        xp = backend.xp
        if not bool(xp.all(xp.isfinite(rho))):
            raise ValueError(f"{name} has NaN or infinite values")
        with np.errstate(over="ignore"):  # values near 1e308: the mass overflows, refused below by name
            total = float(xp.sum(rho))
        if float(xp.min(rho)) < 0 or not 0 < total < math.inf:
            raise ValueError(f"{name} must be a nonnegative density with positive, finite mass (sum of the "
                             f"values {total:.3g}, min {float(xp.min(rho)):.3g}); rescale values near 1e308")
        return backend, rho

    def _restart_coefficients(self, u0):
        """The backend and the saved coefficients of a restart (finite, ``K + 1`` of them)."""
        backend = get_backend(self._backend_name) if self._backend_name else backend_of(u0)
        host = np.asarray(to_host(u0), dtype=np.complex128)
        kept = self.max_wavenumber + 1
        if host.shape != (kept,) or not np.all(np.isfinite(host)):
            raise ValueError(f"initial must end in the {kept} finite coefficients of a solve with "
                             f"n_modes={self.n_modes}, got shape {host.shape}; restart with the "
                             "solver that saved it")
        return backend, backend.asarray(host)

    def _check_resolved(self, backend, c, floor, mass, t_start, t_end) -> bool:
        """Warn once when the density goes negative: the modes no longer resolve it."""
        lowest = float(to_host(backend.xp.min(backend.fft.irfft(c, n=self.n_modes))))
        if lowest >= floor:
            return True
        warnings.warn(
            f"the mean-field density went negative between t={t_start:.6g} and t={t_end:.6g} "
            f"(min {lowest * 2 * math.pi / mass:.3g} times the uniform density): its clusters are "
            f"narrower than the {self.max_wavenumber} retained modes resolve, and later times are "
            "not accurate; raise n_modes or shorten t1", ResolutionWarning, stacklevel=3)
        return False

    def _solution(self, backend, times, states, m):
        xp = backend.xp
        kept = self.max_wavenumber + 1
        coefficients = states[:, :kept]
        density = backend.fft.irfft(coefficients, n=self.n_modes, axis=-1)
        tracer_path = xp.real(states[:, kept:]) if m else None
        return MeanFieldSolution(times=np.asarray(times), grid=self.grid.copy(), density=density,
                                 coefficients=coefficients, tracers=tracer_path,
                                 beta=float(self.beta), normalized=bool(self.normalized))


def _host_angles(tracers) -> np.ndarray:
    theta = to_host(tracers) if array_api_compat.is_array_api_obj(tracers) else np.asarray(tracers)
    if np.iscomplexobj(theta):
        raise TypeError("tracers must be real angles, got a complex array")
    theta = np.asarray(theta, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(theta)):
        raise ValueError("tracers must be finite angles")
    return theta
