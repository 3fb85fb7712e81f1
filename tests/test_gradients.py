"""Gradients: gradcheck of every operator and scheme, checkpointing, and the continuous adjoint
against autograd of the discrete solve (their difference falls at the scheme's order)."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer, Grids
from ctformer.kernels import SmoothRandom
from ctformer.operators import (Attention, FeedForward, GatedFeedForward, LayerNormProjection,
                                RMSNorm)
from ctformer.studies import smooth_initial_state

from .conftest import fitted_order, require, solve_and_saved_bytes

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def torch():
    return require("torch")


OPERATORS = {
    "attention": lambda: Attention([SmoothRandom(1)], [SmoothRandom(2)], [SmoothRandom(3)],
                                   [SmoothRandom(4)], b_O=0.1, beta=2.0),
    "attention-causal": lambda: Attention([SmoothRandom(1)], [SmoothRandom(2)], [SmoothRandom(3)],
                                          [SmoothRandom(4)], beta=2.0, mask="causal"),
    "feedforward": lambda: FeedForward(SmoothRandom(5), SmoothRandom(6), b_1=0.1),
    "gated": lambda: GatedFeedForward(SmoothRandom(5), SmoothRandom(6), SmoothRandom(7)),
    "layernorm": lambda: LayerNormProjection(gain=1.5, shift=0.2),
    "rmsnorm": lambda: RMSNorm(gain=0.7, eps=1e-3),
}


@pytest.mark.parametrize("name", OPERATORS)
def test_gradcheck_of_every_operator(torch, name, rng):
    grids = Grids(d.GaussLegendre(4), d.Midpoint(3), d.GaussLegendre(2), d.Midpoint(4))
    op = OPERATORS[name]()
    u = torch.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: op.discretize(grids)(v), (u,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("scheme", ["euler", "lie", "strang", "parallel", "heun", "rk4"])
def test_gradcheck_of_every_scheme(torch, scheme):
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    start = Grids(d.Midpoint(3), d.Midpoint(3)).sample(smooth_initial_state)
    u0 = torch.tensor(start, requires_grad=True)

    def solve(u):
        return model.solve(u, tokens=d.Midpoint(3), features=d.Midpoint(3), scheme=scheme,
                           steps_per_layer=2)

    assert torch.autograd.gradcheck(solve, (u0,), eps=1e-6, atol=1e-7)


def test_checkpointing_keeps_one_state_per_layer(torch):
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    grids = dict(tokens=d.GaussLegendre(8), features=d.GaussLegendre(6), scheme="euler",
                 steps_per_layer=64)
    start = Grids(d.GaussLegendre(8), d.GaussLegendre(6)).sample(smooth_initial_state)
    grads, saved = {}, {}
    for checkpoint in (False, True):
        u0 = torch.tensor(start, requires_grad=True)
        out, saved[checkpoint] = solve_and_saved_bytes(
            lambda: model.solve(u0, checkpoint=checkpoint, **grids))
        (out ** 2).sum().backward()
        grads[checkpoint] = u0.grad
    np.testing.assert_allclose(grads[True].numpy(), grads[False].numpy(), rtol=1e-13, atol=1e-14)
    assert saved[True] * 100 < saved[False]          # O(layers) instead of O(layers x steps)
    with pytest.raises(TypeError, match="torch"):
        model.solve(start, checkpoint=True, **grids)


def route_differences(torch, scheme, steps, layers=2, sizes=(6, 5)):
    """max |autograd - adjoint| / max |autograd| of the gradient of a squared distance, one per
    number of steps a layer (smooth random model, Gauss-Legendre grids of ``sizes``)."""
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=layers)
    tokens, features = d.GaussLegendre(sizes[0]), d.GaussLegendre(sizes[1])
    u0 = torch.tensor(Grids(tokens, features).sample(smooth_initial_state))
    target = torch.tensor(np.random.default_rng(0).standard_normal(tuple(u0.shape)))

    def loss(u):
        return ((u - target) ** 2).sum()

    differences = []
    for k in steps:
        kw = dict(tokens=tokens, features=features, scheme=scheme, steps_per_layer=k)
        autograd = gradient(model, u0, loss, route="autograd", **kw)
        adjoint = gradient(model, u0, loss, route="adjoint", **kw)
        differences.append(float((autograd - adjoint).abs().max() / autograd.abs().max()))
    return differences


@pytest.mark.parametrize("scheme, order", [("euler", 1.0), ("lie", 1.0), ("strang", 2.0), ("rk4", 4.0)])
def test_adjoint_route_converges_to_autograd_at_the_scheme_order(torch, scheme, order):
    steps = [2, 4, 8, 16] if order < 4 else [1, 2, 4, 8]
    differences = route_differences(torch, scheme, steps)
    assert abs(fitted_order([1.0 / k for k in steps], differences) - order) < 0.35


def test_adjoint_bad_input(torch):
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=1, placement="post")
    u0 = torch.tensor(Grids(d.Midpoint(3), d.Midpoint(3)).sample(smooth_initial_state))
    kw = dict(tokens=d.Midpoint(3), features=d.Midpoint(3))
    with pytest.raises(ValueError, match="projections"):
        gradient(model, u0, lambda u: u.sum(), **kw)
    with pytest.raises(TypeError, match="u0 must be a real floating array"):  # NumPy is accepted
        gradient(model, "u0", lambda u: u.sum(), **kw)
    with pytest.raises(ValueError, match="route"):
        gradient(model, u0, lambda u: u.sum(), route="both", **kw)


@pytest.mark.parametrize("scheme, order", [("euler", 1.0), ("strang", 2.0), ("rk4", 4.0)])
def test_parameter_adjoint_converges_to_autograd_at_the_scheme_order(torch, scheme, order):
    """dJ/dtheta = int lambda . df/dtheta dt, accumulated in the backward solve."""
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    tokens, features = d.GaussLegendre(5), d.GaussLegendre(4)
    u0 = torch.tensor(Grids(tokens, features).sample(smooth_initial_state))

    def loss(u):
        return (u ** 3).sum()

    steps = [2, 4, 8]
    differences = []
    for k in steps:
        kw = dict(tokens=tokens, features=features, scheme=scheme, steps_per_layer=k, parameters=True)
        _, autograd = gradient(model, u0, loss, route="autograd", **kw)
        _, adjoint = gradient(model, u0, loss, route="adjoint", **kw)
        assert set(autograd) == set(model.parameters())
        scale = max(float(g.abs().max()) for g in autograd.values())
        differences.append(max(float((autograd[n] - adjoint[n]).abs().max()) for n in autograd) / scale)
    assert abs(fitted_order([1.0 / k for k in steps], differences) - order) < 0.35
