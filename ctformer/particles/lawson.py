r"""The noise of the spectral mean fields, exactly: Lawson Runge-Kutta steps.

The Galerkin coefficients of a noisy mean field (zonal on :math:`S^{d-1}`, or on :math:`S^2`)
solve :math:`\dot c = F(c) - \Lambda c`, with :math:`F` the transport and
:math:`\Lambda = \operatorname{diag}(\nu\, l(l+d-2))` the noise. A Runge-Kutta tableau
:math:`(a_{ij}, b_i, c_i)` applied to :math:`v = e^{\Lambda\tau} c` (the integrating factor)
and written back in :math:`c` gives the Lawson method

.. math::

    U_i = e^{-c_i h\Lambda} c_n + h \sum_{j<i} a_{ij}\, e^{-(c_i - c_j) h\Lambda} F(U_j), \qquad
    c_{n+1} = e^{-h\Lambda} c_n + h \sum_i b_i\, e^{-(1 - c_i) h\Lambda} F(U_i),

with the embedded error :math:`h \sum_i e_i\, e^{-(1 - c_i) h\Lambda} F(U_i)` of a pair. Its
order is the tableau's, each diffusing mode decays by exactly :math:`e^{-\nu l(l+d-2) h}`, and
for a tableau whose nodes do not decrease where it couples stages (:math:`a_{ij} \ne 0
\Rightarrow c_j \le c_i`, and :math:`c_i \le 1`: every tableau of the library) every factor is
a decaying exponential, so no step overflows: the noise does not bound the step. Written in
:math:`v` instead, a stage carries :math:`e^{c_j h\Lambda} F` and overflows float64 once
:math:`\nu L(L+d-2) h > 709`.

Inside a step (``SaveAt(times=...)``, events, dense output) the state at :math:`t_n + \theta h`
is the Lawson step of size :math:`\theta h` from :math:`c_n`: a continuous extension of the
tableau's order with the same decaying factors (the saved states, ``Solution.evaluate``, and
the events, with fixed steps too; a cubic Hermite in :math:`c` with the slopes
:math:`F(c) - \Lambda c` would overshoot once :math:`\nu l(l+d-2) h \gg 1`). The splitting
schemes step the integrating-factor form; inside their steps the state is
:func:`exponential_hermite` of the step's ends.

The state is the coefficients followed by a zero (the clock of the integrating-factor form of
:meth:`problem`, which saved solves carry).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from .. import solvers
from ..solvers.runge_kutta import RungeKutta

__all__ = ["LawsonTableau", "NoiseClock", "lawson_scheme", "noisy_problem", "exact_noise",
           "exponential_hermite"]


def exact_noise(scheme) -> bool:
    """Whether ``scheme`` (a name or a Scheme) takes the noise exactly by Lawson steps (no step bound)."""
    tableau = getattr(solvers.get(scheme), "tableau", None)
    if not isinstance(solvers.get(scheme), RungeKutta) or tableau is None:
        return False
    c = tableau.c
    coupled = all(c[j] <= c[i] for i, row in enumerate(tableau.a) for j, a in enumerate(row) if a != 0)
    return coupled and max(c) <= 1.0


def _phi(z):
    r""":math:`\varphi_k(z) = \int_0^1 e^{-z(1-\sigma)}\sigma^{k-1}/(k-1)!\,d\sigma`, k = 1, 2, 3, for z >= 0.

    Below 1 by their series :math:`\sum_j (-z)^j/(j+k)!` (the recurrence
    :math:`\varphi_{k+1} = (1/k! - \varphi_k)/z` cancels there), above by the recurrence.
    """
    z = np.asarray(z, dtype=np.float64)
    small = z < 1.0
    zs = np.where(small, z, 0.0)
    series = []
    for k in (1, 2, 3):
        term, total = np.full_like(z, 1.0 / math.factorial(k)), np.zeros_like(z)
        for j in range(24):
            total = total + term
            term = term * (-zs) / (j + k + 1)
        series.append(total)
    zl = np.where(small, 1.0, z)
    p1 = -np.expm1(-zl) / zl
    p2 = (1.0 - p1) / zl
    p3 = (0.5 - p2) / zl
    return tuple(np.where(small, s, p) for s, p in zip(series, (p1, p2, p3)))


def exponential_hermite(c0, c1, f0, f1, lap, h: float, theta: float):
    r"""The state at :math:`t_0 + \theta h` of :math:`\dot c = F - \Lambda c` from a step's ends.

    With :math:`G(s) = F_0 + \alpha\sigma + \beta\sigma^2`, :math:`\sigma = s/h`, in place of
    the transport :math:`F(c(s))`, variation of constants gives

    .. math::

        c(\theta h) = e^{-\theta h\Lambda} c_0 + h\bigl(\theta\varphi_1 F_0 + \alpha\theta^2\varphi_2
        + 2\beta\theta^3\varphi_3\bigr)(\theta h\Lambda),

    with :math:`\alpha + \beta = F_1 - F_0` (:math:`G(h) = F_1`) and
    :math:`\alpha\varphi_2 + 2\beta\varphi_3 = (c_1 - e^{-h\Lambda}c_0)/h - \varphi_1 F_0`
    at :math:`h\Lambda` (:math:`c(h) = c_1`); :math:`2\varphi_3 - \varphi_2 < 0`, so both are
    determined. It matches :math:`c` and :math:`\dot c` at both ends (a cubic Hermite's order
    where :math:`h\Lambda` is small), is the heat semigroup where :math:`F = 0`, and every
    factor decays: an error :math:`\epsilon` of :math:`c_1` enters at most
    :math:`\approx \epsilon\max(1, h\Lambda/4)`.
    """
    lap = np.asarray(lap, dtype=np.float64)
    p1, p2, p3 = _phi(lap * h)
    beta = ((c1 - np.exp(-lap * h) * c0) / h - p1 * f0 - (f1 - f0) * p2) / (2.0 * p3 - p2)
    alpha = (f1 - f0) - beta
    q1, q2, q3 = _phi(lap * (theta * h))
    return np.exp(-lap * (theta * h)) * c0 + h * (theta * q1 * f0 + alpha * theta ** 2 * q2
                                                   + 2.0 * beta * theta ** 3 * q3)


class _Slope(np.ndarray):
    r"""The split problem's slope :math:`(F(c) - \Lambda c, 0)`, carrying the transport :math:`F(c)` (``raw``)."""

    raw = None


def _slope(transport, lap, u):
    c = u[:-1]
    raw = transport(c)
    out = np.concatenate([raw - lap * c, [0.0]]).astype(u.dtype, copy=False).view(_Slope)
    out.raw = raw
    return out


class LawsonTableau:
    r"""A Butcher tableau applied in Lawson form to :math:`\dot c = F(c) - \Lambda c` (module notes).

    Parameters
    ----------
    base : ButcherTableau
        The Runge-Kutta method; its order, pair, nodes and name are kept.
    transport : callable
        :math:`F`, coefficients to coefficients.
    diffusion : numpy.ndarray
        The diagonal of :math:`\Lambda`, one entry per coefficient.

    The stages are the split problem's slopes (:func:`noisy_problem`, which the loop counts and
    whose first-same-as-last stage it hands back); the steps combine the transports they carry.
    """

    def __init__(self, base, transport, diffusion):
        self.base, self.transport, self.lap = base, transport, np.asarray(diffusion)

    def __getattr__(self, name):  # order, b_error, error_order, fsal, dense, c, name, stages ...
        if name == "base":  # not yet set (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)

    def _combine(self, c0, h: float, node: float, weights, ks):
        r""":math:`e^{-\text{node}\,h\Lambda} c_0 + h \sum_j w_j e^{-(\text{node} - c_j) h\Lambda} F(U_j)`."""
        out = np.exp(-self.lap * (node * h)) * c0
        for w, k, c_j in zip(weights, ks, self.base.c):
            if w != 0:
                out = out + (h * w) * (np.exp(-self.lap * ((node - c_j) * h)) * k.raw)
        return out

    def _evaluate(self, f, u):
        """The slope at ``u`` by ``f`` (the loop's counted right-hand side) where it carries the transport."""
        k = None if f is None else f(u)
        return k if getattr(k, "raw", None) is not None else _slope(self.transport, self.lap, u)

    def advance(self, f, u, h: float, first=None):
        """One Lawson step: ``(u_new, ks)``, ``ks`` the slopes at the stages (carrying their transports)."""
        u = np.asarray(u)
        c0, base = u[:-1], self.base
        ks = [] if first is None else [first if getattr(first, "raw", None) is not None
                                       else self._evaluate(None, u)]
        state = u
        for i in range(len(ks), base.stages):
            if i:
                values = self._combine(c0, h, base.c[i], base.a[i], ks)
                state = np.concatenate([values, [0.0]]).astype(u.dtype, copy=False)
            ks.append(self._evaluate(f, state))
        if base.fsal:  # the last stage's state is the new one (a_s = b, c_s = 1)
            return state, ks
        return np.concatenate([self._combine(c0, h, 1.0, base.b, ks), [0.0]]).astype(u.dtype, copy=False), ks

    def step(self, f, u, h: float):
        """One Lawson step of size ``h``."""
        return self.advance(f, u, h)[0]

    def error_estimate(self, ks, h: float):
        r"""The pair's error at the step's end, :math:`h\sum_i e_i e^{-(1 - c_i) h\Lambda} F(U_i)`."""
        error = self._combine(0.0 * ks[0].raw, h, 1.0, self.base.error_weights, ks)
        return np.concatenate([error, [0.0]])

    def interpolate(self, u, ks, h: float, theta):
        r"""The state at :math:`\theta h`: the Lawson step of that size from ``u`` (its first stage
        reused when ``ks``, the step's stages, are given)."""
        if theta == 0:
            return u
        return np.asarray(self.advance(None, u, theta * h, first=None if ks is None else ks[0])[0])


def noisy_problem(field) -> solvers.SplitProblem:
    r"""The split problem :math:`\dot c = F(c) - \Lambda c` (and a still clock) of a noisy field.

    Its slopes carry the transport :math:`F(c)`, which :class:`LawsonTableau` combines.
    """
    return solvers.SplitProblem(flows=(lambda u: _slope(field.transport, field._diffusion, u),))


def lawson_scheme(field, scheme):
    """``(scheme, problem)`` to step ``field``: Lawson steps where :func:`exact_noise`, else ``field.problem()``.

    The Lawson scheme is a copy of ``scheme`` (same class, name and label, so restarts and
    records match) whose tableau is a :class:`LawsonTableau` of the field.
    """
    scheme = solvers.get(scheme)
    if not field.noise or not exact_noise(scheme):
        return scheme, field.problem()
    lawson = copy.copy(scheme)
    lawson.__dict__["tableau"] = LawsonTableau(type(scheme).tableau, field.transport, field._diffusion)
    lawson._last = None
    return lawson, noisy_problem(field)


class NoiseClock:
    r"""States of the noisy (integrating-factor) mean field between step ends, as coefficients.

    The loop's state is :math:`(v, \tau)`, :math:`c = e^{-\nu\Lambda\tau} v`, reset to
    :math:`(c, 0)` after every step; an interpolant inside a step (``SaveAt(times=...)``, dense
    output, events) is one of :math:`(v, \tau)`. A dense Runge-Kutta interpolant from the
    step's stages is one of that smooth flow, and :math:`e^{-\nu\Lambda\tau} v` is the
    coefficients. Otherwise (the splitting schemes) the state of a degree with
    :math:`\nu l(l+d-2) h > 1` is :func:`exponential_hermite` of the step's ends and transports:
    the cubic Hermite in the frame :math:`v` (:math:`v_0 = c_0`, :math:`v_1 = e^{\nu\Lambda h} c_1`,
    slopes :math:`F(c_0)`, :math:`e^{\nu\Lambda h} F(c_1)`, mapped back by
    :math:`e^{-\nu\Lambda\theta h}`), kept for the other degrees, carries
    :math:`e^{\nu\Lambda(1-\theta)h}` times the end state's error back into the step.
    With Lawson steps (``lawson``, a :class:`~ctformer.particles.lawson.LawsonTableau`) the
    state is :math:`(c, 0)` throughout and the state inside a step is the Lawson step there.
    """

    def __init__(self, diffusion, lawson=None):
        self.lap, self.lawson = diffusion, lawson

    def reset(self, u):
        r""":math:`(v, \tau) \to (e^{-\nu\Lambda\tau} v, 0)`, for one state or a stack of them."""
        u = np.asarray(u)
        out = np.array(u)
        out[..., :-1] = np.exp(-self.lap * u[..., -1:].real) * u[..., :-1]
        out[..., -1] = 0.0
        return out

    def condition(self, condition):
        return lambda t, u: condition(t, self.reset(u))

    def record(self, record):
        """``record`` (a step of the loop) as one whose states inside the step are :meth:`interpolate`'s."""
        return _ClockRecord(record, self)

    def interpolate(self, record, t, count=None):
        """The coefficients (and a zero clock) at ``t`` inside the accepted step ``record``."""
        theta = min(1.0, max(0.0, (t - record.t0) / record.h))
        if self.lawson is not None:
            return record(t, count) if theta in (0.0, 1.0) else \
                self.lawson.interpolate(record.u0, record.ks, record.h, theta)
        tableau = record.tableau
        if theta in (0.0, 1.0) or (record.ks is not None and tableau is not None
                                    and tableau.dense is not None):
            return self.reset(record(t, count))
        if record.slopes is None:
            record.slopes = (record.problem.rhs(record.u0), record.problem.rhs(record.u1))
            if count is not None:
                count(2)
        u0, u1 = self.reset(record.u0), self.reset(record.u1)
        # at tau = 0 the slope of (v, tau) is (F(c), 1): the transports
        f0, f1 = np.asarray(record.slopes[0])[:-1], np.asarray(record.slopes[1])[:-1]
        h, c0, c1 = record.h, u0[:-1], u1[:-1]
        c = exponential_hermite(c0, c1, f0, f1, self.lap, h, theta)
        # where nu l(l+d-2) h <= 1 the cubic through e^{Lambda tau} c (the integrating factor's
        # frame) scales c_1's error by at most e, and is exact where e^{Lambda tau} F is a cubic
        # (a mode relaxing at its own rate): kept there
        mild = self.lap * h <= 1.0
        grow = np.exp(np.where(mild, self.lap * h, 0.0))
        v = solvers.solution.hermite(c0, grow * c1, f0, grow * f1, h, theta)
        c = np.where(mild, np.exp(-self.lap * (theta * h)) * v, c)
        return np.concatenate([c, [0.0]]).astype(u0.dtype)

    def output(self, solution, asked):
        r"""``solution`` with coefficients in place of :math:`(v, \tau)` wherever it interpolated."""
        solution.records = [_ClockRecord(r, self) for r in solution.records]
        states = None if solution.states is None else self.reset(solution.states)
        if asked is not None and asked.times is not None and solution.records:
            wanted = np.asarray(asked.times, dtype=np.float64)
            for i, t in enumerate(np.asarray(solution.times)):
                if np.any(wanted == t):
                    states[i] = solution.evaluate(float(t))
            if not asked.dense:
                solution.records = []
        solution.states = states
        if solution.final is not None:
            solution.final = self.reset(solution.final)
        if solution.event_state is not None:
            solution.event_state = self.reset(solution.event_state)
        if solution.y_events is not None:
            solution.y_events = tuple(self.reset(y) for y in solution.y_events)
        return solution


class _ClockRecord:
    """A step record (``t0``, ``h``) whose interpolant gives coefficients (:class:`NoiseClock`)."""

    def __init__(self, record, clock: NoiseClock):
        self.record, self.clock, self.t0, self.h = record, clock, record.t0, record.h

    def __call__(self, t, count=None):
        return self.clock.interpolate(self.record, t, count)

    def settle(self, count=None) -> None:
        """The wrapped record's slopes, which :meth:`NoiseClock.interpolate` reads."""
        self.record.settle(count)
