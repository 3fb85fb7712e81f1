r"""Gradients of a loss on :math:`u(T)`: autograd of the discrete solve, and the continuous adjoint.

For a pre-norm model :math:`u' = \sum_k f_k(u)` on :math:`[0, T]` (parameters constant on each
layer) and a loss :math:`J(N(u(T)))` (:math:`N` the final normalization), the gradient with
respect to the initial state is :math:`\lambda(0)`, where the adjoint state solves

.. math::

    -\lambda'(t) = \Big(\sum_k \frac{\partial f_k}{\partial u}(u(t))\Big)^{\!T} \lambda(t), \qquad
    \lambda(T) = \Big(\frac{\partial N}{\partial u}(u(T))\Big)^{\!T} \nabla J .

Two routes give it (:func:`gradient`):

* ``route="autograd"`` (discretize, then optimize): torch's autograd differentiates the
  discrete solve; this is the exact gradient of the discrete map.
* ``route="adjoint"`` (optimize, then discretize): the adjoint equation is integrated backward
  in depth *with the same scheme*, together with the state, as the time-reversed split
  problem on :math:`z = (u, \lambda)` with sub-flows
  :math:`g_k(z) = \big(-f_k(u),\ (\partial f_k / \partial u)^T \lambda\big)` in reverse order.
  Memory is :math:`O(1)` in the number of steps (no tape); each vector-Jacobian product is one
  local autograd call.

The two differ by the discretization error of the backward solve, :math:`O(\Delta t^p)` with
:math:`p` the scheme's order; they do not coincide exactly for any of the library's schemes
(the discrete adjoint of an explicit method evaluates the Jacobians at the start of each step,
the backward solve at its end).
"""
from __future__ import annotations

from typing import Callable

from . import solvers

__all__ = ["gradient"]


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is the test extra
        raise ImportError("ctformer.adjoint needs torch: pip install 'ctformer[test]' (or torch)") from None
    return torch


def _vjp(torch, f: Callable, u, cotangent):
    """:math:`(\\partial f / \\partial u)^T` ``cotangent`` at ``u`` (one local autograd call)."""
    with torch.enable_grad():
        x = u.detach().requires_grad_(True)
        (out,) = torch.autograd.grad(f(x), x, grad_outputs=cotangent)
    return out


def _backward_problem(torch, problem: solvers.SplitProblem) -> solvers.SplitProblem:
    """The time-reversed augmented problem on z = stack(u, lambda), sub-flows in reverse order."""

    def reversed_flow(f):
        def g(z):
            u, lam = z[0], z[1]
            return torch.stack([-f(u).detach(), _vjp(torch, f, u, lam)])

        return g

    return solvers.SplitProblem([reversed_flow(f) for f in reversed(problem.flows)])


def gradient(model, u0, loss: Callable, *, tokens, features, head_features=None, hidden=None,
             scheme="euler", steps_per_layer: int = 1, route: str = "adjoint"):
    r"""The gradient of ``loss(u(T))`` with respect to the initial state ``u0``.

    Parameters
    ----------
    model : ContinuousTransformer
        A model without projections after sub-steps (pre-norm or no normalization).
    u0 : torch.Tensor
        Stored values on the grids, float64 (any device).
    loss : callable
        ``loss(u_T) -> scalar tensor``, differentiable by torch.
    tokens, features, head_features, hidden : Discretization
        As in :meth:`ContinuousTransformer.solve`.
    scheme : str
        Any name of :func:`ctformer.solvers.available`.
    steps_per_layer : int
        Steps per layer.
    route : {"adjoint", "autograd"}
        Optimize-then-discretize (backward adjoint solve) or discretize-then-optimize.

    Returns
    -------
    torch.Tensor
        :math:`\partial J / \partial u_0`, the shape of ``u0``.

    Raises
    ------
    TypeError
        If ``u0`` is not a torch tensor.
    ValueError
        For an unknown ``route``, or a post-norm model (its projections have no adjoint flow).
    """
    torch = _torch()
    if not isinstance(u0, torch.Tensor):
        raise TypeError(f"u0 must be a torch tensor for gradients, got {type(u0).__name__}")
    if route not in ("adjoint", "autograd"):
        raise ValueError(f"route must be 'adjoint' or 'autograd', got {route!r}")
    kw = dict(tokens=tokens, features=features, head_features=head_features, hidden=hidden,
              scheme=scheme, steps_per_layer=steps_per_layer)
    if route == "autograd":
        x = u0.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(model.solve(x, **kw)), x)
        return grad

    grids = model.grids(tokens, features, head_features, hidden)
    problems = [block.split_problem(grids) for block in model.blocks]
    if any(p.has_projections for p in problems):
        raise ValueError("route='adjoint' needs a model without projections after sub-steps "
                         "(pre-norm or no normalization); use route='autograd' for post-norm")
    integrator = solvers.get(scheme)
    grids.validate(u0, "u0")
    with torch.no_grad():   # the forward solve keeps no tape: only u(T) is needed
        u_t = solvers.integrate(integrator, problems, u0.detach(), steps_per_layer)
    final = model.final_normalization
    final = grids.lift(final.discretize(grids)) if final is not None else (lambda v: v)
    with torch.enable_grad():
        x = u_t.detach().requires_grad_(True)
        (lam,) = torch.autograd.grad(loss(final(x)), x)
    z = torch.stack([u_t.detach(), lam])
    dt = 1.0 / steps_per_layer
    for problem in reversed(problems):
        backward = _backward_problem(torch, problem)
        for _ in range(steps_per_layer):
            z = integrator.step(backward, z, dt)
    return z[1]
