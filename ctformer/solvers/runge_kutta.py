r"""Explicit Runge-Kutta methods as data: a Butcher tableau and its order.

An explicit :math:`s`-stage method for :math:`u' = F(u)` with tableau
:math:`(a_{ij})_{j < i}`, weights :math:`b_i` advances a step :math:`h` by

.. math::

    k_i = F\Big(u + h \sum_{j < i} a_{ij} k_j\Big), \qquad
    u \leftarrow u + h \sum_i b_i k_i .

The library has one of each method: :data:`EULER_TABLEAU` (order 1), :data:`HEUN_TABLEAU`
(order 2) and :data:`RK4_TABLEAU` (the classical method, order 4). They serve as the sub-step
method of the splitting schemes (``substep=``) and, on the unsplit right-hand side
:math:`F = \sum_k f_k`, as the schemes ``euler``, ``heun`` and ``rk4``.

A new explicit method is one tableau and one call: :func:`register_tableau` adds it to
:data:`TABLEAUS` (so every splitting scheme accepts it as ``substep=``) and registers the
scheme that applies it to the unsplit right-hand side (so :func:`ctformer.solvers.get` and
:func:`ctformer.solvers.available` list it, with the tableau's order)::

    RALSTON_TABLEAU = register_tableau(ButcherTableau(
        "ralston", a=((), (2 / 3,)), b=(1 / 4, 3 / 4), order=2.0))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

from .base import Scheme, SplitProblem, check_dt, register

__all__ = ["ButcherTableau", "EULER_TABLEAU", "HEUN_TABLEAU", "RK4_TABLEAU", "TABLEAUS",
           "register_tableau", "RungeKutta", "Euler", "Heun", "RK4"]


@dataclass(frozen=True)
class ButcherTableau:
    r"""An explicit Runge-Kutta method: strictly lower-triangular ``a``, weights ``b``, ``order``.

    Parameters
    ----------
    name : str
    a : tuple of tuples
        ``a[i]`` holds :math:`a_{i0}, \dots, a_{i,i-1}` (``a[0] = ()``).
    b : tuple of float
        One weight per stage; they sum to 1.
    order : float
        The classical order of the method.
    """

    name: str
    a: tuple
    b: tuple
    order: float

    def __post_init__(self):
        if len(self.a) != len(self.b) or any(len(row) != i for i, row in enumerate(self.a)):
            raise ValueError(f"tableau {self.name!r}: a must be strictly lower triangular with one "
                             "row per weight")
        if abs(sum(self.b) - 1.0) > 1e-14:
            raise ValueError(f"tableau {self.name!r}: the weights b must sum to 1")

    @property
    def stages(self) -> int:
        return len(self.b)

    def step(self, f: Callable, u, h: float):
        """One step of size ``h`` for :math:`u' = f(u)`."""
        ks = []
        for row in self.a:
            stage = u
            for a_ij, k in zip(row, ks):
                if a_ij:
                    stage = stage + (h * a_ij) * k
            ks.append(f(stage))
        out = u
        for b_i, k in zip(self.b, ks):
            if b_i:
                out = out + (h * b_i) * k
        return out


#: The tableaus by name: the sub-step methods of the splitting schemes.
TABLEAUS: dict[str, ButcherTableau] = {}


class RungeKutta(Scheme):
    r"""A Runge-Kutta method on the full right-hand side :math:`F(u) = \sum_k f_k(u)`, then the
    projections in order:

    .. math::  u \leftarrow P\big(\Phi^{\Delta t}_F(u)\big).

    Order: the tableau's on pre-norm problems whose parameters are constant over each step (a
    converted network: steps never straddle a layer boundary when ``steps_per_layer`` is an
    integer); 1 with projections that are not the identity (:meth:`Scheme.order`).
    """

    tableau: ClassVar[ButcherTableau]

    @property
    def nominal_order(self) -> float:
        """The tableau's order."""
        return self.tableau.order

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        return problem.project_all(self.tableau.step(problem.rhs, u, dt))


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
        If a tableau of that name is registered already.
    """
    if not isinstance(tableau, ButcherTableau):
        raise TypeError(f"tableau must be a ButcherTableau, got {type(tableau).__name__}")
    if tableau.name in TABLEAUS:
        raise ValueError(f"a tableau named {tableau.name!r} is registered already; choose another "
                         "name")
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
