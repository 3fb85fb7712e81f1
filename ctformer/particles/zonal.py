r"""The mean-field limit on :math:`S^{d-1}` for zonal densities: Gegenbauer-Galerkin in :math:`s = \langle x, e\rangle`.

A token density :math:`\rho(t, x)` on :math:`S^{d-1}`, with respect to the surface measure and
of total mass one (uniform: :math:`1/|S^{d-1}|`), solves the continuity equation with noise

.. math::

    \partial_t\rho + \operatorname{div}_S(\rho X[\rho]) = \nu\Delta_S\rho, \qquad
    X[\rho] = \frac{\nabla_S G}{\beta G}\;\text{(SA)}, \quad X[\rho] = \frac{\nabla_S G}{\beta}\;\text{(USA)},
    \qquad G(x) = \int e^{\beta\langle x, y\rangle}\rho(y)\,d\sigma(y).

A density that depends only on :math:`s = \langle x, e\rangle` stays so. With the orthonormal
zonal polynomials :math:`\varphi_l` (:class:`~ctformer.particles.sphere_basis.GegenbauerBasis`),
:math:`\rho = \sum_{l \le L} c_l\varphi_l(s)`, Funk-Hecke gives
:math:`G = \sum_l \lambda_l(\beta) c_l\varphi_l`, and since :math:`\nabla_S s = e - s x`,
:math:`|\nabla_S s|^2 = 1 - s^2`, the Galerkin equations (the weak form against
:math:`\varphi_l`) read

.. math::

    \dot c_l = \int_{S^{d-1}} \rho\, V\, \varphi_l'(s)\, d\sigma - \nu\, l(l+d-2)\, c_l,
    \qquad V(s) = \frac{(1-s^2)\, G'(s)}{\beta G(s)} \;(= \dot s)\;\text{(SA)}, \quad
    \frac{(1-s^2)\, G'(s)}{\beta}\;\text{(USA)} .

Discretization:

* the integral on :math:`M = \lceil (3L+1)/2 \rceil` Gauss-Jacobi nodes of the weight
  :math:`(1-s^2)^{(d-3)/2}` (the 3/2 rule: exact when :math:`V` is a polynomial of degree
  :math:`L + 1`, as for USA, so the flux is alias-free);
* :math:`\varphi_0' = 0`, so :math:`\dot c_0 = 0` exactly and the mass
  :math:`c_0\sqrt{|S^{d-1}|}` is conserved exactly in the coefficients;
* :math:`\lambda_l` in closed form from :func:`scipy.special.ive`, formed in logarithms
  (:func:`~ctformer.particles.sphere_basis.kernel_multipliers`): SA uses
  :math:`\lambda_l/\lambda_0 \le 1` (a common factor cancels), USA :math:`\lambda_l` itself
  (:math:`|\beta| \le 700`), finite at every :math:`d` and :math:`\beta`;
* the noise exactly, by Lawson Runge-Kutta steps (:mod:`~ctformer.particles.lawson`): every
  factor :math:`e^{-\nu l(l+d-2)(c_i - c_j)\Delta t}` decays, so each diffusing mode decays by
  exactly :math:`e^{-\nu l(l+d-2)\Delta t}` per step, the noise does not bound the step, and the
  order is the scheme's while :math:`\nu L(L+d-2)\Delta t` is moderate. :meth:`ZonalMeanField.problem`
  is the integrating-factor form :math:`c = e^{-\nu\Lambda\tau} v`, reset to :math:`(c, 0)` after every
  step; the splitting schemes step that form, whose factor :math:`e^{\nu l(l+d-2)\tau}` must
  stay inside float64: for them the step is at most :math:`700/(\nu L(L+d-2))` (:func:`noise_step`).

The stable step is the circle's (:meth:`CircleMeanField.stable_step`) for the :math:`L`
retained degrees and the same velocity bound (1 for SA): in the angle
:math:`\vartheta = \arccos s` the transport is the circle's, with degree-:math:`L` resolution.
For :math:`d = 2` the solver is the circle's Fourier-Galerkin method restricted to even densities.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import array_api_compat
import numpy as np

from .. import solvers
from ..backend import to_host
from ..validation import boolean, integer
from .meanfield import CircleMeanField, MeanFieldSolution, ResolutionWarning, circle_bytes
from .particle_checks import _FixedSystem
from .sphere_labelled import SphereLabelled, recorded_field, zonal_dataset
from .sphere_basis import (GegenbauerBasis, check_beta, check_dimension, check_noise, check_size, gradient_multipliers,
                           kernel_energy, kernel_multipliers, laplace_eigenvalues, linear_growth_rate, log_sphere_area, sphere_area)
from .lawson import exact_noise, lawson_scheme
from .timegrid import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL, check_memory, evolve_coefficients, march, saved_count, time_steps

__all__ = ["ZonalMeanField", "ZonalSolution", "linear_growth_rate"]

_USA_BETA_MAX = 700.0
_FACTOR_LOG_MAX = 700.0  # e^{700} = 1e304: the integrating factor leaves 1e4 of float64 for the flux
_NEGATIVE_TOLERANCE = 1e-6  # below -this times the uniform density: not resolved
_TAIL_TOLERANCE = 1e-6  # the top quarter of the degrees holding more of ||rho||^2: not resolved
# densities are taken against the surface measure: the uniform one, 1/|S^{d-1}|, and the squares
# of the coefficients (~ 1/|S^{d-1}| times a cluster's concentration) must stay far inside float64
_MAX_DIMENSION = max(d for d in range(2, 1100) if log_sphere_area(d) >= math.log(1e-250))  # 374


def noise_step(diffusion) -> float:
    r"""The largest step whose integrating factor stays inside float64: :math:`700 / \max_l \nu l(l+d-2)`.

    A stage at :math:`\tau` multiplies the flux by :math:`e^{\nu l(l+d-2)\tau}` (inf beyond :math:`e^{709.8}`).
    """
    top = float(np.max(diffusion)) if np.size(diffusion) else 0.0
    return _FACTOR_LOG_MAX / top if top > 0 else math.inf


def noise_bound(diffusion, scheme) -> float:
    """:func:`noise_step` for a scheme that steps the integrating-factor form, else inf (Lawson steps)."""
    return math.inf if exact_noise(scheme) else noise_step(diffusion)


def noise_clause(field, scheme) -> str:
    """The part of a step refusal that names the noise's bound (empty without noise or with Lawson steps)."""
    step = noise_bound(field._diffusion, scheme)
    return (f"; noise={field.noise:g} needs nu*L*(L+d-2)*dt <= {_FACTOR_LOG_MAX:g} (dt <= {step:.4g}) for its "
            "integrating factor to stay inside float64; a Runge-Kutta scheme such as 'rk4' takes the noise "
            "exactly, without this bound") if math.isfinite(step) else ""


def _finite_energy(beta) -> None:
    """Refuse the energy at beta = 0, where (1 / 2 beta) e^{beta <x, y>} has no finite value."""
    if beta == 0:
        raise ValueError("energy needs beta != 0: E = (1/(2 beta)) int int e^(beta <x, y>) dmu dmu is "
                         "infinite at beta = 0 (M^2 / (2 beta) + |int x dmu|^2 / 2 + O(beta)); use "
                         "order_parameter for the beta = 0 dynamics, or a nonzero beta")


def zonal_bytes(degree: int) -> float:
    r"""Peak bytes of ``ZonalMeanField(..., degree=L)``: the recurrence's :math:`\varphi_l, \varphi_l'`
    and their scaled copies, four :math:`(L + 1) \times M` float64 matrices on the
    :math:`M = \lfloor (3L + 2)/2 \rfloor` nodes, and the circle's stable-step solver (:math:`3L + 1` modes)."""
    return 32.0 * (degree + 1) * ((3 * degree + 2) // 2) + circle_bytes(3 * degree + 1)


def _solver_dimension(dimension) -> int:
    r""":func:`check_dimension`, and a dimension whose densities fit float64 (:math:`d \le 374`)."""
    d = check_dimension(dimension)
    if d > _MAX_DIMENSION:
        raise ValueError(f"dimension={d} is beyond the zonal solver's range: its densities are taken against "
                         f"the surface measure, and the uniform one, 1/|S^(d-1)| = "
                         f"10^{-log_sphere_area(d) / math.log(10):.0f}, leaves no room for a cluster in float64; "
                         f"use dimension <= {_MAX_DIMENSION} (linear_growth_rate works in every dimension)")
    return d


@dataclass(eq=False)   # MeanFieldSolution's equality, by entries
class ZonalSolution(SphereLabelled, MeanFieldSolution):
    r"""Saved states of :meth:`ZonalMeanField.solve` (a :class:`MeanFieldSolution`).

    ``grid`` holds the Gauss-Jacobi nodes :math:`s_j`, ``density`` the density at them (one row
    per saved time), ``coefficients`` the Gegenbauer coefficients :math:`c_l`
    (:math:`\rho = \sum_l c_l\varphi_l(s)`, orthonormal in :math:`L^2(d\sigma)`), and
    ``weights`` the quadrature weights of :math:`d\sigma` at the nodes.
    """

    weights: np.ndarray = None
    dimension: int = 2
    _dataset = staticmethod(zonal_dataset)  # to_xarray / to_netcdf / to_zarr: sphere_labelled

    @property
    def mass(self):
        r"""Total mass :math:`\int\rho\,d\sigma = \sum_j q_j\rho(s_j)` per saved time."""
        return np.asarray(self.density) @ self.weights


class ZonalMeanField(_FixedSystem):
    r"""Gegenbauer-Galerkin solver of the mean-field equation for zonal densities on :math:`S^{d-1}`.

    Parameters
    ----------
    beta : float
        Inverse temperature, finite (:math:`|\beta| \le 700` for USA); 0 is uniform attention, the limit
        :math:`\beta \to 0` in closed form: :math:`\dot s = (1 - s^2)\,m_e` with :math:`m_e = \int s\,d\mu`
        (divided by the mass for SA).
    dimension : int
        :math:`2 \le d \le 374`: tokens on :math:`S^{d-1} \subset \mathbb{R}^d` (densities are
        taken against the surface measure, and beyond 374 the uniform one, :math:`1/|S^{d-1}|`,
        leaves no room in float64; :func:`linear_growth_rate` works in every dimension).
    degree : int
        :math:`L \ge 1`, the highest retained degree.
    normalized : bool
        SA (True) or USA (False).
    noise : float
        :math:`\nu \ge 0`, the coefficient of :math:`\nu\Delta_S` (treated exactly).

    Raises
    ------
    TypeError, ValueError
        Naming the argument: ``dimension`` < 2 or > 374, ``degree`` < 1, ``beta`` not finite,
        ``noise`` negative or not finite. A ``degree`` whose basis matrices
        (:math:`\approx 48 (L+1)^2` bytes) exceed the memory budget raises
        :class:`~ctformer.discretizations.SizeTooLargeError` (a ValueError) before anything is
        built, naming the largest ``degree`` that fits.
    """

    def __init__(self, beta, dimension, degree, *, normalized=True, noise=0.0):
        self.beta = check_beta(beta)
        self.dimension = _solver_dimension(dimension)
        self.degree = integer(degree, "degree")
        self.normalized = boolean(normalized, "normalized")
        self.noise = check_noise(noise)
        if not self.normalized and abs(self.beta) > _USA_BETA_MAX:
            raise ValueError(f"USA (normalized=False) needs |beta| <= {_USA_BETA_MAX}: its velocity carries "
                             f"exp(|beta|), beyond the float64 range; got beta={self.beta}")
        check_size(zonal_bytes, self.degree, "degree", "ZonalMeanField's Gegenbauer basis matrices")
        self.basis = GegenbauerBasis.build(self.dimension, self.degree, (3 * self.degree + 2) // 2)
        l = np.arange(self.degree + 1)
        # SA: lambda_l / lambda_0 (a common factor cancels in grad G / G; lambda_0 alone underflows
        # at large d and small beta), USA: lambda_l
        self._lambda = kernel_multipliers(l, self.beta, self.dimension, self.normalized)
        self._gradient = gradient_multipliers(l, self.beta, self.dimension, self.normalized)  # lambda_l / beta
        self._diffusion = self.noise * laplace_eigenvalues(l, self.dimension)
        # the circle's stable-step analysis for L modes and the same velocity bound
        self._circle = CircleMeanField(self.beta, 3 * self.degree + 1, normalized=self.normalized)

    def __repr__(self) -> str:
        kind = "SA" if self.normalized else "USA"
        return f"ZonalMeanField({kind}, beta={self.beta}, dimension={self.dimension}, degree={self.degree}, noise={self.noise})"

    @property
    def grid(self) -> np.ndarray:
        """The Gauss-Jacobi nodes :math:`s_j` where densities are given and returned."""
        return self.basis.nodes

    @property
    def uniform(self) -> float:
        r"""The uniform density :math:`1/|S^{d-1}|`."""
        return 1.0 / sphere_area(self.dimension)

    def growth_rate(self, k):
        """:func:`linear_growth_rate` of degrees ``k`` for this solver's parameters."""
        return linear_growth_rate(k, self.beta, self.normalized, self.dimension, self.noise)

    # -- the vector field ----------------------------------------------------------------------
    def _velocity_of(self, c):
        """ds/dt = V(s) at the nodes for coefficients ``c``."""
        b = self.basis
        speed = (1.0 - b.nodes ** 2) * (b.derivatives @ (self._gradient * c))
        return speed / (b.values @ (self._lambda * c)) if self.normalized else speed

    def transport(self, c):
        r"""The Galerkin transport term :math:`\int\rho V\varphi_l'\,d\sigma` (without noise)."""
        b = self.basis
        return b.derivatives.T @ (b.weights * (b.values @ c) * self._velocity_of(c))

    def velocity(self, rho):
        r""":math:`\dot s = V(s)` at :attr:`grid` for the density ``rho`` (values at the grid or a callable of s).

        The tangential velocity is :math:`X = V(s)\,(e - s x)/(1 - s^2)`, of length
        :math:`|V|/\sqrt{1-s^2}`.
        """
        return self._velocity_of(self.coefficients_of(rho))

    def problem(self) -> solvers.SplitProblem:
        """The split problem of the coefficients (with noise: of ``(v, tau)``, see the module notes)."""
        if not self.noise:
            return solvers.SplitProblem(flows=(self.transport,))
        lap = self._diffusion

        def flow(u):
            tau = u[-1]
            c = np.exp(-lap * tau) * u[:-1]
            return np.concatenate([np.exp(lap * tau) * self.transport(c), [1.0]])

        def reset(u):
            return np.concatenate([np.exp(-lap * u[-1]) * u[:-1], [0.0]])

        return solvers.SplitProblem(flows=(flow,), projections=(reset,))

    # -- diagnostics -----------------------------------------------------------------------------
    def energy(self, coefficients, *, log=False):
        r"""Interaction energy :math:`E = \frac{1}{2\beta}\iint e^{\beta\langle x, y\rangle}d\mu\,d\mu`.

        :math:`E = \frac{1}{2\beta}\sum_l \lambda_l c_l^2` by Funk-Hecke.

        ``coefficients`` has shape (..., L + 1) (e.g. ``solution.coefficients``: one value per
        saved time). Non-decreasing in time for USA without noise (a gradient flow of E).
        ``log=True`` returns :math:`\log E` (:math:`\beta > 0`), finite where :math:`E \sim
        e^{\beta}` overflows float64 (:math:`\beta \gtrsim 709`, SA); :math:`E` itself is then
        refused with OverflowError. Refused (ValueError) at :math:`\beta = 0`, where :math:`E`
        is infinite.
        """
        _finite_energy(self.beta)
        c = np.asarray(coefficients)
        return kernel_energy(c * c, self.beta, self.dimension, log)

    def order_parameter(self, coefficients):
        r""":math:`|\int x\,d\mu| = |\int s\,\rho\,d\sigma| = |c_1|\,\|s\|_{L^2(d\sigma)} = |c_1|\sqrt{|S^{d-1}|/d}`."""
        c = np.asarray(coefficients)
        return np.abs(c[..., 1]) * math.sqrt(sphere_area(self.dimension) / self.dimension)

    def dominant_mode(self, coefficients):
        r"""The degree :math:`l \ge 1` of largest :math:`|c_l|` (the largest :math:`L^2` component), per row."""
        c = np.asarray(coefficients)
        return 1 + np.argmax(np.abs(c[..., 1:]), axis=-1)

    # -- input ---------------------------------------------------------------------------------
    def coefficients_of(self, rho, *, name="rho"):
        r"""Gegenbauer coefficients of a density: values at :attr:`grid` or a vectorized callable of s.

        ``name`` is the argument named in the error messages (``solve`` passes ``"rho0"``).

        Raises
        ------
        ValueError
            For NaN or infinite values, a wrong shape, negative values, zero mass or coefficients beyond float64.
        TypeError
            For complex or non-numeric values.
        """
        values = rho(self.grid) if callable(rho) else rho
        values = to_host(values) if array_api_compat.is_array_api_obj(values) else np.asarray(values)
        if np.iscomplexobj(values):
            raise TypeError(f"{name} must be real (a density), got a complex array of dtype {values.dtype}")
        if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
            raise TypeError(f"{name} must be a real numeric array, got dtype {values.dtype}")
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), np.shape(values))
        if values.shape != self.grid.shape:
            raise ValueError(f"{name} must give {self.grid.shape[0]} values (one per node s_j of grid), "
                             f"got shape {values.shape}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} has NaN or infinite values: it is not an integrable density")
        with np.errstate(over="ignore", invalid="ignore"):  # values near 1e308 overflow: refused below, by name
            mass, c = values @ self.basis.weights, self.basis.project(values)
        if values.min() < 0 or not (mass > 0 and np.all(np.isfinite(c))):
            raise ValueError(f"{name} must be a nonnegative density with positive mass whose coefficients "
                             f"fit float64 (min {values.min():.3g}, mass {mass:.3g}); rescale values near 1e308")
        return c

    # -- stable steps --------------------------------------------------------------------------
    def stable_step(self, t1, scheme="rk4", mass: float = 1.0) -> float:
        r"""The largest stable step for a solve to ``t1``: :meth:`CircleMeanField.stable_step` with :math:`K = L`.

        The noise is integrated exactly (Lawson steps) and does not bound the step, except for
        the splitting schemes, whose integrating factor must stay inside float64: for them the
        step is at most :func:`noise_step`, :math:`700/(\nu L(L+d-2))`.
        """
        return min(self._circle.stable_step(t1, scheme, mass), noise_bound(self._diffusion, scheme))

    # -- time stepping ---------------------------------------------------------------------------
    def solve(self, rho0, t1, dt, save_every=1, scheme="rk4"):
        r"""Evolve the density from :math:`t = 0` to ``t1``.

        Parameters
        ----------
        rho0 : callable or array, shape (M,)
            A vectorized function of :math:`s`, or its values at :attr:`grid`; projected on
            degrees :math:`\le L`. Mass one matches particles with weights :math:`1/n`.
        t1, dt, save_every, scheme
            As in :meth:`CircleMeanField.solve`; ``dt`` must not exceed :meth:`stable_step`.

        Returns
        -------
        ZonalSolution

        Raises
        ------
        ValueError, TypeError, FloatingPointError, SolveInterrupted
            As :meth:`CircleMeanField.solve`. A :class:`ResolutionWarning` is issued (once) when
            the density goes below :math:`-10^{-6}` times the uniform density or the top quarter
            of the degrees holds more than :math:`10^{-6}` of :math:`\|\rho\|^2`.
        """
        scheme = solvers.get(scheme)
        c = self.coefficients_of(rho0, name="rho0")
        steps, h = time_steps(t1, dt, save_every)
        mass = float(c[0] * math.sqrt(sphere_area(self.dimension)))
        bound = self.stable_step(t1, scheme, mass)
        if steps and h > bound:
            raise ValueError(
                f"dt={h:.6g} is above the stable step {bound:.4g} of scheme {scheme.name!r} for t1={float(t1):.6g} "
                f"with degree={self.degree} (transport at up to L*V = {self.degree}*"
                f"{self._circle.velocity_bound(mass):.4g}{noise_clause(self, scheme)}); use dt <= {bound:.4g} or a "
                "lower degree")
        state = np.concatenate([c, [0.0]]) if self.noise else c
        count = saved_count(steps, save_every)
        check_memory(count, state, save_every, steps)
        states = np.empty((count, state.shape[0]))
        states[0] = state
        resolved = [True]

        def on_save(u, t_start, t_end):
            if resolved[0]:
                resolved[0] = self._check_resolved(u[: self.degree + 1], mass, t_start, t_end)

        return march(*lawson_scheme(self, scheme), state, steps, h, save_every, states, what="zonal mean-field",
                     build=self._solution, hint="or the density under-resolved (raise degree)", on_save=on_save)

    def evolve(self, rho0, t1, *, scheme="tsit5", rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, dt=None,
               save_at=None, events=(), max_steps=DEFAULT_MAX_STEPS, controller=None, initial=None):
        r"""Evolve to ``t1`` with error control; return a :class:`ctformer.Solution`.

        The state is the coefficient vector (with noise followed by :math:`\tau = 0`, the
        integrating factor's clock, reset after every step); its error norm is the RMS of the
        coefficients, the :math:`L^2(d\sigma)` norm of the density's error over the degrees.
        Arguments as :meth:`CircleMeanField.evolve`; with ``dt``, fixed steps checked against
        :meth:`stable_step`.

        ``initial`` (a :class:`ctformer.Solution` of this solver, or the dataset its
        ``to_netcdf``/``to_zarr`` wrote, with ``rho0=None``) continues that solve from its last
        saved state :math:`t_0` with the same bits as the uninterrupted solve: error-controlled
        from an accepted step (with its step size and error), fixed steps from a step of the
        same grid (same ``t1`` and ``dt``). Refused (ValueError) for another degree or noise,
        another scheme, or :math:`t_0 \ge t_1`.
        """
        return evolve_coefficients(self, rho0, t1, scheme=scheme, dt=dt, what="zonal mean-field",
                                   axes=("degree",), size=self.degree + 1, dtype=np.float64,
                                   mass_of=lambda c: float(c[0] * math.sqrt(sphere_area(self.dimension))),
                                   initial=initial, rtol=rtol, atol=atol, save_at=save_at,
                                   events=events, max_steps=max_steps, controller=controller)

    def _check_resolved(self, c, mass, t_start, t_end) -> bool:
        """Warn once when the density goes negative or its top degrees stop decaying."""
        lowest = float((self.basis.values @ c).min()) / (mass * self.uniform)
        top = c[self.degree - self.degree // 4:] if self.degree >= 4 else c[-1:]
        tail = (math.hypot(*top) / math.hypot(*c)) ** 2  # scale-safe: c @ c is 0 below |c| ~ 1e-162, inf above 1e154
        if lowest >= -_NEGATIVE_TOLERANCE and tail <= _TAIL_TOLERANCE:
            return True
        negative = lowest < -_NEGATIVE_TOLERANCE
        why = (f"the density went negative (min {lowest:.3g} times the uniform density)" if negative
               else f"its top degrees stopped decaying (they hold {tail:.3g} of ||rho||^2)")
        warnings.warn(f"between t={t_start:.6g} and t={t_end:.6g} {why}: the clusters are narrower than "
                      f"degree {self.degree} resolves, and later times are not accurate; raise degree or "
                      "shorten t1", ResolutionWarning, stacklevel=4)
        return False

    def _solution(self, times, states):
        c, basis = states[:, : self.degree + 1], self.basis
        return ZonalSolution(times=np.asarray(times), grid=self.grid.copy(), density=c @ basis.values.T, coefficients=c,
                             weights=basis.weights.copy(), dimension=self.dimension, **recorded_field(self))
