"""Operators of current Transformers (design notes, section 10): RMSNorm, scale-safe projections,
gated feed-forward layers, grouped-query attention, and the random models that use them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import PiecewiseConstant, SmoothRandom
from ctformer.model import ContinuousTransformer
from ctformer.operators import (Attention, Causal, GatedFeedForward, Grids, LayerNormProjection, RMSNorm,
                                SphereProjection, quadrature_attention)

from .conftest import require


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


# -- RMSNorm and scale-safe projections ---------------------------------------------------------
def test_rmsnorm_closed_form_and_sphere_alias(rng):
    grids = Grids(Midpoint(5), Midpoint(7))
    u = rng.standard_normal((2, 5, 7))
    g = rng.uniform(0.5, 1.5, 7)
    expected = g * u / np.sqrt((u * u).mean(-1, keepdims=True) + 1e-3)
    assert _rel(RMSNorm(gain=g, eps=1e-3)(u, grids), expected) < 1e-15
    assert _rel(SphereProjection(gain=g, eps=1e-3)(u, grids), expected) < 1e-15
    plain = RMSNorm()
    assert plain.is_projection and isinstance(plain, SphereProjection)
    assert np.allclose((plain(u, grids) ** 2).mean(-1), 1.0, rtol=1e-15, atol=1e-15)


_PROJECTIONS = {
    "layernorm": lambda: LayerNormProjection(gain=np.linspace(0.5, 1.5, 6), shift=0.3),
    "layernorm-plain": lambda: LayerNormProjection(),
    "rmsnorm": lambda: RMSNorm(gain=np.linspace(0.5, 1.5, 6)),
    "sphere": lambda: SphereProjection(),
}


@pytest.mark.parametrize("name", list(_PROJECTIONS))
@pytest.mark.parametrize("dtype, scales", [(np.float64, (1e155, 1e-160, 1e300, 1e-300, 3.0)),
                                           (np.float32, (1e30, 1e-30, 7.0, 1e12, 1e-12, 3e-13))])
def test_projections_are_scale_invariant(name, dtype, scales, rng):
    """N(c u) = N(u) to rounding for every c > 0 (eps = 0), with no overflow or underflow."""
    grids = Grids(Midpoint(4), Midpoint(6))
    op = _PROJECTIONS[name]()
    u = rng.standard_normal((3, 4, 6)).astype(dtype)
    base = op(u, grids)
    tol = 8 * np.finfo(dtype).eps
    for c in scales:
        scaled = (u.astype(np.float64) * c).astype(dtype)
        assert np.all(np.isfinite(scaled)) and np.all(scaled != 0)
        out = op(scaled, grids)
        assert out.dtype == dtype
        assert _rel(out, base) < tol, (c, _rel(out, base))


@pytest.mark.parametrize("op_name", ["layernorm", "rmsnorm"])
def test_projections_with_eps_are_accurate_at_extreme_scales(op_name, rng):
    """With eps > 0, N(c u) is the closed form (u - mu)/sqrt(var + eps/c^2), evaluated exactly in c."""
    grids = Grids(Midpoint(3), Midpoint(5))
    u = rng.standard_normal((3, 5))
    eps = 1e-5
    for c in (1e155, 1e-160, 1e-2, 1e-300):
        if op_name == "layernorm":
            out = LayerNormProjection(eps=eps)(c * u, grids)
            centred = u - u.mean(-1, keepdims=True)
            ref = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps / c / c)
        else:
            out = RMSNorm(eps=eps)(c * u, grids)
            ref = u / np.sqrt((u * u).mean(-1, keepdims=True) + eps / c / c)
        assert np.all(np.isfinite(out))
        err = np.abs(out - ref).max()
        assert err <= 1e-14 * max(1.0, np.abs(ref).max()) + 1e-150, (c, err)


def test_degenerate_tokens_still_raise_but_not_for_mere_scale(rng):
    grids = Grids(Midpoint(3), Midpoint(4))
    u = rng.standard_normal((3, 4))
    flat = u.copy()
    flat[1] = 2.5  # zero variance
    with pytest.raises(ValueError, match=r"index \(1,\) .*zero feature variance"):
        LayerNormProjection()(flat, grids)
    with pytest.raises(ValueError, match="zero feature variance"):
        LayerNormProjection()(1e-300 * flat, grids)
    zero = u.copy()
    zero[2] = 0.0
    for op in (SphereProjection(), RMSNorm(gain=2.0)):
        with pytest.raises(ValueError, match=r"index \(2,\) .* is zero"):
            op(zero, grids)
    assert np.all(RMSNorm(eps=1e-6)(zero, grids)[2] == 0)  # eps > 0: a zero token stays zero
    tiny = 5e-324 * np.sign(u)  # the smallest subnormal, not a degenerate token
    out = SphereProjection()(tiny, grids)
    assert np.allclose(np.abs(out), 1.0, rtol=1e-15)
    big = np.full((3, 4), 1.7e308) * np.sign(u)
    assert np.allclose(np.abs(SphereProjection()(big, grids)), 1.0, rtol=1e-15)


# -- gated feed-forward -------------------------------------------------------------------------
@pytest.mark.parametrize("activation, torch_act", [("silu", "silu"), ("gelu_tanh", "gelu_pytorch_tanh"),
                                                   ("gelu", "gelu")])
def test_gated_feedforward_equals_torch_llama_mlp(activation, torch_act):
    torch = require("torch")
    t = require("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = t.LlamaConfig(hidden_size=6, intermediate_size=10, num_attention_heads=2, num_key_value_heads=1,
                        hidden_act=torch_act, mlp_bias=True)
    torch.manual_seed(0)
    mlp = LlamaMLP(cfg).double()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_()
    w = {n: p.detach().numpy() for n, p in mlp.named_parameters()}
    op = GatedFeedForward(PiecewiseConstant(w["gate_proj.weight"]), PiecewiseConstant(w["up_proj.weight"]),
                          PiecewiseConstant(w["down_proj.weight"]), b_gate=w["gate_proj.bias"],
                          b_up=w["up_proj.bias"], b_2=w["down_proj.bias"], activation=activation)
    x = np.random.default_rng(1).standard_normal((2, 5, 6))
    with torch.no_grad():
        ref = mlp(torch.from_numpy(x)).numpy()
    assert _rel(op(x, Grids(Midpoint(5), Midpoint(6), hidden=Midpoint(10))), ref) < 1e-14
    assert set(op.parameters()) == {"W_gate.weight", "W_up.weight", "W_2.weight", "b_gate", "b_up", "b_2"}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gated_feedforward_product_changes_no_array_but_its_own(dtype):
    """The built-in activation's new array takes the product phi(W_g u) (W_u u) in place: the
    result has the bits of the plain NumPy formula, the state is unchanged, and a custom
    activation's output (here an array it keeps and returns every time) is never written."""
    rng = np.random.default_rng(4)
    w_g, w_u, w_2 = rng.standard_normal((12, 6)), rng.standard_normal((12, 6)), rng.standard_normal((6, 12))
    grids = Grids(Midpoint(5), Midpoint(6), hidden=Midpoint(12))
    u = rng.standard_normal((3, 5, 6)).astype(dtype)
    kept = u.copy()
    op = GatedFeedForward(PiecewiseConstant(w_g), PiecewiseConstant(w_u), PiecewiseConstant(w_2), activation="silu")
    flow = op.discretize(grids)
    # on midpoint grids a piecewise-constant kernel is its matrix (the discrete limit)
    gate, up = (u @ w.T.astype(dtype) for w in (w_g, w_u))
    silu = gate / (1 + np.exp(-gate.astype(np.float64))).astype(dtype)
    ref = (silu.astype(np.float64) * up) @ w_2.T
    for _ in range(2):  # a second call sees the same (unchanged) inputs
        got = flow(u)
        assert got.dtype == dtype and _rel(got, ref) < (1e-14 if dtype == np.float64 else 2e-6)
    np.testing.assert_array_equal(u, kept)
    constant = np.full((3, 5, 12), 0.5, dtype=dtype)
    custom = GatedFeedForward(PiecewiseConstant(w_g), PiecewiseConstant(w_u), PiecewiseConstant(w_2),
                              activation=lambda z: constant)
    got = custom.discretize(grids)(u)
    np.testing.assert_array_equal(constant, 0.5)
    assert _rel(got, (0.5 * up.astype(np.float64)) @ w_2.T) < (1e-14 if dtype == np.float64 else 2e-6)


def test_gated_feedforward_is_a_product_in_the_hidden_variable():
    """On Gauss-Legendre hidden nodes the r integral of smooth kernels converges spectrally."""
    kg, ku, k2 = SmoothRandom(1, scale=0.5), SmoothRandom(2, scale=0.5), SmoothRandom(3, scale=0.5)
    op = GatedFeedForward(kg, ku, k2, b_gate=0.1, b_up=-0.2, b_2=0.05)
    u = np.cos(3 * GaussLegendre(8).nodes)[None, :]

    def value(n):
        return op(u, Grids(Midpoint(1), GaussLegendre(8), hidden=GaussLegendre(n)))

    assert np.abs(value(24) - value(48)).max() < 1e-13
    assert np.abs(value(6) - value(48)).max() > 1e-8


# -- grouped-query attention --------------------------------------------------------------------
def _gqa_reference(att, u, d_h):
    """NumPy grouped-query attention on midpoint grids: head h reads kv head h * H_kv // H."""
    mats = {n: [k.matrix(Midpoint(d_h), Midpoint(u.shape[-1])) for k in getattr(att, f"W_{n}")] for n in "QKV"}
    w_o = [k.matrix(Midpoint(u.shape[-1]), Midpoint(d_h)) for k in att.W_O]
    out = 0
    for h in range(att.heads):
        g = h * att.kv_heads // att.heads
        q, k, v = u @ mats["Q"][h].T, u @ mats["K"][g].T, u @ mats["V"][g].T
        s = att.beta[h] * q @ k.swapaxes(-1, -2) / d_h
        if att.mask == Causal():
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out = out + (p / p.sum(-1, keepdims=True)) @ v @ w_o[h].T
    return out


@pytest.mark.parametrize("heads, kv_heads, mask", [(4, 2, None), (6, 3, "causal"), (4, 1, "causal"), (3, 3, None)])
def test_grouped_query_attention(heads, kv_heads, mask, rng):
    d, d_h, n = 8, 4, 7
    mk = lambda *s: PiecewiseConstant(rng.standard_normal(s) / math.sqrt(s[1]))  # noqa: E731
    att = Attention([mk(d_h, d) for _ in range(heads)], [mk(d_h, d) for _ in range(kv_heads)],
                    [mk(d_h, d) for _ in range(kv_heads)], [mk(d, d_h) for _ in range(heads)],
                    beta=rng.uniform(1, 3, heads), mask=mask, kv_heads=kv_heads)
    u = rng.standard_normal((2, n, d))
    got = att(u, Grids(Midpoint(n), Midpoint(d), Midpoint(d_h)))
    assert _rel(got, _gqa_reference(att, u, d_h)) < 1e-13
    assert sum(key.startswith("W_K.") for key in att.parameters()) == kv_heads


def test_attention_option_errors():
    k = PiecewiseConstant(np.eye(4))
    with pytest.raises(ValueError, match="kv_heads=3 must divide"):
        Attention([k] * 4, [k] * 3, [k] * 3, [k] * 4, kv_heads=3)
    with pytest.raises(ValueError, match="one kernel per key/value head"):
        Attention([k] * 4, [k] * 4, [k] * 2, [k] * 4, kv_heads=2)
    with pytest.raises(ValueError, match="pass kv_heads"):
        Attention([k] * 4, [k] * 2, [k] * 2, [k] * 4)
    with pytest.raises(ValueError, match="window .* needs mask='causal'"):
        Attention([k], [k], [k], [k], window=4)
    with pytest.raises(ValueError, match=r"window \(sliding-window attention, in positions\) must be a finite positive"):
        Attention([k], [k], [k], [k], mask="causal", window=-1)
    with pytest.raises(ValueError, match="positions must be None or a PositionEncoding .RoPE, AxialRoPE, ALiBi"):
        Attention([k], [k], [k], [k], positions="rope")


# -- random models with the new components -------------------------------------------------------
def test_random_smooth_new_keywords_and_errors():
    model = ContinuousTransformer.random_smooth(
        seed=1, heads=4, kv_heads=2, normalization="rmsnorm", feedforward="geglu", positions="alibi",
        context_length=16, mask="causal")
    assert model.context_length == 16
    block = model.blocks[0]
    assert isinstance(block.normalization1, RMSNorm) and isinstance(block.feedforward, GatedFeedForward)
    assert block.attention.kv_heads == 2 and block.feedforward.activation_name == "gelu"
    out = model.solve(np.cos(np.arange(40.0)).reshape(5, 8) + 1.0, tokens="gauss-legendre", features="midpoint")
    assert np.all(np.isfinite(out))
    # the default options draw the same random numbers as before: same parameters
    a = ContinuousTransformer.random_smooth(seed=3).parameters()
    b = ContinuousTransformer.random_smooth(seed=3, normalization="layernorm", feedforward="mlp").parameters()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="need context_length"):
        ContinuousTransformer.random_smooth(positions="rope")
    with pytest.raises(ValueError, match="normalization must be one of"):
        ContinuousTransformer.random_smooth(normalization="batchnorm")
    with pytest.raises(ValueError, match="feedforward must be one of"):
        ContinuousTransformer.random_smooth(feedforward="moe")
    with pytest.raises(ValueError, match="kv_heads=3 must divide"):
        ContinuousTransformer.random_smooth(heads=2, kv_heads=3)


def test_gqa_random_model_uses_quadrature_attention_with_shared_keys(rng):
    """The GQA path equals running each head with its kv head through quadrature_attention."""
    model = ContinuousTransformer.random_smooth(seed=2, heads=4, kv_heads=2, layers=1, placement="none")
    att = model.blocks[0].attention
    grids = Grids(GaussLegendre(9), GaussLegendre(6))
    u = rng.standard_normal((9, 6))
    sig = grids.head_features
    w_s = sig.quadrature_weights
    out = 0
    for h in range(4):
        g = h // 2
        q = u @ att.W_Q[h].matrix(sig, grids.features).T + att.b_Q[h].evaluate(sig)
        k = u @ att.W_K[g].matrix(sig, grids.features).T + att.b_K[g].evaluate(sig)
        v = u @ att.W_V[g].matrix(sig, grids.features).T + att.b_V[g].evaluate(sig)
        a = quadrature_attention(q * w_s, k, v, beta=att.beta[h], weights=grids.tokens.quadrature_weights)
        out = out + a @ att.W_O[h].matrix(grids.features, sig).T
    out = out + att.b_O.evaluate(grids.features)
    assert _rel(att(u, grids), out) < 1e-13
