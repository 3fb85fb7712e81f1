"""ctformer.adjoint.gradient with features combined: error control (rtol/atol) with a padded
batch, a model from with_parameters (tensor parameters, layers tied to one tensor), and a
converted network with GQA, a sliding window, RoPE, left padding and float32 states.
References: ContinuousTransformer.solve with the same keywords, the same batch with other
values in its padded tokens, the model with NumPy parameters, torch autograd of the tied model,
and torch autograd of the float64 HuggingFace module."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer

from .conftest import require

pytestmark = pytest.mark.torch

GRIDS = dict(tokens=d.GaussLegendre(6), features=d.GaussLegendre(5))


@pytest.fixture(scope="module")
def torch():
    return require("torch")


def _padded_batch(scale=1.0):
    """Two sequences of 6 tokens, the second with its last 2 padded (their values times ``scale``)."""
    u0 = np.random.default_rng(0).standard_normal((2, 6, 5))
    mask = np.ones((2, 6), dtype=bool)
    mask[1, 4:] = False
    u0[1, 4:] *= scale
    return u0, mask


@pytest.mark.parametrize("scheme", ["strang", "tsit5"])
def test_the_adjoint_route_with_rtol_and_padding_solves_forward_as_solve_does(torch, scheme):
    # before: the adjoint route's forward solve weighed the padded tokens in the error norm,
    # evolve does not: its u(T) was 1.8e-6 (strang, rtol=1e-3) or 2.7e-10 (tsit5) away from
    # solve(rtol=..., padding_mask=...); a converted Llama took 19 forward steps, solve 20
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0, mask = _padded_batch()
    keep = torch.tensor(mask)[..., None]
    seen = []

    def loss(u):
        seen.append(u.detach().numpy().copy())
        return ((u ** 3) * keep).sum()

    tol = dict(scheme=scheme, rtol=1e-3, atol=1e-8, padding_mask=mask)
    gradient(model, torch.tensor(u0), loss, route="adjoint", **tol, **GRIDS)
    reference = model.solve(u0, **tol, **GRIDS)
    assert np.abs(seen[0] - reference).max() < 1e-13


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
def test_with_rtol_the_real_tokens_gradient_ignores_what_padded_tokens_hold(torch, route):
    # before (adjoint): the padded tokens' values entered both solves' step sizes, so the real
    # tokens' gradient moved by 3.8e-5 (of 18.2) when the padded values were scaled by 30
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    grads = []
    for scale in (1.0, 30.0):
        u0, mask = _padded_batch(scale)
        keep = torch.tensor(mask)[..., None]
        grads.append(gradient(model, torch.tensor(u0), lambda u: ((u ** 3) * keep).sum(),
                              scheme="strang", rtol=1e-3, atol=1e-8, route=route,
                              padding_mask=mask, **GRIDS) * keep)
    assert float(grads[0].abs().max()) > 1.0
    assert torch.equal(grads[0], grads[1])


def test_the_adjoint_route_with_rtol_and_padding_converges_to_the_gradient(torch):
    # the masked norm keeps the error control honest: rk4 at rtol=1e-6 against autograd of
    # rk4 with 64 steps per layer (error ~1e-12), measured 3e-9
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0, mask = _padded_batch(30.0)
    keep = torch.tensor(mask)[..., None]

    def loss(u):
        return ((u ** 3) * keep).sum()

    kw = dict(padding_mask=mask, parameters=True, **GRIDS)
    fine, fine_p = gradient(model, torch.tensor(u0), loss, scheme="rk4", steps_per_layer=64,
                            route="autograd", **kw)
    ours, ours_p = gradient(model, torch.tensor(u0), loss, scheme="rk4", rtol=1e-6, atol=1e-9,
                            route="adjoint", **kw)
    assert float((ours - fine).abs().max() / fine.abs().max()) < 1e-7
    scale = max(float(g.abs().max()) for g in fine_p.values())
    assert max(float((ours_p[n] - fine_p[n]).abs().max()) for n in fine_p) < 1e-7 * scale


def test_a_model_with_tensor_parameters_gives_the_gradient_without_a_torch_warning(torch):
    # before: gradient copied each tensor parameter with torch.tensor(tensor), and torch warned
    # "To copy construct from a tensor, it is recommended to use sourceTensor.detach().clone()"
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    trainable = model.with_parameters({name: torch.tensor(value, requires_grad=True)
                                       for name, value in model.parameters().items()})
    u0 = torch.tensor(_padded_batch()[0])
    reference = gradient(model, u0, lambda u: (u ** 3).sum(), parameters=True, **GRIDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = gradient(trainable, u0, lambda u: (u ** 3).sum(), parameters=True, **GRIDS)
    assert torch.equal(ours[0], reference[0])
    assert all(torch.equal(ours[1][n], reference[1][n]) for n in reference[1])


def _llama_parameter_gradients(hf, grads, layers, heads, kv_heads, size):
    """HuggingFace gradients under the converted model's names (heads are row blocks)."""
    out = {}
    for layer in range(layers):
        hf_name, ours = f"layers.{layer}.", f"blocks.{layer}."
        attention = hf_name + "self_attn."
        for h in range(heads):
            rows = slice(h * size, (h + 1) * size)
            out[ours + f"attention.W_Q.{h}.weight"] = grads[attention + "q_proj.weight"][rows]
            out[ours + f"attention.W_O.{h}.weight"] = grads[attention + "o_proj.weight"][:, rows]
        for h in range(kv_heads):
            rows = slice(h * size, (h + 1) * size)
            out[ours + f"attention.W_K.{h}.weight"] = grads[attention + "k_proj.weight"][rows]
            out[ours + f"attention.W_V.{h}.weight"] = grads[attention + "v_proj.weight"][rows]
        for mine, theirs in (("W_gate", "gate_proj"), ("W_up", "up_proj"), ("W_2", "down_proj")):
            out[ours + f"feedforward.{mine}.weight"] = grads[hf_name + f"mlp.{theirs}.weight"]
        out[ours + "normalization1.gain"] = grads[hf_name + "input_layernorm.weight"]
        out[ours + "normalization2.gain"] = grads[hf_name + "post_attention_layernorm.weight"]
    out["final_normalization.gain"] = grads["norm.weight"]
    return out


def _mistral(torch):
    """A small float64 Mistral: GQA (4 query heads, 1 key/value head), a window of 3 tokens."""
    t = require("transformers")
    from ctformer.bridges.llama import float64_reference

    config = t.MistralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, sliding_window=3,
                             max_position_embeddings=64, rope_theta=500.0, vocab_size=64,
                             bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(2)
    model = float64_reference(t.MistralModel(config)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0 / np.sqrt(p.shape[1])) if p.ndim == 2 else p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 2e-5)])
def test_a_left_padded_mistral_has_the_parameter_gradients_of_the_hf_module(torch, dtype, tolerance):
    # GQA, a sliding window, RoPE and left padding together, float64 and float32 states:
    # measured 2e-15 and 3e-6 (u0 and every parameter, relative to the largest)
    from ctformer.adjoint import gradient
    from ctformer.bridges.hf import from_hf

    hf = _mistral(torch)
    model = from_hf(hf)
    n, width = 9, hf.config.hidden_size
    torch.manual_seed(3)
    x = torch.randn(2, n, width, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :4] = 0
    weights = torch.randn(2, n, width, dtype=torch.float64) * mask[..., None]
    out = hf(inputs_embeds=x, attention_mask=mask).last_hidden_state
    (out * weights).sum().backward()
    reference = _llama_parameter_gradients(hf, {k: p.grad for k, p in hf.named_parameters()},
                                           2, 4, 1, 4)
    cast = getattr(torch, dtype)
    ours, grads = gradient(model, x.detach().to(cast), lambda u: (u * weights.to(cast)).sum(),
                           tokens=d.Midpoint(n), features=d.Midpoint(width), padding_mask=mask,
                           context_length=n, route="autograd", parameters=True)
    real = mask.bool()[..., None].expand_as(x)
    assert ours.dtype == cast and grads["blocks.0.attention.W_K.0.weight"].dtype == cast
    assert float((ours.double() - x.grad)[real].abs().max() / x.grad[real].abs().max()) < tolerance
    assert set(grads) == set(reference)
    scale = max(float(g.abs().max()) for g in reference.values())
    assert max(float((grads[k].double() - reference[k]).abs().max()) for k in reference) < tolerance * scale


@pytest.mark.parametrize("route, tolerance", [("autograd", 1e-12), ("adjoint", 1e-6)])
def test_layers_tied_by_with_parameters_each_get_the_tied_weights_gradient(torch, route, tolerance):
    # before: gradient copied the parameters name by name, which untied the two layers: each
    # name got its own layer's share, 0.51 and 0.50 (relative) away from torch's autograd of the
    # tied model (the sum); now 0 (autograd) and 2.7e-9 (adjoint, rk4, 8 steps per layer)
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=3, layers=2, placement="none")
    params = {name: torch.tensor(value, requires_grad=True) for name, value in model.parameters().items()}
    for name in [n for n in params if n.startswith("blocks.1.")]:
        params[name] = params["blocks.0." + name[len("blocks.1."):]]     # layer 1 uses layer 0's
    tied = model.with_parameters(params)
    grids = dict(tokens=d.GaussLegendre(5), features=d.GaussLegendre(4))
    u0 = torch.tensor(np.random.default_rng(2).standard_normal((5, 4)))
    (tied.solve(u0, scheme="rk4", steps_per_layer=8, **grids) ** 3).sum().backward()
    _, grads = gradient(tied, u0, lambda u: (u ** 3).sum(), scheme="rk4", steps_per_layer=8,
                        route=route, parameters=True, **grids)
    for name in [n for n in params if n.startswith("blocks.0.")]:
        reference = params[name].grad
        scale = float(reference.abs().max())
        for layer in ("blocks.0.", "blocks.1."):
            ours = grads[layer + name[len("blocks.0."):]]
            assert float((ours - reference).abs().max()) <= tolerance * max(scale, 1.0), (layer, name)
