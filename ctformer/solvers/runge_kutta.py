r"""Explicit Runge-Kutta methods as data: a Butcher tableau and its order.

An explicit :math:`s`-stage method for :math:`u' = F(u)` with tableau
:math:`(a_{ij})_{j < i}`, weights :math:`b_i` advances a step :math:`h` by

.. math::

    k_i = F\Big(u + h \sum_{j < i} a_{ij} k_j\Big), \qquad
    u \leftarrow u + h \sum_i b_i k_i .

The library has one of each method: :data:`EULER_TABLEAU` (order 1), :data:`HEUN_TABLEAU`
(order 2) and :data:`RK4_TABLEAU` (the classical method, order 4), and the embedded pairs with
dense output of :mod:`ctformer.solvers.tableaus` (``bosh3``, ``dopri5``, ``tsit5``). They serve
as the sub-step method of the splitting schemes (``substep=``) and, on the unsplit right-hand
side :math:`F = \sum_k f_k`, as the schemes of the same names.

A tableau may carry an embedded solution (``b_error``, ``error_order``), be first-same-as-last
(``fsal``) and carry its continuous extension (``dense``, ``dense_order``); see
:class:`ButcherTableau`. Each field is validated when the tableau is made.

A new explicit method is one tableau and one call: :func:`register_tableau` adds it to
:data:`TABLEAUS` (so every splitting scheme accepts it as ``substep=``) and registers the
scheme that applies it to the unsplit right-hand side (so :func:`ctformer.solvers.get` and
:func:`ctformer.solvers.available` list it, with the tableau's order)::

    RALSTON_TABLEAU = register_tableau(ButcherTableau(
        "ralston", a=((), (2 / 3,)), b=(1 / 4, 3 / 4), order=2.0))
"""
from __future__ import annotations

from typing import ClassVar

from .base import Scheme, SplitProblem, available, check_dt, register
from .butcher import (TABLEAUS, ButcherTableau, _check_dense, _check_error, _check_fsal,  # noqa: F401
                      _check_shape, _close, _floats, _paired)
from .combination import _IN_PLACE_MIN, _SUMMING, _combine, summing  # noqa: F401

__all__ = ["ButcherTableau", "EULER_TABLEAU", "HEUN_TABLEAU", "RK4_TABLEAU", "TABLEAUS",
           "register_tableau", "RungeKutta", "Euler", "Heun", "RK4", "summing"]


class RungeKutta(Scheme):
    r"""A Runge-Kutta method on the full right-hand side :math:`F(u) = \sum_k f_k(u)`, then the
    projections in order:

    .. math::  u \leftarrow P\big(\Phi^{\Delta t}_F(u)\big).

    Order: the tableau's on pre-norm problems whose parameters are constant over each step (a
    converted network: steps never straddle a layer boundary when ``steps_per_layer`` is an
    integer); 1 with projections that are not the identity (:meth:`Scheme.order`).

    For a first-same-as-last tableau (``tableau.fsal``) on a problem without projections, the
    last stage :math:`F(u_{\text{new}})` of a step is the first stage of the next step from
    :math:`u_{\text{new}}`: stepping on with the same problem (a layer) and the returned state
    costs :math:`s - 1` evaluations of :math:`F` per step instead of :math:`s`. The scheme keeps
    that one stage; a different problem (the next layer, whose parameters differ) or another
    state starts afresh.
    """

    tableau: ClassVar[ButcherTableau]

    def __init__(self):
        self._last = None  # (problem, u_new, F(u_new)) of the last FSAL step

    @property
    def nominal_order(self) -> float:
        """The tableau's order."""
        return self.tableau.order

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        last, self._last = self._last, None
        first = last[2] if last is not None and last[0] is problem and last[1] is u else None
        u_new, ks = self.tableau.advance(problem.rhs, u, dt, first=first)
        if self.tableau.fsal and not problem.has_projections:
            self._last = (problem, u_new, ks[-1])
        return problem.project_all(u_new)


def register_tableau(tableau: ButcherTableau, scheme: type | None = None) -> ButcherTableau:
    """Make ``tableau`` a sub-step method and a scheme of the same name.

    Parameters
    ----------
    tableau : ButcherTableau
        Added to :data:`TABLEAUS` under ``tableau.name``.
    scheme : subclass of RungeKutta, optional
        The scheme class registered for ``tableau.name`` (its ``tableau`` is set); default a
        new :class:`RungeKutta` subclass named after the tableau.

    Returns
    -------
    ButcherTableau
        ``tableau`` itself.

    Raises
    ------
    TypeError
        If ``tableau`` is not a :class:`ButcherTableau`.
    ValueError
        If a tableau or a scheme of that name is registered already.
    """
    if not isinstance(tableau, ButcherTableau):
        raise TypeError(f"tableau must be a ButcherTableau, got {type(tableau).__name__}")
    if tableau.name in TABLEAUS:
        raise ValueError(f"a tableau named {tableau.name!r} is registered already; choose another "
                         "name")
    if tableau.name in available():  # a splitting scheme's name: get() would give this method
        raise ValueError(f"tableau name {tableau.name!r} is the name of a registered scheme "
                         f"({', '.join(available())}); choose another name")
    if scheme is None:
        scheme = type(tableau.name.capitalize(), (RungeKutta,),
                      {"__doc__": f"The Runge-Kutta method {tableau.name!r} on the full right-hand "
                                  f"side. Order {tableau.order:g}.", "__module__": __name__})
    scheme.name, scheme.tableau = tableau.name, tableau
    TABLEAUS[tableau.name] = tableau
    register(scheme)
    return tableau


class Euler(RungeKutta):
    r"""Explicit Euler on the full right-hand side, :math:`u \leftarrow P(u + \Delta t \sum_k f_k(u))`.

    With ``dt = 1`` on a pre-norm model this is the *parallel* block of GPT-J and PaLM
    (attention and FFN read the same input). Order 1.
    """


class Heun(RungeKutta):
    r"""Heun's method (explicit trapezoid) on the full right-hand side. Order 2."""


class RK4(RungeKutta):
    r"""The classical four-stage Runge-Kutta method on the full right-hand side. Order 4.

    .. math::

        k_1 = F(u),\; k_2 = F(u + \tfrac{\Delta t}{2} k_1),\;
        k_3 = F(u + \tfrac{\Delta t}{2} k_2),\; k_4 = F(u + \Delta t\, k_3),

        u \leftarrow P\Big(u + \tfrac{\Delta t}{6}(k_1 + 2 k_2 + 2 k_3 + k_4)\Big).
    """


EULER_TABLEAU = register_tableau(ButcherTableau("euler", a=((),), b=(1.0,), order=1.0), Euler)
HEUN_TABLEAU = register_tableau(ButcherTableau("heun", a=((), (1.0,)), b=(0.5, 0.5), order=2.0), Heun)
RK4_TABLEAU = register_tableau(ButcherTableau(
    "rk4", a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0), order=4.0), RK4)


def __getattr__(name):
    if name in ("EULER", "HEUN"):  # 0.2 named the tableaus as tableaus
        raise AttributeError(f"ctformer.solvers.runge_kutta.{name} was renamed {name}_TABLEAU in 0.2 "
                             f"(RK4 is the scheme class; its tableau is RK4_TABLEAU)")
    raise AttributeError(f"module 'ctformer.solvers.runge_kutta' has no attribute {name!r}")
