r"""One attempted step with its local error estimate: embedded pairs and step doubling.

Embedded pair (a :class:`~ctformer.solvers.runge_kutta.ButcherTableau` with ``b_error``):
:math:`u_{n+1} = u_n + h \sum_i b_i k_i`, error :math:`e = h \sum_i (b_i - \hat b_i) k_i`, of
order :math:`\hat p` (``error_order``): the local error of the embedded solution is
:math:`O(h^{\hat p + 1})`. The higher-order solution is propagated (local extrapolation, as
every 5(4) code does); a retraction (the sphere's) acts on the propagated value after the
step, and the estimate is formed before it. A first-same-as-last pair reuses its last stage
as the next first stage only without projections. A pair is used so only where its order
holds: where the projections lower the scheme's order on the problem (a post-norm model:
``scheme.order(model) = 1`` is passed as ``order``), the projection's own
:math:`O(h^2)` local error is invisible to the pair's estimate, which would then stay near
:math:`h^{\hat p + 1}` while the error is :math:`O(h)`, and the pair is controlled by step
doubling with that order instead.

Step doubling, for any scheme of order :math:`p` (``lie``, ``strang``, ``parallel``,
``euler``, ``heun``, ``rk4``): one step of size :math:`h` gives :math:`u_h`, two of size
:math:`h/2` give :math:`u_{h/2,h/2}`, and Richardson's estimate of the error of the finer value
is

.. math::  e = \frac{u_{h/2,h/2} - u_h}{2^p - 1}.

The finer value is propagated, without extrapolation (adding :math:`e` would raise the order by
one but leave no error estimate for the value propagated). The controller receives the error
per unit step, :math:`e / h` (of order :math:`h^p`): controlling the local error itself would
make the global error scale like :math:`\mathrm{tol}^{p/(p+1)}` (0.5 for Lie splitting), while
per unit step it is proportional to the tolerance, as it is for the embedded pairs, whose
propagated solution is one order above their estimate. Cost: three steps of the scheme per
attempted step, 1.5 times the two half steps that produce the propagated value.
"""
from __future__ import annotations

from .runge_kutta import RungeKutta

__all__ = ["PairStepper", "DoublingStepper", "stepper_for"]


class PairStepper:
    """Attempted steps of an embedded pair, reusing the first stage (FSAL and after rejections)."""

    def __init__(self, scheme: RungeKutta):
        self.scheme = scheme
        self.tableau = scheme.tableau
        self.order = float(self.tableau.error_order)

    def attempt(self, problem, u, h: float, first=None):
        """``(u_new, error, ks, first_of_next)``: ``first_of_next`` is :math:`F(u_{new})` (FSAL) or None."""
        raw, ks = self.tableau.advance(problem.rhs, u, h, first=first)
        error = self.tableau.error_estimate(ks, h)
        u_new = problem.project_all(raw)
        # not after a projection, a retraction included: reusing F(raw u_new) there would cost
        # no order and save one evaluation (measured: dopri5 on particles 1.16 -> 1.04 times
        # RK45's), but a restart from the saved, retracted state could not reproduce its bits
        fsal = ks[-1] if self.tableau.fsal and not problem.has_projections else None
        return u_new, error, ks, fsal


class DoublingStepper:
    """Attempted steps of any scheme with the step-doubling (Richardson) estimate."""

    tableau = None

    def __init__(self, scheme, order: float):
        self.scheme = scheme
        self.scheme_order = float(order)
        self.order = self.scheme_order - 1.0  # of the error per unit step, e / h = O(h^p)
        self._factor = 1.0 / (2.0 ** self.scheme_order - 1.0)

    def attempt(self, problem, u, h: float, first=None):
        """``(u_fine, e / h, None, None)``: the finer value and the error per unit step."""
        coarse = self.scheme.step(problem, u, h)
        half = 0.5 * h
        fine = self.scheme.step(problem, self.scheme.step(problem, u, half), half)
        return fine, (fine - coarse) * (self._factor / abs(h)), None, None


def stepper_for(scheme, order: float | None = None):
    r"""The embedded pair when ``scheme`` is one of its order on the problem, else step doubling.

    Parameters
    ----------
    scheme : Scheme
    order : float, optional
        The scheme's order :math:`p` on the problem; default ``scheme.order()`` (the nominal
        order). A model passes ``scheme.order(model)``, which is 1 on a post-norm model.

    Returns
    -------
    PairStepper or DoublingStepper
        A :class:`PairStepper` for an embedded pair whose tableau order is :math:`p`; step
        doubling with :math:`p` otherwise, an embedded pair included when :math:`p` is below
        its tableau's order (its estimate :math:`O(h^{\hat p + 1})` would not see the
        projection's :math:`O(h^2)` local error, and the achieved error would exceed the
        tolerance by orders of magnitude).
    """
    tableau = getattr(scheme, "tableau", None)
    order = scheme.order() if order is None else float(order)
    if (isinstance(scheme, RungeKutta) and tableau is not None and tableau.b_error is not None
            and order >= tableau.order):
        return PairStepper(scheme)
    return DoublingStepper(scheme, order)
