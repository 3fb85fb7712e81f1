r"""Step-size control in depth: a PI controller and the starting step.

A step of size :math:`h` with error estimate :math:`e` is accepted when its scaled norm
:math:`\varepsilon_n = \|e\| \le 1` (:mod:`ctformer.solvers.norms`). The next step size is

.. math::

    h_{new} = h \cdot \min\Bigl(f_{max}, \max\bigl(f_{min},\;
        \theta\, \varepsilon_n^{-\beta_1}\, \varepsilon_{n-1}^{\beta_2}\bigr)\Bigr),
    \qquad \beta_1 = \frac{c_I + c_P}{k}, \quad \beta_2 = \frac{c_P}{k}, \quad k = q + 1,

with :math:`q` the order of the error estimate (the local error is :math:`O(h^{q+1})`),
:math:`\theta` the safety factor, :math:`c_P, c_I` the proportional and integral
coefficients (diffrax's ``pcoeff``/``icoeff``) and :math:`\varepsilon_{n-1}` the error of the
previous accepted step. The defaults :math:`c_P = 0.4, c_I = 0.3` give
:math:`\beta_1 = 0.7/k, \beta_2 = 0.4/k`, Gustafsson's PI controller as recommended in Hairer
and Wanner, *Solving ODEs II*, section IV.2, equation (2.43c); :math:`c_P = 0, c_I = 1` is the
elementary controller :math:`h \theta \varepsilon^{-1/k}` of Hairer, Norsett and Wanner,
*Solving ODEs I*, section II.4, equation (4.13). After a rejection the step shrinks by the
elementary factor (never grows), and the step after a rejection does not grow either
(:math:`f_{max} = 1` there, HNW II.4). On a smooth problem the PI rule settles at
:math:`\varepsilon = \theta^{1/(\beta_1 - \beta_2)} = \theta^{k/c_I}` (0.50 for
:math:`k = 2`) against :math:`\theta^k` for the elementary rule (0.81): more steps at a
given tolerance, a correspondingly smaller error, fewer rejections.

The starting step is HNW I, II.4, "Starting step size" (also ``scipy.integrate.solve_ivp``'s).
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, replace
from typing import Callable

from .. import validation
from .norms import rms, weighted_rms

__all__ = ["PIController", "ControllerState"]

#: Floor on the previous error in the PI term (HNW's DOPRI5 code: ``facold = max(err, 1e-4)``).
ERR_PREV_FLOOR = 1e-4


class _DefaultReal(float):
    """A keyword's default tolerance: equal to the plain number and shown as it
    (``rtol=1e-06`` in a signature), but told apart from a value the caller passed by identity
    (:func:`is_default`), so that an explicit ``rtol=1e-6`` beside fixed steps is refused."""


class _DefaultCount(int):
    """A keyword's default count (``max_steps``), told apart by identity as :class:`_DefaultReal`."""


#: The defaults of ``evolve``'s ``rtol``, ``atol`` and ``max_steps`` (PIController's values).
DEFAULT_RTOL, DEFAULT_ATOL, DEFAULT_MAX_STEPS = _DefaultReal(1e-6), _DefaultReal(1e-9), _DefaultCount(100_000)
#: The default of ``solve``'s and ``gradient``'s ``steps_per_layer`` (one step a layer).
DEFAULT_STEPS_PER_LAYER = _DefaultCount(1)


def is_default(value) -> bool:
    """Whether ``value`` is one of the default objects above, not a value a caller passed
    (arithmetic, ``float()`` and ``int()`` on them give plain numbers)."""
    return any(value is default for default in (DEFAULT_RTOL, DEFAULT_ATOL, DEFAULT_MAX_STEPS,
                                                 DEFAULT_STEPS_PER_LAYER))


@dataclass(frozen=True)
class ControllerState:
    """What the controller remembers between steps (a frozen value: updates return a new one).

    Attributes
    ----------
    err_prev : float
        Scaled error of the last accepted step (1 before the first: the PI term is then 1).
    rejected_last : bool
        Whether the last step was rejected (the next proposal may not grow).
    accepted, rejected : int
        Counts of accepted and rejected steps so far.
    """

    err_prev: float = 1.0
    rejected_last: bool = False
    accepted: int = 0
    rejected: int = 0


@dataclass(frozen=True)
class PIController:
    r"""Error control of a depth integration: tolerances, the PI step rule and the first step.

    Parameters
    ----------
    rtol, atol : float
        Relative and absolute tolerance, non-negative, not both zero. Defaults
        :math:`10^{-6}` and :math:`10^{-9}`.
    pcoeff, icoeff : float
        Proportional and integral coefficients :math:`c_P, c_I` (module docstring). Defaults
        0.4 and 0.3 (:math:`\beta_1 = 0.7/k`, :math:`\beta_2 = 0.4/k`, HW IV.2 (2.43c));
        ``pcoeff=0, icoeff=1`` is the elementary (I) controller. ``pcoeff + icoeff > 0``.
    safety : float
        Safety factor :math:`\theta \in (0, 1]`, default 0.9 (HNW II.4).
    factor_min, factor_max : float
        Bounds :math:`0 < f_{min} < 1 < f_{max}` on the step ratio :math:`h_{new}/h`,
        defaults 0.2 and 10 (scipy's and HNW's DOPRI5 code).
    dt0 : float, optional
        The first step; default ``None``: chosen by :meth:`initial_step`.
    dt_min : float, optional
        The smallest step the loop takes before it gives up; default ``None``:
        :math:`10^{-14}` times the length of the integration interval (:meth:`min_step`).
    max_steps : int
        Most steps (accepted and rejected) of one solve, default 100000.
    norm : {"l2", "rms"}
        ``"l2"`` (default): the grids' quadrature-weighted RMS, a discrete
        :math:`L^2(X \times Y)` norm (:func:`~ctformer.solvers.norms.weighted_rms`); ``"rms"``:
        all weights 1, as scipy, diffrax and torchdiffeq (for comparison).

    Raises
    ------
    TypeError, ValueError
        Naming the argument: a tolerance negative or NaN, both zero, inconsistent factor
        bounds, ``max_steps`` not a positive integer, a non-positive ``dt0``/``dt_min``.
    """

    rtol: float = 1e-6
    atol: float = 1e-9
    _: KW_ONLY
    pcoeff: float = 0.4
    icoeff: float = 0.3
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0
    dt0: float | None = None
    dt_min: float | None = None
    max_steps: int = 100_000
    norm: str = "l2"

    def __post_init__(self):
        fields = {"rtol": validation.real(self.rtol, "rtol", nonnegative=True),
                  "atol": validation.real(self.atol, "atol", nonnegative=True),
                  "pcoeff": validation.real(self.pcoeff, "pcoeff"),
                  "icoeff": validation.real(self.icoeff, "icoeff"),
                  "safety": validation.real(self.safety, "safety", positive=True),
                  "factor_min": validation.real(self.factor_min, "factor_min", positive=True),
                  "factor_max": validation.real(self.factor_max, "factor_max", positive=True),
                  "max_steps": validation.integer(self.max_steps, "max_steps"),
                  "norm": validation.one_of(self.norm, "norm", ("l2", "rms"))}
        for name in ("dt0", "dt_min"):
            value = getattr(self, name)
            fields[name] = None if value is None else validation.real(value, name, positive=True)
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        self._check_consistency()

    def _check_consistency(self):
        if self.rtol == 0 and self.atol == 0:
            raise ValueError("rtol and atol are both zero: no error is small enough; give atol > 0 "
                             "(an absolute floor) or rtol > 0")
        if self.pcoeff + self.icoeff <= 0:
            raise ValueError(f"pcoeff + icoeff must be positive (beta1 = (pcoeff + icoeff)/k is "
                             f"the exponent of the current error), got pcoeff={self.pcoeff!r}, "
                             f"icoeff={self.icoeff!r}")
        if self.safety > 1:
            raise ValueError(f"safety must be in (0, 1], got {self.safety!r}")
        if not self.factor_min < 1 < self.factor_max:
            raise ValueError(f"factor_min and factor_max must satisfy 0 < factor_min < 1 < "
                             f"factor_max, got factor_min={self.factor_min!r}, "
                             f"factor_max={self.factor_max!r}")
        if self.dt0 is not None and self.dt_min is not None and self.dt0 < self.dt_min:
            raise ValueError(f"dt0 = {self.dt0!r} is below dt_min = {self.dt_min!r}; raise dt0 "
                             f"or lower dt_min")

    # -- the norm --------------------------------------------------------------------------
    def error_norm(self, e, u, u_new, weights=None) -> float:
        r"""The scaled norm of ``e`` with this controller's tolerances and ``norm``.

        ``weights`` (token and feature weights, :func:`~ctformer.solvers.norms.grid_weights`)
        are used by ``norm="l2"`` and ignored by ``norm="rms"``; ``None`` is uniform.
        """
        if self.norm == "rms":
            return rms(e, u, u_new, self.rtol, self.atol)
        return weighted_rms(e, u, u_new, self.rtol, self.atol, weights)

    def accept(self, err_norm: float) -> bool:
        r"""Whether a step with scaled error ``err_norm`` is accepted: :math:`\|e\| \le 1`."""
        return bool(err_norm <= 1.0)

    def min_step(self, span: float) -> float:
        """The smallest admissible step on an interval of length ``span``."""
        return self.dt_min if self.dt_min is not None else 1e-14 * abs(float(span))

    # -- step sizes ------------------------------------------------------------------------
    def propose(self, h: float, err_norm: float, err_prev: float, order, *,
                after_rejection: bool = False) -> float:
        r"""The next step size after a step of size ``h`` with scaled error ``err_norm``.

        Parameters
        ----------
        h : float
            The step just taken (signed: a backward solve has ``h < 0``).
        err_norm : float
            Its scaled error :math:`\varepsilon_n`.
        err_prev : float
            The previous accepted step's error :math:`\varepsilon_{n-1}` (floored at
            ``1e-4``, as in HNW's DOPRI5 code).
        order : float
            The order :math:`q` of the error estimate; :math:`k = q + 1`.
        after_rejection : bool
            The step before was rejected: the ratio is capped at 1.

        Returns
        -------
        float
            Accepted (:math:`\varepsilon_n \le 1`): :math:`h` times the PI factor, clipped to
            ``[factor_min, factor_max]`` (``factor_max = 1`` after a rejection). Rejected:
            :math:`h \max(f_{min}, \min(1, \theta \varepsilon_n^{-1/k}))`. A non-finite error
            gives :math:`f_{min} h`; a zero error :math:`f_{max} h`.
        """
        k = validation.real(order, "order", nonnegative=True) + 1.0
        top = 1.0 if after_rejection else self.factor_max
        if not math.isfinite(err_norm):
            return h * self.factor_min
        if err_norm > 1.0:
            factor = min(1.0, self.safety * err_norm ** (-1.0 / k))
        elif err_norm == 0.0:
            factor = top
        else:
            beta1, beta2 = (self.icoeff + self.pcoeff) / k, self.pcoeff / k
            factor = (self.safety * err_norm ** (-beta1)
                      * max(err_prev, ERR_PREV_FLOOR) ** beta2)
        return h * min(top, max(self.factor_min, factor))

    def update(self, state: ControllerState, h: float, err_norm: float,
               order) -> tuple[bool, float, ControllerState]:
        """Decide a step: ``(accepted, next h, new state)`` (the state is not modified)."""
        accepted = self.accept(err_norm)
        h_new = self.propose(h, err_norm, state.err_prev, order,
                             after_rejection=state.rejected_last)
        if accepted:
            new = replace(state, err_prev=float(err_norm), rejected_last=False,
                          accepted=state.accepted + 1)
        else:
            new = replace(state, rejected_last=True, rejected=state.rejected + 1)
        return accepted, h_new, new

    def initial_step(self, rhs: Callable, t0: float, u0, order, norm: Callable | None = None, *,
                     t_end: float | None = None, f0=None) -> float:
        r"""The starting step of HNW I, section II.4 (``dt0`` when it is set).

        With :math:`\|\cdot\|` the scaled norm at :math:`u_0` (scale
        :math:`\mathrm{atol} + \mathrm{rtol}|u_0|`):

        1. :math:`d_0 = \|u_0\|`, :math:`d_1 = \|f(t_0, u_0)\|`;
        2. :math:`h_0 = 0.01\, d_0 / d_1`, or :math:`10^{-6}` if :math:`d_0` or :math:`d_1`
           is below :math:`10^{-5}`;
        3. one explicit Euler step :math:`u_1 = u_0 + h_0 f_0`, :math:`f_1 = f(t_0 + h_0, u_1)`;
        4. :math:`d_2 = \|f_1 - f_0\| / h_0`;
        5. :math:`h_1 = (0.01 / \max(d_1, d_2))^{1/(q+1)}`, or :math:`\max(10^{-6},
           10^{-3} h_0)` if both are below :math:`10^{-15}` or either is not finite (a zero
           scale where the state moves, ``atol = 0``; then also :math:`h_0 = 10^{-6}`);
        6. :math:`h = \min(100 h_0, h_1)` (and at most :math:`|t_{end} - t_0|`).

        Parameters
        ----------
        rhs : callable
            ``rhs(t, u)``, the right-hand side.
        t0 : float
        u0 : array
        order : float
            Order :math:`q` of the error estimate (scipy's ``error_estimator_order``).
        norm : callable, optional
            ``norm(x, u, u_new) -> float``, a scaled norm; default :meth:`error_norm` with
            uniform weights (pass ``functools.partial(controller.error_norm,
            weights=grid_weights(grids))`` for the grids' norm).
        t_end : float, optional
            The end of the interval: the step points towards it and does not pass it.
        f0 : array, optional
            ``rhs(t0, u0)`` if already known (saves one evaluation).

        Returns
        -------
        float
            The step magnitude (positive). Costs one evaluation of ``rhs``, two without ``f0``,
            none when ``dt0`` is set.

        Raises
        ------
        ValueError
            If ``t0`` or ``t_end`` is not finite, or ``t_end = t0`` (an empty interval has no
            step to choose).
        """
        q = validation.real(order, "order", nonnegative=True)
        span = math.inf if t_end is None else _span(t0, t_end)
        if self.dt0 is not None:
            return min(self.dt0, span)
        direction = -1.0 if t_end is not None and t_end < t0 else 1.0
        norm = self.error_norm if norm is None else norm
        f0 = rhs(t0, u0) if f0 is None else f0
        d0, d1 = norm(u0, u0, u0), norm(f0, u0, u0)
        # d1 or d2 not finite: a zero scale where the state moves (atol = 0), or a NaN state
        h0 = 0.01 * d0 / d1 if d0 >= 1e-5 and 1e-5 <= d1 < math.inf else 1e-6
        h0 = min(h0, span)
        f1 = rhs(t0 + direction * h0, u0 + (direction * h0) * f0)
        d2 = norm(f1 - f0, u0, u0) / h0
        if not (math.isfinite(d1) and math.isfinite(d2)) or max(d1, d2) <= 1e-15:
            h1 = max(1e-6, 1e-3 * h0)
        else:
            h1 = (0.01 / max(d1, d2)) ** (1.0 / (q + 1.0))
        return min(100.0 * h0, h1, span)


def _span(t0, t_end) -> float:
    """``|t_end - t0|``, refusing an empty or non-finite interval (its step would be 0 or NaN)."""
    t0, t_end = validation.real(t0, "t0"), validation.real(t_end, "t_end")
    if t_end == t0:
        raise ValueError(f"t_end = t0 = {t0!r}: the interval is empty and has no starting step; "
                         f"give t_end != t0, or skip the solve")
    return abs(t_end - t0)
