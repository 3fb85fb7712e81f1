r"""Operator-splitting schemes (Tai, Liu, Li, Chan 2025; DESIGN.md section 4)."""
from __future__ import annotations

from .base import Scheme, SplitProblem, register

__all__ = ["Lie"]


@register
class Lie(Scheme):
    r"""Sequential (Lie-Trotter) splitting with explicit Euler sub-steps.

    .. math::  u \leftarrow P_k\big(u + \Delta t\, f_k(u)\big), \quad k = 1, \dots, K,

    where :math:`P_k` is the projection after sub-step :math:`k` (identity for pre-norm).
    With ``dt = 1`` this is exactly one Transformer block (DESIGN.md section 2). Order 1.
    """

    name = "lie"
    order = 1.0

    def step(self, problem: SplitProblem, u, dt: float):
        for k, f in enumerate(problem.flows):
            u = problem.project(k, u + dt * f(u))
        return u
