r"""Runge-Kutta schemes on the unsplit right-hand side :math:`F(u) = \sum_k f_k(u)`."""
from __future__ import annotations

from .base import Scheme, SplitProblem, register
from .splitting import check_dt
from .substeps import advance

__all__ = ["Euler", "RK4"]


@register
class Euler(Scheme):
    r"""Explicit Euler on the full right-hand side, then the projections in order.

    .. math::  u \leftarrow P\big(u + \Delta t \textstyle\sum_k f_k(u)\big).

    With ``dt = 1`` on a pre-norm model this is the *parallel* block of GPT-J and PaLM
    (attention and FFN read the same input). Order 1.
    """

    name = "euler"
    order = 1.0

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        return problem.project_all(u + dt * problem.rhs(u))


@register
class RK4(Scheme):
    r"""The classical four-stage Runge-Kutta method on the full right-hand side.

    .. math::

        k_1 = F(u),\; k_2 = F(u + \tfrac{\Delta t}{2} k_1),\;
        k_3 = F(u + \tfrac{\Delta t}{2} k_2),\; k_4 = F(u + \Delta t\, k_3),

        u \leftarrow P\Big(u + \tfrac{\Delta t}{6}(k_1 + 2 k_2 + 2 k_3 + k_4)\Big),

    with :math:`P` the projections in order (identity for pre-norm). Order 4 on pre-norm
    models whose parameters are constant over each step (a converted network: steps never
    straddle a layer boundary when ``steps_per_layer`` is an integer); order 1 with
    projections.
    """

    name = "rk4"
    order = 4.0

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        return problem.project_all(advance("rk4", problem.rhs, u, dt))
