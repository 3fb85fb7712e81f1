"""Operators against float64 torch modules, closed forms, scipy quadrature and theorems."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, special

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import Convolution, PiecewiseConstant, Smooth, SmoothRandom
from ctformer.operators import (
    Attention,
    FeatureMap,
    FeedForward,
    Grids,
    LayerNormProjection,
    SphereProjection,
)

from .conftest import fitted_order, require


def _midpoint_grids(n, d, d_h, d_ff):
    return Grids(Midpoint(n), Midpoint(d), Midpoint(d_h), Midpoint(d_ff))


def _attention_from_torch(mha, heads, mask=None):
    """The continuous attention whose midpoint discretization is ``mha`` (design notes, section 2)."""
    e = mha.embed_dim
    d_h = e // heads
    w = mha.in_proj_weight.detach().numpy()
    b = mha.in_proj_bias.detach().numpy()
    w_o = mha.out_proj.weight.detach().numpy()
    blocks = [slice(h * d_h, (h + 1) * d_h) for h in range(heads)]
    kernels = [[PiecewiseConstant(w[i * e:(i + 1) * e][r]) for r in blocks] for i in range(3)]
    biases = [[b[i * e:(i + 1) * e][r] for r in blocks] for i in range(3)]
    return Attention(*kernels, [PiecewiseConstant(w_o[:, r]) for r in blocks],
                     b_Q=biases[0], b_K=biases[1], b_V=biases[2], b_O=mha.out_proj.bias,
                     beta=np.sqrt(d_h), mask=mask)


def _torch_mha(torch, e, heads, seed):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(e, heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():  # torch initializes the biases to zero; make them count
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


# -- attention: the discrete limit is torch's MultiheadAttention ------------------------------
@pytest.mark.parametrize("e, heads, n, batch", [(8, 1, 5, 1), (12, 3, 7, 2), (16, 4, 11, 3)])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_attention_equals_torch_multihead_attention(e, heads, n, batch, mask):
    torch = require("torch")
    mha = _torch_mha(torch, e, heads, seed=e + n)
    x = torch.randn(batch, n, e, dtype=torch.float64)
    causal = None if mask is None else torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
    with torch.no_grad():
        reference = mha(x, x, x, attn_mask=causal, need_weights=False)[0].numpy()
    grids = _midpoint_grids(n, e, e // heads, e)
    got = _attention_from_torch(mha, heads, mask)(x.numpy(), grids)
    assert _rel(got, reference) < 1e-12


@pytest.mark.parametrize("mask", [None, "causal"])
def test_attention_padding_mask_equals_torch_key_padding_mask(mask):
    torch = require("torch")
    e, heads, n = 12, 2, 6
    mha = _torch_mha(torch, e, heads, seed=5)
    x = torch.randn(2, n, e, dtype=torch.float64)
    keep = np.ones((2, n), dtype=bool)
    keep[0, -2:] = False
    keep[1, 3] = False
    causal = None if mask is None else torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
    with torch.no_grad():
        padding = torch.zeros(2, n, dtype=torch.float64).masked_fill(torch.tensor(~keep), float("-inf"))
        reference = mha(x, x, x, attn_mask=causal, key_padding_mask=padding, need_weights=False)[0].numpy()
    got = _attention_from_torch(mha, heads, mask).discretize(_midpoint_grids(n, e, e // heads, e),
                                                            padding_mask=keep)(x.numpy())
    assert _rel(got, reference) < 1e-12


@pytest.mark.parametrize("factor", [2, 3])
def test_attention_feature_refinement_leaves_results_unchanged(factor):
    torch = require("torch")
    e, heads, n = 8, 2, 5
    mha = _torch_mha(torch, e, heads, seed=11)
    x = torch.randn(n, e, dtype=torch.float64)
    with torch.no_grad():
        reference = mha(x[None], x[None], x[None], need_weights=False)[0][0].numpy()
    d_h = e // heads
    grids = _midpoint_grids(n, factor * e, factor * d_h, factor * e)
    got = _attention_from_torch(mha, heads)(np.repeat(x.numpy(), factor, axis=-1), grids)
    assert _rel(got, np.repeat(reference, factor, axis=-1)) < 1e-12


def _smooth_attention(mask=None):
    kernels = [[SmoothRandom(10 * i + h) for h in range(2)] for i in range(4)]
    return Attention(*kernels, b_Q=[0.1, lambda s: np.sin(s)], b_K=None, b_V=[0.0, 0.2],
                     b_O=lambda y: np.cos(y), beta=[2.0, 3.0], mask=mask)


def _projections(att, u, grids):
    """q, k, v per head from the kernel functions and explicit feature sums (not the operator)."""
    y, s = grids.features, grids.head_features
    yq, sq = y.quadrature_nodes, s.quadrature_nodes
    heads = []
    for h in range(att.heads):
        proj = []
        for name, bias in (("W_Q", att.b_Q), ("W_K", att.b_K), ("W_V", att.b_V)):
            w = getattr(att, name)[h].evaluate(sq[:, None], yq[None, :])  # W(sigma, eta)
            p = np.einsum("se,...ne,e->...ns", w, u, y.quadrature_weights)
            proj.append(p if bias is None else p + bias[h].evaluate(s))
        heads.append(proj)
    return heads


def _output(att, attended, grids):
    """sum_h int W_O^h(y, sigma) attended^h(sigma) dsigma + b_O(y)."""
    y, s = grids.features, grids.head_features
    out = att.b_O.evaluate(y)
    for h, a in enumerate(attended):
        w_o = att.W_O[h].evaluate(y.quadrature_nodes[:, None], s.quadrature_nodes[None, :])
        out = out + np.einsum("ys,...ns,s->...ny", w_o, a, s.quadrature_weights)
    return out


def _reference_attention(att, u, grids):
    """Independent evaluation of the design notes, section 1 with explicit sums and scipy's softmax."""
    attended = []
    for h, (q, k, v) in enumerate(_projections(att, u, grids)):
        scores = att.beta[h] * np.einsum("...is,...js,s->...ij", q, k, grids.head_features.quadrature_weights)
        gamma = special.softmax(scores + np.log(grids.tokens.quadrature_weights), axis=-1)  # log-weight bias
        attended.append(gamma @ v)
    return _output(att, attended, grids)


def test_gauss_attention_is_softmax_with_log_weight_bias(rng):
    grids = Grids(GaussLegendre(9), GaussLegendre(6), GaussLegendre(5), GaussLegendre(7))
    att = _smooth_attention()
    u = rng.standard_normal((2, 3, 9, 6))  # two batch axes
    got = att(u, grids)
    np.testing.assert_allclose(got, _reference_attention(att, u, grids), rtol=1e-13, atol=1e-13)


def _u0(x, y):
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def _exact_token_integral(att, tokens, features):
    """Attention at the token nodes with the x' integral done by scipy's quad_vec."""
    grids = Grids(tokens, features)
    u_nodes = _u0(tokens.nodes[:, None], features.nodes[None, :])
    queries = [q for q, _, _ in _projections(att, u_nodes, grids)]
    w_s = features.quadrature_weights

    def integrand(xp):
        _, k, v = zip(*_projections(att, _u0(np.array([[xp]]), features.nodes[None, :]), grids))
        rows = []
        for h in range(att.heads):
            weight = np.exp(att.beta[h] * (queries[h] * w_s) @ k[h][0])  # (N,)
            rows.append(np.concatenate([weight[:, None] * v[h], weight[:, None]], axis=1))
        return np.stack(rows)

    total = integrate.quad_vec(integrand, 0, 1, epsabs=1e-14, epsrel=1e-13)[0]
    attended = [total[h, :, :-1] / total[h, :, -1:] for h in range(att.heads)]
    return _output(att, attended, grids)


def test_attention_token_quadrature_gauss_spectral_midpoint_second_order():
    att = _smooth_attention()
    features = GaussLegendre(6)

    def error(tokens):
        u = _u0(tokens.nodes[:, None], features.nodes[None, :])
        got = att(u, Grids(tokens, features))
        return np.abs(got - _exact_token_integral(att, tokens, features)).max()

    assert error(GaussLegendre(24)) < 1e-11
    ns = (8, 16, 32, 64)
    errors = [error(Midpoint(n)) for n in ns]
    assert abs(fitted_order([1 / n for n in ns], errors) - 2.0) < 0.1


# -- feature maps and feed-forward -----------------------------------------------------------
_TORCH_ACTIVATIONS = {
    "relu": lambda F, z: F.relu(z),
    "gelu": lambda F, z: F.gelu(z),
    "gelu_tanh": lambda F, z: F.gelu(z, approximate="tanh"),
    "silu": lambda F, z: F.silu(z),
}


@pytest.mark.parametrize("activation", list(_TORCH_ACTIVATIONS))
def test_feedforward_equals_torch_linear_activation_linear(activation):
    torch = require("torch")
    F = torch.nn.functional
    torch.manual_seed(3)
    d, d_ff, n = 6, 10, 4
    lin1 = torch.nn.Linear(d, d_ff, dtype=torch.float64)
    lin2 = torch.nn.Linear(d_ff, d, dtype=torch.float64)
    x = 3 * torch.randn(2, n, d, dtype=torch.float64)  # both signs, large |z| for silu and gelu
    with torch.no_grad():
        reference = lin2(_TORCH_ACTIVATIONS[activation](F, lin1(x))).numpy()
    ffn = FeedForward(PiecewiseConstant(lin1.weight), PiecewiseConstant(lin2.weight),
                      b_1=lin1.bias, b_2=lin2.bias, activation=activation)
    got = ffn(x.numpy(), _midpoint_grids(n, d, d, d_ff))
    assert _rel(got, reference) < 1e-12


def test_feature_map_equals_torch_linear():
    torch = require("torch")
    torch.manual_seed(4)
    lin = torch.nn.Linear(7, 7, dtype=torch.float64)
    x = torch.randn(3, 5, 7, dtype=torch.float64)
    with torch.no_grad():
        reference = lin(x).numpy()
    got = FeatureMap(PiecewiseConstant(lin.weight), bias=lin.bias)(x.numpy(), _midpoint_grids(5, 7, 7, 7))
    assert _rel(got, reference) < 1e-12


def test_silu_has_no_overflow_for_large_arguments():
    from ctformer.operators import silu

    z = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0])
    np.testing.assert_allclose(silu(z), z * special.expit(z), rtol=1e-15, atol=0)


# -- normalizations --------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layernorm_equals_torch(eps):
    torch = require("torch")
    torch.manual_seed(5)
    d, n = 9, 6
    ln = torch.nn.LayerNorm(d, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(2, n, d, dtype=torch.float64)
    with torch.no_grad():
        reference = ln(x).numpy()
    op = LayerNormProjection(gain=ln.weight, shift=ln.bias, eps=eps)
    assert not op.is_projection
    assert _rel(op(x.numpy(), _midpoint_grids(n, d, d, d)), reference) < 1e-12


def _gauss_state(n_tokens=5, n_features=14):
    grids = Grids(GaussLegendre(n_tokens), GaussLegendre(n_features))
    u = _u0(grids.tokens.nodes[:, None], grids.features.nodes[None, :])
    return grids, u


def test_layernorm_projection_is_idempotent_with_prescribed_mean_and_variance():
    sigma1, sigma2 = 0.3, 1.7
    grids, u = _gauss_state()
    proj = LayerNormProjection(gain=sigma2, shift=sigma1)
    assert proj.is_projection
    pu = proj(u, grids)
    np.testing.assert_allclose(proj(pu, grids), pu, rtol=0, atol=1e-14)
    for i, x in enumerate(grids.tokens.nodes):
        # P u is affine in u per token; recover its coefficients and integrate the function exactly
        slope, intercept = np.polyfit(u[i], pu[i], 1)

        def projected(y, x=x, slope=slope, intercept=intercept):
            return slope * _u0(x, y) + intercept

        mean = integrate.quad(projected, 0, 1, epsabs=1e-13, epsrel=1e-13)[0]
        var = integrate.quad(lambda y: (projected(y) - mean) ** 2, 0, 1, epsabs=1e-13, epsrel=1e-13)[0]
        assert abs(mean - sigma1) < 1e-12
        assert abs(var - sigma2**2) < 1e-12


def test_layernorm_projection_is_the_closest_point_of_s1(rng):
    sigma1, sigma2 = -0.4, 0.8
    grids, u = _gauss_state()
    w_y = grids.features.quadrature_weights
    pu = LayerNormProjection(sigma2, sigma1)(u, grids)

    def to_s1(z):  # any point of S1 (discrete mean and variance of the same quadrature)
        m = z @ w_y
        return sigma2 * (z - m[..., None]) / np.sqrt(((z - m[..., None]) ** 2) @ w_y)[..., None] + sigma1

    def dist(a, b):
        return np.sqrt(((a - b) ** 2) @ w_y)

    far = to_s1(rng.standard_normal((200, *u.shape)))
    near = to_s1(pu + 1e-3 * rng.standard_normal((200, *u.shape)))
    for candidates in (far, near):
        assert np.all(dist(u, pu) <= dist(u, candidates) + 1e-14)
    # and strictly farther unless equal
    assert np.min(dist(u, near) - dist(u, pu)) > 0


def test_layernorm_zero_variance():
    grids = Grids(Midpoint(4), Midpoint(6))
    u = np.random.default_rng(0).standard_normal((2, 4, 6))
    u[1, 2] = 0.7  # a feature-constant token
    with pytest.raises(ValueError, match=r"index \(1, 2\).*zero feature variance"):
        LayerNormProjection()(u, grids)
    out = LayerNormProjection(gain=2.0, shift=lambda y: y, eps=1e-5)(u, grids)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[1, 2], grids.features.nodes, atol=1e-10)  # the shift c(y)


def test_sphere_projection():
    grids = Grids(Midpoint(3), GaussLegendre(12))
    y = grids.features.nodes
    u = np.stack([1 + y, np.exp(y), np.sin(3 * y)])
    norms = np.sqrt([7 / 3, (np.e**2 - 1) / 2, 0.5 - np.sin(6) / 12])  # closed-form L2(0,1) norms
    out = SphereProjection()(u, grids)
    np.testing.assert_allclose(out, u / norms[:, None], rtol=1e-12)
    np.testing.assert_allclose(out**2 @ grids.features.weights, 1.0, rtol=1e-14)
    u[1] = 0.0
    with pytest.raises(ValueError, match=r"index \(1,\) .*is zero"):
        SphereProjection()(u, grids)


# -- batching, caching, dtype ------------------------------------------------------------------
def test_batched_equals_looped_and_discretized_once(rng):
    calls = []

    class Counting(Smooth):
        def _build_matrix(self, out, inp):
            calls.append((out, inp))
            return super()._build_matrix(out, inp)

    kernel = Counting(lambda s, t: np.cos(s - 2 * t))
    att = Attention([kernel], [SmoothRandom(1)], [SmoothRandom(2)], [SmoothRandom(3)], beta=3.0, mask="causal")
    ffn = FeedForward(SmoothRandom(4), SmoothRandom(5), activation="gelu_tanh")
    grids = Grids(GaussLegendre(5), Midpoint(4), GaussLegendre(3), Midpoint(6))
    u = rng.standard_normal((2, 3, 5, 4))
    for op in (att, ffn, LayerNormProjection(gain=np.arange(1.0, 5.0)), SphereProjection()):
        batched = op(u, grids)
        looped = np.stack([np.stack([op(u[a, b], grids) for b in range(3)]) for a in range(2)])
        np.testing.assert_allclose(batched, looped, rtol=1e-14, atol=1e-14)
        single = op(u.astype(np.float32), grids)
        assert single.dtype == np.float32
        np.testing.assert_allclose(single, batched, rtol=1e-4, atol=1e-4)
    assert att.discretize(grids) is att.discretize(Grids(GaussLegendre(5), Midpoint(4), GaussLegendre(3), Midpoint(6)))
    assert len(calls) == 1


def test_assigning_an_attribute_drops_the_cached_discretization(rng):
    """A discretization belongs to the values it was built from: after ``op.W_1 = ...`` the
    operator computes with the new kernel, as a freshly built operator does."""
    grids = Grids(GaussLegendre(5), Midpoint(4), GaussLegendre(3), Midpoint(6))
    u = rng.standard_normal((5, 4))
    ffn = FeedForward(SmoothRandom(4), SmoothRandom(5), activation="gelu")
    before = ffn(u, grids)
    ffn.W_1 = SmoothRandom(7)
    fresh = FeedForward(SmoothRandom(7), SmoothRandom(5), activation="gelu")(u, grids)
    np.testing.assert_array_equal(ffn(u, grids), fresh)
    assert np.max(np.abs(fresh - before)) > 1e-3   # the new kernel really changes the result


# -- feature functions -----------------------------------------------------------------------
def test_feature_functions_at_quadrature_nodes():
    from ctformer.operators import as_feature_function

    bias = as_feature_function(np.array([1.0, 2.0, 3.0]), "b")  # a torch bias of length 3
    np.testing.assert_array_equal(bias.evaluate(Midpoint(6)), [1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(bias.evaluate(GaussLegendre(3)), [1, 2, 3])
    np.testing.assert_array_equal(bias.evaluate(Midpoint(3, domain=(-2.0, 4.0))), [1, 2, 3])
    grid = GaussLegendre(4)
    np.testing.assert_allclose(as_feature_function(np.sin).evaluate(grid), np.sin(grid.nodes), rtol=0, atol=0)
    np.testing.assert_array_equal(as_feature_function(2.5).evaluate(grid), np.full(4, 2.5))
    assert as_feature_function(None).evaluate(grid) is None
    with pytest.raises(ValueError, match="b: the callable returned shape"):
        as_feature_function(lambda y: np.ones(2), "b").evaluate(grid)
    with pytest.raises(ValueError, match="b: the callable returned NaN"):
        as_feature_function(lambda y: np.where(y > 0.5, np.inf, y), "b").evaluate(grid)
    with pytest.raises(ValueError, match="1-D"):
        as_feature_function(np.ones((2, 2)), "gain")
    with pytest.raises(TypeError, match="gain must be None, a number"):
        as_feature_function("ones", "gain")
    with pytest.raises(ValueError, match="gain must be finite"):
        as_feature_function(np.nan, "gain")


# -- clear errors ----------------------------------------------------------------------------
def test_operator_errors():
    k = [SmoothRandom(0), SmoothRandom(1)]
    with pytest.raises(ValueError, match="W_V has 1"):
        Attention(k, k, k[:1], k)
    with pytest.raises(TypeError, match=r"W_O\[1\]"):
        Attention(k, k, k, [k[0], np.ones((2, 2))])
    with pytest.raises(ValueError, match="beta must be finite"):
        Attention(k, k, k, k, beta=[1.0, np.inf])
    with pytest.raises(ValueError, match="one value per head"):
        Attention(k, k, k, k, beta=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="mask must be None, 'causal' or a Mask"):
        Attention(k, k, k, k, mask="future")
    with pytest.raises(ValueError, match="diagonal='half' only applies"):
        Attention(k, k, k, k, diagonal="half")
    with pytest.raises(ValueError, match="one entry per head"):
        Attention(k, k, k, k, b_Q=[0.0])
    with pytest.raises(ValueError, match="unknown activation 'tanh'.*relu, gelu, gelu_tanh, silu"):
        FeedForward(k[0], k[1], activation="tanh")
    with pytest.raises(ValueError, match="eps must be"):
        LayerNormProjection(eps=-1.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        FeatureMap(k[0], bias=np.array([0.0, np.nan]))
    grids = Grids(Midpoint(4), Midpoint(3))
    att = Attention(k, k, k, k, mask="causal")
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4, 3\)"):
        att(np.ones((4, 4)), grids)
    with pytest.raises(ValueError, match="NaN or inf"):
        att(np.full((4, 3), np.nan), grids)
    with pytest.raises(ValueError, match=r"padding_mask must have shape \(\.\.\., 4\)"):
        att(np.ones((4, 3)), grids, padding_mask=np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="boolean"):
        att(np.ones((4, 3)), grids, padding_mask=np.ones(4, dtype=complex))
    with pytest.raises(ValueError, match="got the value 0.5"):
        att(np.ones((4, 3)), grids, padding_mask=np.full(4, 0.5))
    with pytest.raises(TypeError, match="Grids"):
        att.discretize((Midpoint(4), Midpoint(3)))


# -- GPU -------------------------------------------------------------------------------------
@pytest.mark.cupy
def test_operators_on_cupy_equal_numpy(rng):
    import cupy

    grids = Grids(GaussLegendre(7), Midpoint(6), GaussLegendre(4), Midpoint(9))
    u = rng.standard_normal((2, 7, 6))
    ops = [
        _smooth_attention(mask="causal"),
        FeedForward(SmoothRandom(1), SmoothRandom(2), b_1=0.1, b_2=np.arange(6.0), activation="gelu"),
        FeatureMap(SmoothRandom(3), bias=1.0),
        FeatureMap(Convolution(lambda z: np.exp(np.cos(2 * np.pi * z))), bias=1.0),  # cupy FFT
        LayerNormProjection(gain=np.arange(1.0, 7.0), shift=0.5, eps=1e-6),
        SphereProjection(),
    ]
    for op in ops:
        host = op(u, grids)
        device = op(cupy.asarray(u), grids)
        assert isinstance(device, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(device), host, rtol=1e-12, atol=1e-12)
