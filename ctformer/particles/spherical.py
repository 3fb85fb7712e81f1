r"""The mean-field limit on :math:`S^2` for general densities: pseudo-spectral in spherical harmonics (ducc0).

The density :math:`\rho = \sum_{l \le L}\sum_{|m| \le l} a_{lm} Y_{lm}` (orthonormal harmonics,
real :math:`\rho`, the :math:`m \ge 0` coefficients stored in the ``ducc0``/healpy order)
solves :math:`\partial_t\rho + \operatorname{div}_S(\rho X[\rho]) = \nu\Delta_S\rho` with
:math:`X = \nabla_S G/(\beta G)` (SA) or :math:`\nabla_S G/\beta` (USA),
:math:`G = \sum \lambda_l(\beta) a_{lm} Y_{lm}` (Funk-Hecke, :math:`d = 3`:
:math:`\lambda_l = (2\pi)^{3/2}\beta^{-1/2} I_{l+1/2}(\beta)`). One evaluation of the
right-hand side:

1. :math:`\rho` on the grid (spin-0 synthesis) and :math:`\nabla_S G` (``synthesis_2d_deriv1``:
   :math:`\partial_\vartheta G`, :math:`\sin^{-1}\vartheta\,\partial_\varphi G`), :math:`G` (spin 0);
2. the flux :math:`F = \rho X` on the grid;
3. its spin-1 analysis :math:`F = \sum E_{lm}\nabla Y_{lm}/\sqrt{l(l+1)} + \text{curl part}`;
   the weak form :math:`\dot a_{lm} = \int F\cdot\nabla\bar Y_{lm}\,d\sigma = \sqrt{l(l+1)}\,E_{lm}`.

The grid: :math:`\lceil 3L/2\rceil + 2` Gauss-Legendre colatitudes (``geometry="GL"``) and
at least :math:`3L + 2` equispaced longitudes, the 3/2 rule (the next length whose FFT has
prime factors up to 11 only, ``scipy.fft.next_fast_len``: 196 for :math:`L = 64`, where
:math:`3L + 2 = 2 \cdot 97`): the integrand :math:`F\cdot\nabla\bar Y_{lm}`
has degree at most :math:`3L` and the quadrature is exact for it when :math:`V` is a
polynomial (USA), so the flux is alias-free; :math:`a_{00}` has zero derivative, so the mass
is conserved exactly. Noise: the integrating factor of :mod:`ctformer.particles.zonal`
(:math:`\Lambda = l(l+1)`). The stable step is the zonal solver's (:math:`K = L`).

Array libraries: NumPy only (``ducc0`` works on host arrays). A torch or CuPy density is
converted to NumPy on the host (:func:`ctformer.backend.to_host`) and the solution is NumPy;
convert back with ``torch.from_numpy`` if needed. Zonal densities are the
:class:`~ctformer.particles.ZonalMeanField` with :math:`d = 3`, which this solver reproduces.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import array_api_compat
import numpy as np
from scipy import fft, special

from .. import solvers
from ..backend import to_host
from ..validation import boolean, integer
from .meanfield import CircleMeanField, MeanFieldSolution, ResolutionWarning, circle_bytes
from .particle_checks import _FixedSystem
from .zonal import _finite_energy, noise_bound, noise_clause
from .lawson import lawson_scheme
from .sphere_labelled import SphereLabelled, recorded_field, spherical_dataset
from .sphere_basis import (check_beta, check_noise, check_size, gradient_multipliers, kernel_energy, kernel_multipliers,
                           linear_growth_rate)
from .timegrid import check_memory, evolve_coefficients, march, saved_count, time_steps
from ..solvers.controller import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL

__all__ = ["SphericalMeanField", "SphericalSolution"]

_NEGATIVE_TOLERANCE = 1e-6
_TAIL_TOLERANCE = 1e-6  # as the zonal solver: the top quarter of the degrees holding more of ||rho||^2


def _sht():
    try:
        import ducc0.sht as sht
    except ImportError as exc:  # pragma: no cover - ducc0 is in the sphere and test extras
        raise ImportError('SphericalMeanField needs ducc0 (pip install "ctformer[sphere]")') from exc
    return sht


@dataclass(eq=False)   # MeanFieldSolution's equality, by entries
class SphericalSolution(SphereLabelled, MeanFieldSolution):
    r"""Saved states of :meth:`SphericalMeanField.solve` (a :class:`MeanFieldSolution`).

    ``grid`` is ``(colatitude, longitude)`` (1-D arrays, the map is their outer product),
    ``density`` has shape (T, n_theta, n_phi), ``coefficients`` (T, (L+1)(L+2)/2), complex,
    :math:`a_{lm}` for :math:`m \ge 0` in the healpy order; ``weights`` the quadrature weights
    of :math:`d\sigma` on the grid (n_theta, n_phi).
    """

    weights: np.ndarray = None
    _dataset = staticmethod(spherical_dataset)  # to_xarray / to_netcdf / to_zarr: sphere_labelled

    @property
    def mass(self):
        r""":math:`\int\rho\,d\sigma = \sqrt{4\pi}\,a_{00}` per saved time (conserved exactly).

        The grid quadrature ``np.tensordot(density, weights, 2)`` agrees to rounding
        (:math:`10^{-16}` times the largest density value).
        """
        return math.sqrt(4 * math.pi) * np.real(np.asarray(self.coefficients)[:, 0])


def _grid_shape(degree: int) -> tuple:
    """Gauss-Legendre colatitudes and longitudes for degree L (the 3/2 rule, see the module notes)."""
    return (3 * degree + 1) // 2 + 2, fft.next_fast_len(3 * degree + 2)


def spherical_bytes(degree: int) -> float:
    r"""Peak bytes of ``SphericalMeanField(..., degree=L)``: the quadrature weights on the grid
    (8 per point) and, per pair :math:`(l, m)`, :math:`(L+1)(L+2)/2` of them, the degree and
    order indices, four multipliers and their temporaries (66, measured by tracemalloc)."""
    n_theta, n_phi = _grid_shape(degree)
    return 8.0 * n_theta * n_phi + 66.0 * ((degree + 1) * (degree + 2) // 2) + circle_bytes(3 * degree + 1)


class SphericalMeanField(_FixedSystem):
    r"""Spherical-harmonic solver of the mean-field equation on :math:`S^2` (``ducc0.sht``).

    Parameters
    ----------
    beta : float
        Finite (:math:`|\beta| \le 700` for USA); 0 is uniform attention (the limit, in closed form).
    degree : int
        :math:`L \ge 1`, the highest retained degree.
    normalized : bool
        SA (True) or USA (False).
    noise : float
        :math:`\nu \ge 0` (treated exactly by an integrating factor).

    Raises
    ------
    SizeTooLargeError
        (a ValueError) Before anything is built, for a ``degree`` whose grid and coefficient
        arrays (:math:`\approx 69 L^2` bytes) exceed the memory budget, naming the largest
        ``degree`` that fits.
    """

    def __init__(self, beta, degree, *, normalized=True, noise=0.0):
        self.beta = check_beta(beta)
        self.degree = integer(degree, "degree")
        self.normalized = boolean(normalized, "normalized")
        self.noise = check_noise(noise)
        L = self.degree
        check_size(spherical_bytes, L, "degree", "SphericalMeanField's grid and harmonic coefficients")
        # the circle's stable-step analysis for K = L (its constructor checks |beta| <= 700 for USA)
        self._circle = CircleMeanField(self.beta, 3 * L + 1, normalized=self.normalized)
        # at least 3L + 2 longitudes (the 3/2 rule), rounded up to a length whose FFT has only
        # small prime factors: 3L + 2 = 194 (L = 64) is 2 x 97, and a right-hand side took 2.3 ms
        # on it against 0.53 on 196 = 2^2 x 7^2 (AMD EPYC, family 26 model 2)
        self.n_theta, self.n_phi = _grid_shape(L)
        x, w = special.roots_legendre(self.n_theta)
        self.colatitude = np.arccos(x[::-1])
        self.longitude = 2 * math.pi * np.arange(self.n_phi) / self.n_phi
        self.weights = np.outer(w[::-1], np.full(self.n_phi, 2 * math.pi / self.n_phi))
        self.l = np.concatenate([np.arange(m, L + 1) for m in range(L + 1)])
        self.m = np.concatenate([np.full(L + 1 - m, m) for m in range(L + 1)])
        # per degree, then spread over the (l, m) pairs: log_ive loops over its orders in Python,
        # so (L + 1)(L + 2)/2 orders took over a minute at L = 3000 for L + 1 distinct values
        degrees = np.arange(L + 1)
        self._lambda = kernel_multipliers(degrees, self.beta, 3, self.normalized)[self.l]
        self._gradient = gradient_multipliers(degrees, self.beta, 3, self.normalized)[self.l]  # lambda_l / beta
        self._root = np.sqrt(self.l * (self.l + 1.0))
        self._diffusion = self.noise * self.l * (self.l + 1.0)

    def __repr__(self) -> str:
        kind = "SA" if self.normalized else "USA"
        return f"SphericalMeanField({kind}, beta={self.beta}, degree={self.degree}, noise={self.noise})"

    @property
    def grid(self):
        """``(colatitude, longitude)``: Gauss-Legendre colatitudes (ascending) and equispaced longitudes."""
        return self.colatitude, self.longitude

    def points(self) -> np.ndarray:
        """The grid points on :math:`S^2`, shape (n_theta, n_phi, 3)."""
        th, ph = np.meshgrid(self.colatitude, self.longitude, indexing="ij")
        return np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], axis=-1)

    def growth_rate(self, k):
        """:func:`~ctformer.particles.zonal.linear_growth_rate` with ``dimension=3``."""
        return linear_growth_rate(k, self.beta, self.normalized, 3, self.noise)

    # -- transforms ------------------------------------------------------------------------------
    def synthesis(self, alm):
        """Values on the grid of coefficients ``alm`` (shape ((L+1)(L+2)/2,))."""
        return _sht().synthesis_2d(alm=np.asarray(alm)[None], spin=0, lmax=self.degree, geometry="GL",
                                   ntheta=self.n_theta, nphi=self.n_phi)[0]

    def analysis(self, values):
        """Coefficients of grid values (Gauss-Legendre quadrature; exact for degree <= L)."""
        return _sht().analysis_2d(map=np.asarray(values, dtype=np.float64)[None], spin=0, lmax=self.degree,
                                  geometry="GL")[0]

    # -- the vector field ----------------------------------------------------------------------
    def _velocity_of(self, alm):
        """The tangential velocity on the grid, shape (2, n_theta, n_phi): (theta, phi) components."""
        sht = _sht()
        grad = sht.synthesis_2d_deriv1(alm=(self._gradient * alm)[None], lmax=self.degree, geometry="GL",
                                       ntheta=self.n_theta, nphi=self.n_phi)
        if not self.normalized:
            return grad
        return grad / sht.synthesis_2d(alm=(self._lambda * alm)[None], spin=0, lmax=self.degree, geometry="GL",
                                       ntheta=self.n_theta, nphi=self.n_phi)

    def transport(self, alm):
        r"""The Galerkin transport term :math:`\sqrt{l(l+1)}\,E_{lm}(\rho X)` (without noise)."""
        flux = self.synthesis(alm)[None] * self._velocity_of(alm)
        eb = _sht().analysis_2d(map=flux, spin=1, lmax=self.degree, geometry="GL")
        return self._root * eb[0]

    def velocity(self, rho):
        """The velocity (theta, phi components) on the grid for a density (grid values or a callable)."""
        return self._velocity_of(self.coefficients_of(rho))

    def problem(self) -> solvers.SplitProblem:
        """The split problem of the coefficients (with noise: of ``(v, tau)``, as in the zonal solver)."""
        if not self.noise:
            return solvers.SplitProblem(flows=(self.transport,))
        lap = self._diffusion

        def flow(u):
            tau = u[-1].real
            alm = np.exp(-lap * tau) * u[:-1]
            return np.concatenate([np.exp(lap * tau) * self.transport(alm), [1.0]])

        def reset(u):
            return np.concatenate([np.exp(-lap * u[-1].real) * u[:-1], [0.0]])

        return solvers.SplitProblem(flows=(flow,), projections=(reset,))

    # -- diagnostics -----------------------------------------------------------------------------
    def _power(self, alm):
        """Per-degree power sum_m |a_lm|^2 (both signs of m), shape (..., L + 1)."""
        a = np.abs(np.asarray(alm)) ** 2 * np.where(self.m == 0, 1.0, 2.0)
        out = np.zeros(a.shape[:-1] + (self.degree + 1,))
        for l in range(self.degree + 1):
            out[..., l] = a[..., self.l == l].sum(axis=-1)
        return out

    def energy(self, alm, *, log=False):
        r""":math:`E = \frac{1}{2\beta}\sum_l \lambda_l \sum_m |a_{lm}|^2` (non-decreasing for USA without noise).

        ``log=True`` returns :math:`\log E` (:math:`\beta > 0`), finite where :math:`E` overflows
        float64 (:math:`\beta \gtrsim 709`, SA); :math:`E` itself is then refused with
        OverflowError. Refused (ValueError) at :math:`\beta = 0`, where :math:`E` is infinite.
        """
        _finite_energy(self.beta)
        return kernel_energy(self._power(alm), self.beta, 3, log)

    def order_parameter(self, alm):
        r""":math:`|\int x\,d\mu| = \sqrt{4\pi/3}\,(|a_{10}|^2 + 2|a_{11}|^2)^{1/2}`."""
        return np.sqrt(4 * math.pi / 3 * self._power(alm)[..., 1])

    def dominant_mode(self, alm):
        r"""The degree :math:`l \ge 1` of largest power :math:`\sum_m |a_{lm}|^2`."""
        return 1 + np.argmax(self._power(alm)[..., 1:], axis=-1)

    # -- input -----------------------------------------------------------------------------------
    def coefficients_of(self, rho, *, name="rho"):
        """Coefficients of a density: grid values (n_theta, n_phi) or a callable of points (..., 3).

        ``name`` is the argument named in the error messages (``solve`` passes ``"rho0"``).
        """
        values = rho(self.points()) if callable(rho) else rho
        values = to_host(values) if array_api_compat.is_array_api_obj(values) else np.asarray(values)
        if np.iscomplexobj(values) or not (np.issubdtype(values.dtype, np.floating)
                                           or np.issubdtype(values.dtype, np.integer)):
            raise TypeError(f"{name} must be a real density, got dtype {values.dtype}")
        if values.shape != self.weights.shape:
            raise ValueError(f"{name} must give values on the {self.weights.shape} grid (colatitude, longitude), "
                             f"got shape {values.shape}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} has NaN or infinite values: it is not an integrable density")
        with np.errstate(over="ignore", invalid="ignore"):  # values near 1e308 overflow: refused below, by name
            mass, alm = float(np.sum(values * self.weights)), self.analysis(values)
        if values.min() < 0 or not (mass > 0 and np.all(np.isfinite(alm))):
            raise ValueError(f"{name} must be a nonnegative density with positive mass whose coefficients fit "
                             f"float64 (min {values.min():.3g}, mass {mass:.3g}); rescale values near 1e308")
        return alm

    def stable_step(self, t1, scheme="rk4", mass: float = 1.0) -> float:
        """The circle's stable step for K = L (splitting schemes with noise: at most
        :func:`~ctformer.particles.zonal.noise_step`; Runge-Kutta schemes take the noise exactly)."""
        return min(self._circle.stable_step(t1, scheme, mass), noise_bound(self._diffusion, scheme))

    def solve(self, rho0, t1, dt, save_every=1, scheme="rk4"):
        r"""Evolve the density from :math:`t = 0` to ``t1`` (arguments as :meth:`ZonalMeanField.solve`).

        Returns
        -------
        SphericalSolution
        """
        scheme = solvers.get(scheme)
        alm = self.coefficients_of(rho0, name="rho0")
        steps, h = time_steps(t1, dt, save_every)
        mass = float(alm[0].real * math.sqrt(4 * math.pi))
        bound = self.stable_step(t1, scheme, mass)
        if steps and h > bound:
            raise ValueError(f"dt={h:.6g} is above the stable step {bound:.4g} of scheme {scheme.name!r} for "
                             f"t1={float(t1):.6g} with degree={self.degree}{noise_clause(self, scheme)}; "
                             f"use dt <= {bound:.4g} or a lower degree")
        state = np.concatenate([alm, [0.0]]) if self.noise else alm
        count = saved_count(steps, save_every)
        check_memory(count, state, save_every, steps)
        states = np.empty((count, state.shape[0]), dtype=np.complex128)
        states[0] = state
        floor = -_NEGATIVE_TOLERANCE * mass / (4 * math.pi)
        resolved = [True]

        def on_save(u, t_start, t_end):
            if not resolved[0]:
                return
            alm = u[: self.l.shape[0]]
            power = self._power(alm / np.max(np.abs(alm)))  # scale-safe: |a|^2 is 0 below 1e-162, inf above 1e154
            tail = float(power[self.degree - self.degree // 4:].sum() / power.sum()) if self.degree >= 4 else 0.0
            lowest = float(self.synthesis(alm).min())
            if lowest < floor or tail > _TAIL_TOLERANCE:
                resolved[0] = False
                why = ("the density went negative" if lowest < floor else
                       f"its top degrees stopped decaying (they hold {tail:.3g} of ||rho||^2)")
                warnings.warn(f"between t={t_start:.6g} and t={t_end:.6g} {why}: its clusters are narrower "
                              f"than degree {self.degree} resolves; raise degree or shorten t1",
                              ResolutionWarning, stacklevel=4)

        return march(*lawson_scheme(self, scheme), state, steps, h, save_every, states, what="spherical mean-field",
                     build=self._solution, hint="or the density under-resolved (raise degree)", on_save=on_save)

    def evolve(self, rho0, t1, *, scheme="tsit5", rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, dt=None,
               save_at=None, events=(), max_steps=DEFAULT_MAX_STEPS, controller=None, initial=None):
        r"""Evolve to ``t1`` with error control; return a :class:`ctformer.Solution`.

        The state is the coefficient vector (with noise followed by :math:`\tau = 0`, the
        integrating factor's clock, reset after every step); its error norm is the RMS of the
        coefficients, the :math:`L^2(d\sigma)` norm of the density's error over the degrees.
        Arguments as :meth:`CircleMeanField.evolve`; with ``dt``, fixed steps checked against
        :meth:`stable_step`. ``initial`` restarts a saved solve bit for bit, as in
        :meth:`ZonalMeanField.evolve` (the complex :math:`a_{lm}` come back from the file's
        (real, imaginary) pairs exactly).
        """
        size = (self.degree + 1) * (self.degree + 2) // 2
        return evolve_coefficients(self, rho0, t1, scheme=scheme, dt=dt, what="spherical mean-field",
                                   axes=("lm",), size=size, dtype=np.complex128,
                                   mass_of=lambda c: float(c[0].real * math.sqrt(4 * math.pi)),
                                   initial=initial, rtol=rtol, atol=atol, save_at=save_at,
                                   events=events, max_steps=max_steps, controller=controller)

    def _solution(self, times, states):
        alm = states[:, : self.l.shape[0]]
        density = np.stack([self.synthesis(a) for a in alm]) if len(alm) else np.empty((0,) + self.weights.shape)
        return SphericalSolution(times=np.asarray(times), grid=self.grid, density=density, coefficients=alm,
                                 weights=self.weights.copy(), **recorded_field(self))
