"""torch tensors as a third array namespace: a torch state computes in torch, stays torch, and
gives the NumPy numbers (float64, CPU) to rounding; autograd differentiates every solve."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer, Grids
from ctformer.kernels import Convolution, SmoothRandom
from ctformer.operators import (Attention, FeatureMap, FeedForward, GatedFeedForward,
                                LayerNormProjection, RMSNorm, SphereProjection)
from ctformer.studies import smooth_initial_state

from .conftest import require

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _attention(**kw):
    ks = [SmoothRandom(s) for s in range(8)]
    return Attention(ks[:2], ks[2:4], ks[4:6], ks[6:8], b_Q=[0.1, None], b_O=0.2, beta=3.0, **kw)


OPERATORS = {
    "attention": lambda: _attention(),
    "attention-causal-half": lambda: _attention(mask="causal", diagonal="half"),
    "feedforward-gelu": lambda: FeedForward(SmoothRandom(1), SmoothRandom(2), b_1=0.1, b_2=0.2),
    "feedforward-silu": lambda: FeedForward(SmoothRandom(1), SmoothRandom(2), activation="silu"),
    "gated": lambda: GatedFeedForward(SmoothRandom(1), SmoothRandom(2), SmoothRandom(3)),
    "feature-map-fft": lambda: FeatureMap(Convolution(lambda z: np.exp(np.cos(2 * np.pi * z))), bias=1.0),
    "layernorm": lambda: LayerNormProjection(gain=lambda y: 1 + 0.1 * y, shift=0.3, eps=1e-5),
    "rmsnorm": lambda: RMSNorm(gain=2.0, eps=1e-6),
    "sphere": lambda: SphereProjection(),
}


@pytest.mark.parametrize("name", OPERATORS)
def test_operators_in_torch_equal_numpy(torch, name, rng):
    grids = Grids(d.GaussLegendre(7), d.Midpoint(6), d.GaussLegendre(4), d.Midpoint(9))
    u = rng.standard_normal((2, 7, 6))
    op = OPERATORS[name]()
    expected = op(u, grids)
    got = op(torch.tensor(u), grids)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", d.available())
def test_every_discretization_solves_in_torch(torch, name):
    model = ContinuousTransformer.random_smooth(seed=2, layers=1)
    n = 9 if name in ("p1", "p2", "trapezoid", "chebyshev", "clenshaw-curtis") else 8
    tokens = d.get(name, n)
    kw = dict(tokens=tokens, features=d.GaussLegendre(6), scheme="strang", steps_per_layer=2)
    expected = model.solve(smooth_initial_state, **kw)
    start = Grids(tokens, d.GaussLegendre(6)).sample(smooth_initial_state)
    got = model.solve(torch.tensor(start), **kw)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("scheme", ["euler", "lie", "strang", "parallel", "heun", "rk4"])
def test_every_scheme_in_torch_and_autograd_gradient(torch, scheme):
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    grids = dict(tokens=d.GaussLegendre(5), features=d.GaussLegendre(4), scheme=scheme,
                 steps_per_layer=2)
    start = Grids(d.GaussLegendre(5), d.GaussLegendre(4)).sample(smooth_initial_state)
    expected = model.solve(start, **grids)
    u0 = torch.tensor(start, requires_grad=True)
    out = model.solve(u0, **grids)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-13, atol=1e-13)
    (out ** 2).sum().backward()
    assert u0.grad is not None and torch.isfinite(u0.grad).all()


def test_gradcheck_of_a_whole_solve(torch):
    model = ContinuousTransformer.random_smooth(seed=4, layers=1)
    start = Grids(d.Midpoint(4), d.Midpoint(3)).sample(smooth_initial_state)
    u0 = torch.tensor(start, requires_grad=True)

    def solve(u):
        return model.solve(u, tokens=d.Midpoint(4), features=d.Midpoint(3), scheme="rk4",
                           steps_per_layer=2)

    assert torch.autograd.gradcheck(solve, (u0,), eps=1e-6, atol=1e-7)


def test_gradient_of_the_discrete_limit_equals_torch_autograd(torch):
    """d/dx of the converted encoder equals torch's autograd of the module itself."""
    from ctformer.bridges import from_torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(8),
                                      enable_nested_tensor=False).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    weights = torch.randn(2, 5, 8, dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    (enc(x_ref) * weights).sum().backward()
    x_ours = x.clone().requires_grad_(True)
    ours = from_torch(enc).run(x_ours)
    np.testing.assert_allclose(ours.detach().numpy(), from_torch(enc).run(x.numpy()), rtol=1e-13, atol=1e-13)
    (ours * weights).sum().backward()
    err = (x_ours.grad - x_ref.grad).abs().max() / x_ref.grad.abs().max()
    assert float(err) < 1e-12


@pytest.mark.transformers
def test_gradient_of_minilm_equals_huggingface_autograd(torch):
    """The pretrained MiniLM (post-norm BERT) on a few tokens: d/dx of the discrete limit in
    torch equals HuggingFace's autograd of its encoder (float64, eager attention)."""
    require("transformers")
    from ctformer.bridges import minilm

    model = minilm.load()[0]
    x = torch.randn(1, 6, 384, dtype=torch.float64) * 0.5
    weights = torch.randn(1, 6, 384, dtype=torch.float64)
    x_ref = x.clone().requires_grad_(True)
    (model.encoder(x_ref).last_hidden_state * weights).sum().backward()
    x_ours = x.clone().requires_grad_(True)
    ours = minilm.continuous_model().run(x_ours)
    (ours * weights).sum().backward()
    err = (x_ours.grad - x_ref.grad).abs().max() / x_ref.grad.abs().max()
    assert float(err) < 1e-12


def test_padding_masks_across_namespaces(torch):
    """A NumPy or torch padding mask works with a torch state (a mask is data, converted once);
    something that is not a mask is refused by name."""
    model = ContinuousTransformer.random_smooth(seed=4, layers=1)
    start = Grids(d.Midpoint(4), d.Midpoint(3)).sample(smooth_initial_state)
    keep = np.array([True, True, False, True])
    kw = dict(tokens=d.Midpoint(4), features=d.Midpoint(3))
    expected = model.solve(start, padding_mask=keep, **kw)
    for mask in (keep, torch.tensor(keep)):
        got = model.solve(torch.tensor(start), padding_mask=mask, **kw)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-13, atol=1e-13)
    with pytest.raises(TypeError, match="padding_mask"):
        model.solve(torch.tensor(start), padding_mask=object(), **kw)
