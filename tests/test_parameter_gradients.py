"""Parameters as inputs: ``with_parameters`` swaps in NumPy arrays or torch tensors, and
autograd then differentiates a solve with respect to every parameter."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer, Grids
from ctformer.studies import smooth_initial_state

from .conftest import require

GRIDS = dict(tokens=d.GaussLegendre(5), features=d.GaussLegendre(4), scheme="strang", steps_per_layer=2)


def _start():
    return Grids(d.GaussLegendre(5), d.GaussLegendre(4)).sample(smooth_initial_state)


def test_with_the_same_parameters_the_model_is_unchanged():
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    copy = model.with_parameters(model.parameters())
    np.testing.assert_array_equal(copy.solve(_start(), **GRIDS), model.solve(_start(), **GRIDS))
    changed = dict(model.parameters())
    name = "blocks.0.feedforward.W_1.coefficients"
    changed[name] = changed[name] * 1.5
    assert np.abs(model.with_parameters(changed).solve(_start(), **GRIDS)
                  - model.solve(_start(), **GRIDS)).max() > 1e-4
    assert np.array_equal(model.parameters()[name], copy.parameters()[name])   # original intact


@pytest.mark.torch
def test_torch_parameters_give_numpy_numbers_and_every_gradient():
    torch = require("torch")
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    params = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in model.parameters().items()}
    out = model.with_parameters(params).solve(torch.tensor(_start()), **GRIDS)
    np.testing.assert_allclose(out.detach().numpy(), model.solve(_start(), **GRIDS), rtol=1e-13, atol=1e-13)
    (out ** 2).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params.values())


@pytest.mark.torch
def test_gradcheck_with_respect_to_parameters():
    torch = require("torch")
    model = ContinuousTransformer.random_smooth(seed=5, layers=1)
    base = {k: torch.tensor(np.asarray(v)) for k, v in model.parameters().items()}
    names = ["blocks.0.attention.W_Q.0.coefficients", "blocks.0.feedforward.b_2.amplitude",
             "blocks.0.normalization1.gain.phase"]
    u0 = torch.tensor(Grids(d.Midpoint(3), d.Midpoint(3)).sample(smooth_initial_state))

    def solve(*values):
        params = dict(base, **dict(zip(names, values)))
        return model.with_parameters(params).solve(u0, tokens=d.Midpoint(3), features=d.Midpoint(3),
                                                   scheme="rk4", steps_per_layer=2)

    inputs = tuple(base[n].clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(solve, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.torch
def test_parameter_gradients_of_a_converted_encoder_equal_torch_autograd():
    torch = require("torch")
    from ctformer.bridges import from_torch

    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    enc = torch.nn.TransformerEncoder(layer, 1, norm=torch.nn.LayerNorm(8),
                                      enable_nested_tensor=False).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    weights = torch.randn(2, 5, 8, dtype=torch.float64)
    (enc(x) * weights).sum().backward()
    model = from_torch(enc)
    params = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in model.parameters().items()}
    (model.with_parameters(params).run(x) * weights).sum().backward()
    torch_layer = enc.layers[0]
    pairs = [("blocks.0.feedforward.W_1.weight", torch_layer.linear1.weight),
             ("blocks.0.feedforward.b_2", torch_layer.linear2.bias),
             ("blocks.0.normalization1.gain", torch_layer.norm1.weight),
             ("final_normalization.shift", enc.norm.bias)]
    for name, reference in pairs:
        err = (params[name].grad - reference.grad).abs().max() / reference.grad.abs().max()
        assert float(err) < 1e-12, name
    q_rows = torch.cat([params[f"blocks.0.attention.W_Q.{h}.weight"].grad for h in range(2)])
    reference = torch_layer.self_attn.in_proj_weight.grad[:8]
    assert float((q_rows - reference).abs().max() / reference.abs().max()) < 1e-12


@pytest.mark.torch
def test_in_place_updates_are_seen_and_mixing_is_refused():
    torch = require("torch")
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    params = {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in model.parameters().items()}
    with_torch = model.with_parameters(params)
    first = with_torch.solve(torch.tensor(_start()), **GRIDS).detach()
    name = "blocks.0.feedforward.W_2.coefficients"
    with torch.no_grad():
        params[name] += 0.1          # an optimizer step
    second = with_torch.solve(torch.tensor(_start()), **GRIDS).detach()
    host = {k: v.detach().numpy() for k, v in params.items()}
    np.testing.assert_allclose(second.numpy(), model.with_parameters(host).solve(_start(), **GRIDS),
                               rtol=1e-13, atol=1e-13)
    assert float((second - first).abs().max()) > 1e-4
    with pytest.raises(TypeError, match="numpy.ndarray.*torch.Tensor"):
        with_torch.solve(_start(), **GRIDS)


def test_with_parameters_bad_input():
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    params = dict(model.parameters())
    with pytest.raises(KeyError, match="missing"):
        model.with_parameters({k: v for k, v in params.items() if "W_1" not in k})
    with pytest.raises(KeyError, match="unknown .*blocks.9"):
        model.with_parameters({**params, "blocks.9.attention.W_Q.0.weight": np.ones(3)})
    name = "blocks.0.feedforward.W_1.coefficients"
    with pytest.raises(ValueError, match="shape"):
        model.with_parameters({**params, name: np.ones((2, 2))})
