"""ctformer.adjoint.gradient on what solve accepts: a converted RoPE network (context_length), padded
batches (padding_mask), discretizations given by name, and layers that share one weight.
References: the float64 HuggingFace module under torch autograd, and the autograd route."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer

from .conftest import require

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _hf(kind):
    require("transformers")
    from ctformer.bridges.hf import from_hf, small_model

    hf = small_model(kind, seed=0)
    return hf, from_hf(hf)


def test_a_converted_llama_with_padding_has_the_gradient_of_the_hf_module(torch):
    # before: gradient had no context_length (nor padding_mask) keyword, and the RoPE network
    # stopped with "these grids have no context_length ... (pass context_length=...)"
    from ctformer.adjoint import gradient

    hf, model = _hf("llama")
    torch.manual_seed(5)
    n, width = 7, hf.config.hidden_size
    x = torch.randn(2, n, width, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 2:] = 0
    weights = torch.randn(2, n, width, dtype=torch.float64) * mask[..., None]
    out = hf(inputs_embeds=x, attention_mask=mask).last_hidden_state
    reference, = torch.autograd.grad((out * weights).sum(), x)
    kw = dict(tokens=d.Midpoint(n), features=d.Midpoint(width), padding_mask=mask, context_length=n)
    ours = gradient(model, x.detach(), lambda u: (u * weights).sum(), route="autograd", **kw)
    assert float((ours - reference).abs().max() / reference.abs().max()) < 1e-10
    # the adjoint route runs too and converges to the discrete gradient (rk4: 1.1e-2, 3.0e-5)
    fine = dict(kw, scheme="rk4", steps_per_layer=8)
    adjoint = gradient(model, x.detach(), lambda u: (u * weights).sum(), route="adjoint", **fine)
    discrete = gradient(model, x.detach(), lambda u: (u * weights).sum(), route="autograd", **fine)
    assert float((adjoint - discrete).abs().max() / discrete.abs().max()) < 1e-4


def test_the_adjoint_route_reads_the_padding_mask(torch):
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0 = torch.tensor(np.random.default_rng(0).standard_normal((2, 6, 5)))
    mask = np.ones((2, 6), dtype=bool)
    mask[1, 4:] = False
    keep = torch.tensor(mask)[..., None]

    def loss(u):
        return ((u ** 3) * keep).sum()

    kw = dict(tokens=d.GaussLegendre(6), features=d.GaussLegendre(5), scheme="rk4", steps_per_layer=8)
    discrete = gradient(model, u0, loss, route="autograd", padding_mask=mask, **kw)
    adjoint = gradient(model, u0, loss, route="adjoint", padding_mask=mask, **kw)
    unmasked = gradient(model, u0, loss, route="adjoint", **kw)
    scale = float(discrete.abs().max())
    assert float((adjoint - discrete).abs().max()) < 1e-7 * scale      # O(dt^4)
    assert float((unmasked - discrete).abs().max()) > 1e-2 * scale     # the mask matters here


def test_the_adjoint_route_takes_discretizations_by_name(torch):
    # before: ValueError "discretization given by name 'midpoint' needs n" on route="adjoint"
    # only (solve and route="autograd" take n from u0's shape)
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    u0 = torch.tensor(np.random.default_rng(1).standard_normal((4, 3)))
    named = gradient(model, u0, lambda u: (u ** 2).sum(), tokens="midpoint", features="midpoint")
    given = gradient(model, u0, lambda u: (u ** 2).sum(), tokens=d.Midpoint(4), features=d.Midpoint(3))
    assert torch.equal(named, given)


def test_layers_sharing_a_weight_each_report_its_whole_gradient(torch):
    # before: ALBERT's three layers share W_1; every alias got its own tensor, the model kept
    # the last, so blocks.2 reported the whole gradient and blocks.0, blocks.1 exactly 0
    from ctformer.adjoint import gradient

    hf, model = _hf("albert")
    torch.manual_seed(2)
    n, width = 5, hf.config.hidden_size
    embedded = torch.randn(1, n, hf.config.embedding_size, dtype=torch.float64)
    weights = torch.randn(1, n, width, dtype=torch.float64)
    hf.zero_grad()
    (hf.encoder(embedded).last_hidden_state * weights).sum().backward()
    shared = hf.encoder.albert_layer_groups[0].albert_layers[0].ffn.weight.grad
    x = hf.encoder.embedding_hidden_mapping_in(embedded).detach()
    _, grads = gradient(model, x, lambda u: (u * weights).sum(), tokens=d.Midpoint(n),
                        features=d.Midpoint(width), route="autograd", parameters=True)
    for layer in range(3):
        g = grads[f"blocks.{layer}.feedforward.W_1.weight"]
        assert float((g - shared).abs().max() / shared.abs().max()) < 1e-12


def test_a_shared_block_on_the_adjoint_route_sums_over_its_layers(torch):
    from ctformer.adjoint import gradient

    block = ContinuousTransformer.random_smooth(seed=3, layers=1, placement="none").blocks[0]
    model = ContinuousTransformer([block, block])       # one copy of the weights, two layers
    u0 = torch.tensor(np.random.default_rng(2).standard_normal((5, 4)))
    kw = dict(tokens=d.GaussLegendre(5), features=d.GaussLegendre(4), scheme="rk4",
              steps_per_layer=8, parameters=True)
    _, discrete = gradient(model, u0, lambda u: (u ** 3).sum(), route="autograd", **kw)
    _, adjoint = gradient(model, u0, lambda u: (u ** 3).sum(), route="adjoint", **kw)
    name = "feedforward.W_1.coefficients"
    reference = discrete[f"blocks.1.{name}"]
    assert torch.equal(discrete[f"blocks.0.{name}"], reference)
    assert float(reference.abs().max()) > 1e-2
    for layer in range(2):
        err = (adjoint[f"blocks.{layer}.{name}"] - reference).abs().max() / reference.abs().max()
        assert float(err) < 1e-6                                       # O(dt^4)


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
def test_a_stale_conversion_is_refused_as_solve_refuses_it(torch, route):
    # before: solve raised StaleConversionError, gradient returned a gradient 0.92 (autograd)
    # or 0.63 (adjoint) away, relative, from that of a fresh conversion of the changed module
    from ctformer.adjoint import gradient
    from ctformer.shared_tensors import StaleConversionError

    hf, model = _hf("gpt2")
    with torch.no_grad():
        hf.h[0].ln_1.weight.mul_(1.5)
    x = torch.randn(1, 5, hf.config.hidden_size, dtype=torch.float64)
    with pytest.raises(StaleConversionError, match="h.0.ln_1.weight changed in place.*Convert the module again"):
        gradient(model, x, lambda u: (u ** 2).sum(), tokens=d.Midpoint(5),
                 features=d.Midpoint(hf.config.hidden_size), route=route)
