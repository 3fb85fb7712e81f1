r"""The mean-field limit of self-attention dynamics on the circle (d = 2, Q = K = V = I).

A token density :math:`\rho(t, \theta)` on :math:`[0, 2\pi)`, normalized to total mass one
(:math:`\int_0^{2\pi} \rho\, d\theta = 1`, the limit of particles with weights :math:`1/n`),
is transported by the attention velocity (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025):

.. math::

    \partial_t \rho + \partial_\theta(\rho\, X[\rho]) = 0, \qquad
    X[\rho](\theta) = \frac{\int e^{\beta\cos(\varphi - \theta)} \sin(\varphi - \theta)\, \rho(\varphi)\, d\varphi}
                           {\int e^{\beta\cos(\varphi - \theta)}\, \rho(\varphi)\, d\varphi}

(SA); the unnormalized dynamics (USA) keeps only the numerator. Numerator and denominator are
circular convolutions with :math:`e^{\beta\cos\psi} \sin\psi` and :math:`e^{\beta\cos\psi}`,
whose Fourier coefficients are exact Bessel values: from
:math:`e^{\beta\cos\psi} = \sum_k I_k(\beta) e^{ik\psi}` and
:math:`I_{k-1} - I_{k+1} = (2k/\beta) I_k`, with :math:`\hat\rho_k = \frac{1}{2\pi}\int \rho e^{-ik\theta}`,

.. math::

    D(\theta) = 2\pi \sum_k I_k(\beta)\, \hat\rho_k\, e^{ik\theta}, \qquad
    N(\theta) = 2\pi \sum_k \tfrac{i}{2}\big(I_{k-1}(\beta) - I_{k+1}(\beta)\big)\hat\rho_k\, e^{ik\theta},

:math:`X = N / D` (SA) or :math:`X = N` (USA). The coefficients use the exponentially scaled
:math:`I_k(\beta) e^{-|\beta|}` (:func:`scipy.special.ive`), whose common factor cancels in
:math:`N / D`, so SA is finite for every finite :math:`\beta`. For USA the factor
:math:`e^{|\beta|}` is put back, which limits USA to :math:`|\beta| \le 700` in float64.

Discretization: Fourier-Galerkin in :math:`\theta` with ``n_modes`` grid points and
wavenumbers :math:`|k| \le K = \lfloor (n_{\text{modes}} - 1)/3 \rfloor` (the 2/3 rule: products
of two functions with modes up to :math:`K` are alias-free on the grid). The flux
:math:`\rho X` is formed on the grid, transformed and truncated to :math:`|k| \le K`;
the coefficients (and the angles of optional tracers) are one state of a
:class:`ctformer.solvers.SplitProblem` with one flow, advanced by any scheme of
:func:`ctformer.solvers.available` (classical RK4 by default; design notes, section 5). The
:math:`k = 0` coefficient has zero time derivative exactly, so the mass is conserved exactly in
the coefficients.

Stable steps: linearized about any nonnegative density, the transport part
:math:`-\partial_\theta(X\,\delta\rho)` of the Galerkin operator has eigenvalues up to
:math:`i K V` in modulus, with :math:`V = \sup|X|` (:math:`V = 1` for SA, whose velocity is a
weighted mean of :math:`\sin`; :math:`V = m \max_\psi e^{\beta\cos\psi}|\sin\psi|` for USA of
mass :math:`m`); the growth modes :math:`\lambda_k = k^2 I_k(\beta)/(\beta I_0(\beta))` are real and
positive, where every explicit Runge-Kutta method under-amplifies (:math:`R(z) \le e^z`).
:meth:`CircleMeanField.stable_step` is the largest step for which the scheme's stability
function :math:`R` keeps :math:`\frac{t_1}{\Delta t} \max_{|y| \le \Delta t K V} \log|R(iy)|
\le \log \varepsilon^{-1/2}` (rounding errors grow by at most :math:`10^{8}` over the run,
a Lax-Richtmyer bound); for RK4 on long runs it is :math:`2\sqrt{2}/(K V)` to 0.2%.
:meth:`CircleMeanField.solve` refuses a larger ``dt`` with a ``ValueError`` naming both.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from .. import solvers
from ..backend import backend_of, constant, to_host
from ..validation import boolean, integer
from .circle_states import _NEGATIVE_TOLERANCE, MeanFieldSolution, ResolutionWarning, _CircleStates, _host_angles
from .linear_stability import linear_growth_rate, stability_function
from .particle_checks import _FixedSystem, _check_beta
from .sphere_basis import check_size
from .timegrid import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL, check_memory, evolve_on, march, restart_of, saved_count, time_steps

__all__ = ["CircleMeanField", "MeanFieldSolution", "ResolutionWarning", "linear_growth_rate", "stability_function"]

_USA_BETA_MAX = 700.0


class CircleMeanField(_CircleStates, _FixedSystem):
    r"""Fourier spectral solver of the mean-field continuity equation on the circle.

    .. math::

        \partial_t \rho + \partial_\theta\big(\rho\, X[\rho]\big) = 0, \qquad
        X[\rho] = \frac{(e^{\beta\cos}\sin) \star \rho}{e^{\beta\cos} \star \rho}

    where :math:`(f \star \rho)(\theta) = \int f(\varphi - \theta)\rho(\varphi)\,d\varphi`
    (SA; USA drops the denominator).

    Parameters
    ----------
    beta : float
        Inverse temperature, finite (:math:`|\beta| \le 700` for USA).
    n_modes : int
        Number of grid points (and FFT modes); wavenumbers :math:`|k| \le K = \lfloor
        (n_{\text{modes}} - 1)/3\rfloor` are kept (2/3 rule). At least 4, so that :math:`K \ge 1`.
    normalized : bool
        SA (True) or USA (False).
    backend : {"numpy", "cupy", "auto"} or None
        Array library; ``None`` follows the initial density (NumPy for a callable).

    Raises
    ------
    ValueError
        For a non-finite ``beta`` (or :math:`|\beta| > 700` for USA) or ``n_modes`` < 4.
    TypeError
        For a non-integer ``n_modes``, or a ``normalized`` other than True or False.

    Notes
    -----
    The SA velocity is bounded by one, so the advective condition
    :math:`\Delta t \, K \le 2\sqrt{2}` keeps RK4 stable (:meth:`stable_step`); it is checked
    before every solve.
    """

    def __init__(self, beta, n_modes, normalized=True, backend=None):
        self.beta = _check_beta(beta)
        self.normalized = boolean(normalized, "normalized")  # bool("False") would be SA
        if not self.normalized and abs(self.beta) > _USA_BETA_MAX:
            raise ValueError(
                f"USA (normalized=False) needs |beta| <= {_USA_BETA_MAX}: its velocity carries the factor "
                f"exp(|beta|) = exp({abs(self.beta)}), beyond the float64 range"
            )
        if integer(n_modes, "n_modes", minimum=None) < 4:
            raise ValueError(
                f"n_modes must be >= 4: the 2/3 dealiasing rule keeps |k| <= (n_modes - 1) // 3, "
                f"which must be at least 1; got n_modes={n_modes}"
            )
        check_size(circle_bytes, int(n_modes), "n_modes", "CircleMeanField's grid and multipliers", minimum=4)
        self.n_modes = int(n_modes)
        self.max_wavenumber = (self.n_modes - 1) // 3
        self.grid = 2 * math.pi * np.arange(self.n_modes) / self.n_modes
        self._backend_name = backend
        k = np.arange(self.max_wavenumber + 1)
        scaled_i = special.ive(k, self.beta)
        scaled_half_diff = 0.5 * (special.ive(k - 1, self.beta) - special.ive(k + 1, self.beta))
        factor = 1.0 if self.normalized else math.exp(abs(self.beta))
        # D and N multipliers on rfft coefficients (the irfft 1/N pairs with rfft's N rho_hat).
        self._denominator = 2 * math.pi * scaled_i
        self._numerator = 2j * math.pi * scaled_half_diff * factor
        self._derivative = 1j * k

    def __repr__(self) -> str:
        kind = "SA" if self.normalized else "USA"
        return f"CircleMeanField({kind}, beta={self.beta}, n_modes={self.n_modes})"

    # -- the vector field --------------------------------------------------------------------
    def _constants(self, like):
        """Denominator, numerator and derivative multipliers where ``like`` lives (cached)."""
        return tuple(constant(self, key, host, like) for key, host in
                     (("den", self._denominator), ("num", self._numerator), ("ik", self._derivative)))

    def _coefficient_flow(self, backend, like):
        """The Galerkin right-hand side ``c -> dc/dt`` on the retained coefficients, unchecked."""
        fft, n, kept = backend.fft, self.n_modes, self.max_wavenumber + 1
        den, num, ik = self._constants(like)
        normalized = self.normalized

        def velocity(c):
            numerator = fft.irfft(num * c, n=n)
            return numerator / fft.irfft(den * c, n=n) if normalized else numerator

        def rate(c):
            flux = fft.irfft(c, n=n) * velocity(c)
            return -ik * fft.rfft(flux)[:kept]

        return rate, velocity

    def _flow(self, backend, like, tracers: int):
        """The flow of the packed state: coefficients, then tracer angles (as complex numbers)."""
        rate, _ = self._coefficient_flow(backend, like)
        if not tracers:
            return rate
        xp = backend.xp
        kept = self.max_wavenumber + 1
        den, num, _ = self._constants(like)
        k = xp.astype(xp.arange(kept), xp.float64)
        # real series from rfft coefficients: (1/N)(a_0 + 2 sum_{k>=1} Re(a_k e^{ik theta}))
        scale = xp.where(k == 0, 1.0, 2.0) / self.n_modes
        snum, sden = scale * num, scale * den
        normalized = self.normalized

        def flow(state):
            c, theta = state[:kept], xp.real(state[kept:])
            phase = xp.exp(1j * theta[:, None] * k[None, :])
            speed = xp.real(phase @ (snum * c))
            if normalized:
                speed = speed / xp.real(phase @ (sden * c))
            return xp.concat([rate(c), xp.astype(speed, c.dtype)])

        return flow

    def problem(self, like, tracers: int = 0) -> solvers.SplitProblem:
        """The mean field as a split problem: one flow, no projection.

        The state is the complex array of the ``max_wavenumber + 1`` retained ``rfft``
        coefficients followed by ``tracers`` tracer angles (complex numbers with zero imaginary
        part); ``like`` is such a state (it fixes the array library and device).
        """
        return solvers.SplitProblem(flows=(self._flow(backend_of(like), like, tracers),))

    def velocity(self, rho):
        r"""The velocity field :math:`X[\rho]` at the grid angles.

        Parameters
        ----------
        rho : array, shape (n_modes,)
            Density values at :attr:`grid` (projected on the retained modes first).

        Returns
        -------
        array, shape (n_modes,)
        """
        backend, rho = self._density_values(rho, "rho")
        c = backend.fft.rfft(rho)[: self.max_wavenumber + 1]
        return self._coefficient_flow(backend, c)[1](c)

    # -- stable steps --------------------------------------------------------------------------
    def velocity_bound(self, mass: float = 1.0) -> float:
        r"""A bound :math:`V \ge \sup_\theta |X[\rho](\theta)|` for every nonnegative density of ``mass``.

        SA: :math:`V = 1` (the velocity is a weighted mean of :math:`\sin`). USA:
        :math:`V = m \max_\psi e^{\beta\cos\psi}|\sin\psi| = m\, e^{|\beta| c}\sqrt{1 - c^2}` with
        :math:`c = (\sqrt{1 + 4\beta^2} - 1)/(2|\beta|)` (:math:`V = m` at :math:`\beta = 0`).
        """
        if self.normalized:
            return 1.0
        b = abs(self.beta)
        c = 0.0 if b == 0 else (math.sqrt(1.0 + 4.0 * b * b) - 1.0) / (2.0 * b)
        return float(mass) * math.exp(b * c) * math.sqrt(1.0 - c * c)

    def stable_step(self, t1, scheme="rk4", mass: float = 1.0) -> float:
        r"""The largest stable step for a solve to ``t1`` with ``scheme`` (see the module notes).

        The Galerkin transport operator has eigenvalues :math:`iy` with
        :math:`|y| \le K V` (:meth:`velocity_bound`); with :math:`R` the stability function of
        the scheme (:func:`stability_function`), the bound is the smallest step where
        :math:`\frac{t_1}{\Delta t} \max_{0 \le y' \le \Delta t K V} \log|R(iy')|` exceeds
        :math:`\log \varepsilon^{-1/2} \approx 18.0`, or ``t1`` when no step does.

        Returns
        -------
        float
            E.g. RK4 (:math:`|R(iy)| \le 1` for :math:`y \le 2\sqrt 2`): about
            :math:`2\sqrt{2}/(K V)`; explicit Euler (:math:`|R(iy)|^2 = 1 + y^2`): about
            :math:`2 \log\varepsilon^{-1/2} / (t_1 K^2 V^2)`.
        """
        t1 = float(t1)
        scheme = solvers.get(scheme)
        speed = self.max_wavenumber * self.velocity_bound(mass)
        if t1 <= 0 or speed == 0:
            return math.inf if t1 <= 0 else t1
        budget = 0.5 * math.log(1.0 / np.finfo(np.float64).eps)
        top = t1 * speed
        y = np.unique(np.concatenate([np.linspace(0.0, min(top, 16.0), 4097),
                                      np.geomspace(min(top, 16.0), top, 2049) if top > 16.0 else []]))
        growth = np.maximum.accumulate(_log_modulus(stability_function(scheme, 1j * y)))
        growth = np.maximum(growth, 0.0)
        excess = np.zeros_like(y)
        excess[1:] = t1 * speed * growth[1:] / y[1:]
        over = np.nonzero(excess > budget)[0]
        if over.size == 0:
            return t1
        j = int(over[0])
        if j == 0:  # pragma: no cover - excess(0) = 0
            return 0.0
        before = growth[j - 1]

        def crossing(v):
            if v == 0:  # log|R(iv)| = O(v^2) for a consistent scheme: no excess at v = 0
                return -budget
            return t1 * speed * max(before, float(_log_modulus(stability_function(scheme, 1j * v)))) / v - budget

        if crossing(y[j - 1]) >= 0 or crossing(y[j]) <= 0:
            return float(y[j - 1] / speed)
        return float(optimize.brentq(crossing, y[j - 1], y[j], xtol=1e-12, rtol=1e-10) / speed)

    # -- time stepping ---------------------------------------------------------------------------
    def solve(self, rho0, t1, dt, save_every=1, tracers=None, scheme="rk4"):
        r"""Evolve the density from :math:`t = 0` to ``t1``.

        Parameters
        ----------
        rho0 : callable or array, shape (n_modes,)
            The initial density: a vectorized function of the angle, or its values at
            :attr:`grid`. It is projected on the retained modes :math:`|k| \le K`. Mass one
            matches particles with weights :math:`1/n` (the USA velocity is linear in the mass).
        t1 : float
            Final time, >= 0.
        dt : float
            Largest time step; the step used is ``t1 / ceil(t1 / dt)``. It must not exceed
            :meth:`stable_step` for ``t1`` and ``scheme``.
        save_every : int
            Save every ``save_every``-th step (the final state is always saved).
        tracers : array, shape (m,), optional
            Initial angles moved along the characteristics :math:`\dot\theta = X[\rho_t](\theta)`
            in the same steps (the mean-field flow map).
        scheme : str or Scheme
            Any name of :func:`ctformer.solvers.available`; default ``"rk4"``. Observed order
            ``solvers.get(scheme).order()``: euler, lie, parallel 1; heun, strang 2; rk4 4.

        Returns
        -------
        MeanFieldSolution

        Raises
        ------
        ValueError
            For a negative, non-finite or wrongly sized ``rho0``, bad ``t1``, ``dt``,
            ``save_every``, ``scheme``; before any step, for ``dt`` above the stable-step
            bound (the message names both), for ``t1 / dt`` above the step limit (10**8
            steps, or ``CTFORMER_MAX_STEPS``) and when the saved states cannot fit in memory.
        TypeError
            For a complex ``rho0`` or non-real ``t1``, ``dt``.
        FloatingPointError
            If the solution becomes non-finite (checked at each save; the message names the
            time interval).
        SolveInterrupted
            On Ctrl-C, with the :class:`MeanFieldSolution` so far in ``result``.
        """
        scheme = solvers.get(scheme)
        backend, rho = self._density_values(rho0)
        xp = backend.xp
        steps, h = time_steps(t1, dt, save_every)
        kept = self.max_wavenumber + 1
        c = backend.fft.rfft(rho)[:kept]
        mass = 2 * math.pi * float(to_host(xp.real(c[0]))) / self.n_modes
        bound = self.stable_step(t1, scheme, mass)
        if steps and h > bound:
            raise ValueError(
                f"dt={h:.6g} is above the stable step {bound:.4g} of scheme {scheme.name!r} for "
                f"t1={float(t1):.6g}: the {kept - 1} retained modes move at up to "
                f"K*V = {self.max_wavenumber}*{self.velocity_bound(mass):.4g} "
                f"(stability_function(scheme, i*dt*K*V) must stay in the unit disk, or grow by at "
                f"most 1e8 over the run); use dt <= {bound:.4g} or fewer modes"
            )
        m = 0
        state = c
        if tracers is not None:
            theta = _host_angles(tracers)
            m = theta.shape[0]
            state = xp.concat([c, backend.asarray(theta.astype(np.complex128))])
        count = saved_count(steps, save_every)
        check_memory(count, state, save_every, steps)
        states = xp.empty((count, state.shape[0]), dtype=state.dtype)
        states[0, ...] = state
        floor = -_NEGATIVE_TOLERANCE * mass / (2 * math.pi)
        resolved = [True]

        def on_save(state, t_start, t_end):
            if resolved[0]:
                resolved[0] = self._check_resolved(backend, state[:kept], floor, mass, t_start, t_end)

        return march(scheme, self.problem(c, m), state, steps, h, save_every, states, what="mean-field",
                     build=lambda times, kept_states: self._solution(backend, times, kept_states, m),
                     hint="or the density under-resolved (raise n_modes)", on_save=on_save)

    def evolve(self, rho0, t1, *, scheme="tsit5", rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, dt=None,
               save_at=None, events=(), max_steps=DEFAULT_MAX_STEPS, controller=None, initial=None):
        r"""Evolve the density to ``t1`` with error control; return a :class:`ctformer.Solution`.

        The state is the complex vector of the retained ``rfft`` coefficients
        :math:`c_0, \dots, c_K` (``Solution.states`` of shape ``(T, K + 1)``; the density is
        ``numpy.fft.irfft(c, n=n_modes)``); the error norm is their RMS, which is the
        :math:`L^2` norm of the density's error by Parseval. ``rho0``, ``dt`` and the other
        arguments as for :meth:`solve` and :meth:`ctformer.ContinuousTransformer.evolve`;
        ``condition(t, c)`` of an event receives the coefficients. ``initial`` restarts a
        solve (``rho0`` None) with the same scheme, error-controlled from its last saved accepted
        step or fixed-step from a saved state on its step grid, bit for bit.

        Raises
        ------
        ValueError
            As :meth:`solve` for ``rho0``; with ``dt``, for a step above :meth:`stable_step`;
            for an ``initial`` whose last state is not ``K + 1`` finite coefficients.
        """
        scheme_obj = solvers.get(scheme)
        start = restart_of(initial, t1, dt, scheme)
        if start is not None:
            if rho0 is not None:
                raise ValueError("rho0 and initial both given: a restart takes its state from "
                                 "initial; pass rho0=None")
            # The saved coefficients themselves: no density check, whose rounding dips (-5e-16
            # where the density touches zero) the uninterrupted solve never sees.
            backend, c = self._restart_coefficients(start.u0)
        else:
            backend, rho = self._density_values(rho0)
            c = backend.fft.rfft(rho)[:self.max_wavenumber + 1]
        if dt is not None:
            steps, h = time_steps(t1, dt, 1)
            mass = 2 * math.pi * float(to_host(backend.xp.real(c[0]))) / self.n_modes
            bound = self.stable_step(t1, scheme_obj, mass)
            if steps and h > bound:
                raise ValueError(f"dt={h:.6g} is above the stable step {bound:.4g} of scheme "
                                 f"{scheme_obj.name!r} for t1={float(t1):.6g}; use dt <= "
                                 f"{bound:.4g} or fewer modes")
        solution = evolve_on(self.problem(c), c, t1, scheme=scheme_obj, rtol=rtol, atol=atol,
                             dt=dt, save_at=save_at, events=events, max_steps=max_steps,
                             controller=controller, what="mean-field",
                             hint="or the density under-resolved (raise n_modes)", start=start,
                             axes=("wavenumber",), system=self, initial=initial)
        return solution


def circle_bytes(n_modes: int) -> float:
    """Peak bytes of the constructor: grid 8 N, 64 per retained mode (multipliers, Bessel values)."""
    return 8.0 * n_modes + 64.0 * ((n_modes - 1) // 3 + 1)


def _log_modulus(r):
    r""":math:`\log|r|`, accurate where :math:`|r|` is close to 1 (small steps): computed as
    :math:`\tfrac12 \operatorname{log1p}((\operatorname{Re} r - 1)(\operatorname{Re} r + 1) +
    (\operatorname{Im} r)^2)`, exact for explicit Euler's :math:`R(iy) = 1 + iy`; ``-inf`` at 0."""
    r = np.asarray(r, dtype=np.complex128)
    with np.errstate(divide="ignore"):
        return 0.5 * np.log1p(np.maximum((r.real - 1.0) * (r.real + 1.0) + r.imag * r.imag, -1.0))
