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
the coefficients evolve by the classical explicit RK4. The :math:`k = 0` coefficient has zero
time derivative exactly, so the mass is conserved up to rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import array_api_compat
import numpy as np
from scipy import special

from ..backend import backend_of, get_backend
from .dynamics import time_steps

__all__ = ["CircleMeanField", "MeanFieldSolution", "linear_growth_rate"]

_USA_BETA_MAX = 700.0


def linear_growth_rate(k, beta, normalized=True):
    r"""Growth rate of the mode :math:`\cos(k\theta)` of the linearization about the uniform density.

    .. math::

        \lambda_k = \frac{k^2 I_k(\beta)}{\beta I_0(\beta)} \;\text{(SA)}, \qquad
        \lambda_k = \frac{k^2 I_k(\beta)}{\beta} \;\text{(USA, mass one)}.

    Parameters
    ----------
    k : int or array of int
        Wavenumbers (>= 0).
    beta : float
        Inverse temperature, finite and nonzero.
    normalized : bool
        SA (True) or USA (False).

    Returns
    -------
    float or numpy.ndarray
    """
    beta = float(beta)
    if not math.isfinite(beta) or beta == 0:
        raise ValueError(f"beta must be finite and nonzero, got {beta}")
    k = np.asarray(k)
    # k I_k / beta = (I_{k-1} - I_{k+1}) / 2 avoids dividing by a small beta.
    half_diff = 0.5 * (special.ive(k - 1, beta) - special.ive(k + 1, beta))
    if normalized:
        return k * half_diff / special.ive(0, beta)
    return k * half_diff * math.exp(abs(beta))


@dataclass
class MeanFieldSolution:
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
    """

    times: np.ndarray
    grid: np.ndarray
    density: object
    coefficients: object
    tracers: object = None

    @property
    def mass(self):
        r"""Total mass :math:`\frac{2\pi}{N}\sum_j \rho(\theta_j)` per saved time."""
        xp = array_api_compat.array_namespace(self.density)
        return (2 * math.pi / self.grid.shape[0]) * xp.sum(self.density, axis=-1)


class CircleMeanField:
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
        For a non-integer ``n_modes``.

    Notes
    -----
    The SA velocity is bounded by one, so an advective CFL condition
    :math:`\Delta t \, K \lesssim 2.8` keeps RK4 stable while the density is resolved.
    """

    def __init__(self, beta, n_modes, normalized=True, backend=None):
        if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
            raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
        if not math.isfinite(float(beta)):
            raise ValueError(f"beta must be finite, got {beta!r}")
        self.beta = float(beta)
        self.normalized = bool(normalized)
        if not self.normalized and abs(self.beta) > _USA_BETA_MAX:
            raise ValueError(
                f"USA (normalized=False) needs |beta| <= {_USA_BETA_MAX}: its velocity carries the factor "
                f"exp(|beta|) = exp({abs(self.beta)}), beyond the float64 range"
            )
        if isinstance(n_modes, bool) or not isinstance(n_modes, (int, np.integer)):
            raise TypeError(f"n_modes must be an integer, got {n_modes!r}")
        if n_modes < 4:
            raise ValueError(
                f"n_modes must be >= 4: the 2/3 dealiasing rule keeps |k| <= (n_modes - 1) // 3, "
                f"which must be at least 1; got n_modes={n_modes}"
            )
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

    def _consts(self, backend):
        get = lambda key, a: backend.cached(self, key, lambda: a)  # noqa: E731
        return get("den", self._denominator), get("num", self._numerator), get("ik", self._derivative)

    def _fields(self, backend, c):
        """Density, numerator and denominator (or velocity) fields on the grid from coefficients."""
        fft, n = backend.fft, self.n_modes
        den, num, _ = self._consts(backend)
        rho = fft.irfft(c, n=n)
        numerator = fft.irfft(num * c, n=n)
        if self.normalized:
            return rho, numerator / fft.irfft(den * c, n=n)
        return rho, numerator

    def _rhs(self, backend, c):
        rho, velocity = self._fields(backend, c)
        _, _, ik = self._consts(backend)
        flux = backend.fft.rfft(rho * velocity)[: self.max_wavenumber + 1]
        return -ik * flux

    def _tracer_velocity(self, backend, c, theta):
        r"""X[rho](theta) at arbitrary angles by summing the Fourier series of N and D."""
        xp = backend.xp
        den, num, _ = self._consts(backend)
        k = xp.arange(self.max_wavenumber + 1, dtype=xp.float64)
        phase = xp.exp(1j * theta[:, None] * k[None, :])
        # real series from rfft coefficients: (1/N)(a_0 + 2 sum_{k>=1} Re(a_k e^{ik theta}))
        scale = xp.where(k == 0, 1.0, 2.0) / self.n_modes
        numerator = xp.real(phase @ (scale * num * c))
        if not self.normalized:
            return numerator
        return numerator / xp.real(phase @ (scale * den * c))

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
        backend, rho = self._density_values(rho)
        c = backend.fft.rfft(rho)[: self.max_wavenumber + 1]
        return self._fields(backend, c)[1]

    def _density_values(self, rho0):
        if callable(rho0):
            backend = get_backend(self._backend_name or "numpy")
            rho = backend.asarray(np.asarray(rho0(self.grid), dtype=np.float64))
        else:
            backend = get_backend(self._backend_name) if self._backend_name else backend_of(rho0)
            rho = backend.asarray(rho0, dtype=np.float64)
        if tuple(rho.shape) != (self.n_modes,):
            raise ValueError(f"rho0 must give {self.n_modes} values (one per grid angle), got shape {tuple(rho.shape)}")
        xp = backend.xp
        if not bool(xp.all(xp.isfinite(rho))):
            raise ValueError("rho0 has NaN or infinite values")
        if float(xp.min(rho)) < 0 or float(xp.sum(rho)) <= 0:
            raise ValueError("rho0 must be a nonnegative density with positive mass")
        return backend, rho

    def solve(self, rho0, t1, dt, save_every=1, tracers=None):
        r"""Evolve the density from :math:`t = 0` to ``t1`` by RK4.

        Parameters
        ----------
        rho0 : callable or array, shape (n_modes,)
            The initial density: a vectorized function of the angle, or its values at
            :attr:`grid`. It is projected on the retained modes :math:`|k| \le K`. Mass one
            matches particles with weights :math:`1/n` (the USA velocity is linear in the mass).
        t1 : float
            Final time, >= 0.
        dt : float
            Largest time step; the step used is ``t1 / ceil(t1 / dt)``.
        save_every : int
            Save every ``save_every``-th step (the final state is always saved).
        tracers : array, shape (m,), optional
            Initial angles moved along the characteristics :math:`\dot\theta = X[\rho_t](\theta)`
            in the same RK4 steps (the mean-field flow map).

        Returns
        -------
        MeanFieldSolution

        Raises
        ------
        ValueError
            For a negative, non-finite or wrongly sized ``rho0``, or bad ``t1``, ``dt``, ``save_every``.
        FloatingPointError
            If the solution becomes non-finite (under-resolved or unstable: reduce ``dt`` or
            raise ``n_modes``).
        """
        backend, rho = self._density_values(rho0)
        xp = backend.xp
        steps, h = time_steps(t1, dt, save_every)
        c = backend.fft.rfft(rho)[: self.max_wavenumber + 1]
        theta = None
        if tracers is not None:
            theta = backend.asarray(np.asarray(backend.asnumpy(tracers), dtype=np.float64).reshape(-1))

        def rhs(state):
            c, th = state
            dc = self._rhs(backend, c)
            return dc, (None if th is None else self._tracer_velocity(backend, c, th))

        def axpy(state, a, ds):
            return state[0] + a * ds[0], (None if state[1] is None else state[1] + a * ds[1])

        state = (c, theta)
        times, saved = [0.0], [state]
        for s in range(1, steps + 1):
            k1 = rhs(state)
            k2 = rhs(axpy(state, h / 2, k1))
            k3 = rhs(axpy(state, h / 2, k2))
            k4 = rhs(axpy(state, h, k3))
            incr = tuple(
                None if a is None else (a + 2 * b + 2 * cc + d) for a, b, cc, d in zip(k1, k2, k3, k4)
            )
            state = axpy(state, h / 6, incr)
            if s % save_every == 0 or s == steps:
                times.append(s * h)
                saved.append(state)
        coefficients = xp.stack([st[0] for st in saved], axis=0)
        if not bool(xp.all(xp.isfinite(xp.real(coefficients[-1])) & xp.isfinite(xp.imag(coefficients[-1])))):
            raise FloatingPointError("the mean-field solution became non-finite; reduce dt or raise n_modes")
        density = backend.fft.irfft(coefficients, n=self.n_modes, axis=-1)
        tracer_path = None if theta is None else xp.stack([st[1] for st in saved], axis=0)
        return MeanFieldSolution(
            times=np.asarray(times), grid=self.grid.copy(), density=density,
            coefficients=coefficients, tracers=tracer_path,
        )
