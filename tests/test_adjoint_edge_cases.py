"""ctformer.adjoint.gradient at its edges: the adjoint route's error-controlled forward solve is
the one of solve/evolve (same norm, same steps), a loss that does not depend on u(T) or is
complex is refused by name, and a batch member the loss ignores gets exactly zero gradient.
References: ContinuousTransformer.solve itself, and central finite differences in float64."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer

# the grids, the start and the torch / gradient fixtures of the input tests
from .test_adjoint_inputs import FEATURES, GRIDS, TOKENS, _start, gradient, torch  # noqa: F401

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("scheme", ["strang", "tsit5"])
def test_adjoint_route_with_rtol_solves_forward_as_solve_does(torch, gradient, scheme):
    # before: the forward solve used uniform weights in the controller's norm, not evolve's
    # grid weights, so its u(T) differed from solve(rtol=...) by 5.9e-6 (strang, rtol=1e-3)
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    seen = []

    def loss(u):
        seen.append(u.detach().numpy().copy())
        return (u ** 3).sum()

    tol = dict(rtol=1e-3, atol=1e-6)
    gradient(model, _start(), loss, scheme=scheme, route="adjoint", **tol, **GRIDS)
    reference = model.solve(_start(), scheme=scheme, **tol, **GRIDS)
    assert np.abs(seen[0] - reference).max() < 1e-13


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
def test_a_loss_without_u_is_refused_by_name(torch, gradient, route):
    # before: RuntimeError (autograd) / TypeError "expected Tensor ... got NoneType" (adjoint)
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    weight = torch.ones(2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="loss returned a tensor that does not depend on its argument"):
        gradient(model, _start(), lambda u: (weight ** 2).sum(), route=route, **GRIDS)
    with pytest.raises(ValueError, match="loss must return a real scalar, got dtype torch.complex128"):
        gradient(model, _start(), lambda u: (u ** 2).sum() * (1 + 1j), route=route, **GRIDS)


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
def test_an_ignored_batch_member_has_zero_gradient_and_the_other_matches_differences(
        torch, gradient, route):
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    kw = dict(scheme="rk4", steps_per_layer=4)
    batch = np.stack([_start(), 0.5 * _start()])
    grad = gradient(model, batch, lambda u: (u[0] ** 3).sum(), route=route, **kw, **GRIDS)
    assert np.array_equal(grad[1], np.zeros_like(grad[1]))
    h, index = 1e-6, (0, 1, 2)
    up, down = batch.copy(), batch.copy()
    up[index] += h
    down[index] -= h
    difference = (np.sum(model.solve(up, **kw, **GRIDS)[0] ** 3)
                  - np.sum(model.solve(down, **kw, **GRIDS)[0] ** 3)) / (2 * h)
    # the adjoint route differs from the discrete gradient by O(dt^4) (rk4, 4 steps: ~1e-9)
    assert abs(grad[index] - difference) < 1e-6 * abs(difference)
