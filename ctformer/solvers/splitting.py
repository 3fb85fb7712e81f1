r"""Operator-splitting schemes (Tai, Liu, Li, Chan 2025; design notes, section 4).

Inside a layer the state obeys :math:`u' = \sum_{k=1}^{K} f_k(u)` with :math:`f_1` =
attention and :math:`f_2` = feed-forward. A splitting scheme advances the sub-flows one at a
time (sequential splitting: :class:`Lie`, :class:`Strang`) or side by side and averages
(additive splitting: :class:`Parallel`). Post-norm models project onto the constraint set
after every sub-step (``problem.project(k, .)``); for pre-norm models the projections are the
identity.

Orders on smooth pre-norm problems, with :math:`\varphi^{h}_k` the sub-step method applied
to :math:`f_k` with step :math:`h`:

- ``lie``: :math:`\varphi^{\Delta t}_K \circ \dots \circ \varphi^{\Delta t}_1`, order 1;
- ``strang``: :math:`\varphi^{\Delta t/2}_2 \circ \varphi^{\Delta t}_1 \circ
  \varphi^{\Delta t/2}_2`, order 2 (1 with Euler sub-steps);
- ``parallel``: :math:`\frac{1}{K}\sum_k \varphi^{K \Delta t}_k`, order 1.

With a projection that is not the identity (post-norm) the continuous limit is the projected
flow :math:`u' = P_{T_u S}\sum_k f_k(u)` on the constraint set :math:`S`; projecting after
sub-steps is a first-order approximation of it, and in general no better whatever the
sub-step method (the LayerNorm projection makes every scheme first order), so schemes are
first order on post-norm models, and convergent at all only when the projection is
idempotent. :meth:`Scheme.order` of a scheme on a problem says so: ``Strang().order()`` is 2,
``Strang().order(model)`` is 1 for a post-norm ``model``.
"""
from __future__ import annotations

from .base import Scheme, SplitProblem, check_dt, register
from .substeps import advance, check_substep, substep_order

__all__ = ["Lie", "Strang", "Parallel"]


class _SubstepScheme(Scheme):
    """A scheme that advances sub-flows with a selectable one-step method."""

    default_substep = "euler"

    def __init__(self, substep: str | None = None):
        self.substep = check_substep(self.default_substep if substep is None else substep)

    @property
    def label(self) -> str:
        """``"name (substep)"``, e.g. ``"strang (heun)"``."""
        return f"{self.name} ({self.substep})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(substep={self.substep!r})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.substep == other.substep

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.substep))


@register
class Lie(_SubstepScheme):
    r"""Sequential (Lie-Trotter) splitting, sub-flows in order, explicit Euler sub-steps by default.

    .. math::  u \leftarrow P_k\big(\varphi_k^{\Delta t}(u)\big), \quad k = 1, \dots, K,

    where :math:`P_k` is the projection after sub-step :math:`k` (identity for pre-norm) and
    :math:`\varphi_k^{\Delta t}(u) = u + \Delta t\, f_k(u)` for ``substep="euler"``.
    With ``dt = 1`` this is exactly one Transformer block (design notes, section 2). Order 1 with
    any sub-step method (the splitting error is first order).

    Parameters
    ----------
    substep : {"euler", "heun", "rk4", "bosh3", "dopri5", "tsit5"}, optional
        One-step method for each sub-flow; default ``"euler"``.
    """

    name = "lie"
    nominal_order = 1.0

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        for k, f in enumerate(problem.flows):
            u = problem.project(k, advance(self.substep, f, u, dt))
        return u


@register
class Strang(_SubstepScheme):
    r"""Symmetric (Strang-Marchuk) splitting in the Macaron order: half FFN, attention, half FFN.

    For two sub-flows (attention :math:`f_1`, feed-forward :math:`f_2`) one step is

    .. math::

        u \leftarrow P_2 \varphi_2^{\Delta t/2}\, P_1 \varphi_1^{\Delta t}\,
        P_2 \varphi_2^{\Delta t/2}(u),

    and for :math:`K` sub-flows the half steps of :math:`f_K, \dots, f_2` come before the full
    step of :math:`f_1` and are repeated in reverse order after it. The composition is
    symmetric, so the splitting error is second order; the scheme's order is
    :math:`\min(2, p)` with :math:`p` the order of the sub-step method (Heun by default).
    With ``substep="euler"`` and ``dt = 1`` it is the Macaron Transformer layout
    (first order).

    Parameters
    ----------
    substep : {"heun", "euler", "rk4", "bosh3", "dopri5", "tsit5"}, optional
        One-step method for each sub-flow; default ``"heun"``.
    """

    name = "strang"
    default_substep = "heun"

    @property
    def nominal_order(self) -> float:
        """:math:`\\min(2, p)`, :math:`p` the order of the sub-step method."""
        return min(2.0, substep_order(self.substep))

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        half = 0.5 * dt
        outer = range(len(problem.flows) - 1, 0, -1)
        for k in outer:
            u = problem.project(k, advance(self.substep, problem.flows[k], u, half))
        u = problem.project(0, advance(self.substep, problem.flows[0], u, dt))
        for k in reversed(outer):
            u = problem.project(k, advance(self.substep, problem.flows[k], u, half))
        return u


@register
class Parallel(_SubstepScheme):
    r"""Additive (parallel) splitting: the average of the sub-flows, each run with :math:`K \Delta t`.

    .. math::

        u \leftarrow P\Big(\frac{1}{K} \sum_{k=1}^{K} \varphi_k^{K \Delta t}(u)\Big),

    where :math:`P` applies the projections in order (identity for pre-norm), as in the
    additive operator splitting of Lu, Neittaanmaki and Tai cited by Tai et al. (2025). All
    sub-flows read the same input, so they can run concurrently. With explicit Euler sub-steps
    (the default) the average equals one explicit Euler step of the full right-hand side;
    with any sub-step method the splitting error makes the scheme first order.

    Parameters
    ----------
    substep : {"euler", "heun", "rk4", "bosh3", "dopri5", "tsit5"}, optional
        One-step method for each sub-flow; default ``"euler"``.
    """

    name = "parallel"
    nominal_order = 1.0

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        count = len(problem.flows)
        total = None
        for f in problem.flows:
            branch = advance(self.substep, f, u, count * dt)
            total = branch if total is None else total + branch
        return problem.project_all(total / count)
