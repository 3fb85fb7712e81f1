r"""Runge-Kutta schemes on the unsplit right-hand side :math:`\sum_k f_k(u)`."""
from __future__ import annotations

from .base import Scheme, SplitProblem, register

__all__ = ["Euler"]


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
        return problem.project_all(u + dt * problem.rhs(u))
