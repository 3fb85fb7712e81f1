"""Edge cases of the operators against independent references.

References: torch's ``scaled_dot_product_attention`` and ``layer_norm`` and a float64 NumPy
softmax evaluated on the same (rounded) inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.operators import Grids, LayerNormProjection, local_attention, quadrature_attention, window_pattern

from .conftest import require


def _softmax_attention(q, k, v, beta, bias=None):
    """float64 softmax(beta q.k + bias) v, row by row, of the given (rounded) inputs."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = beta * (q @ k.swapaxes(-1, -2)) + (0.0 if bias is None else bias)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _rel(a, b):
    return float(np.abs(np.asarray(a, dtype=np.float64) - b).max() / np.abs(b).max())


# -- float16 attention: float32 arithmetic, one rounding ----------------------------------------
@pytest.mark.parametrize("n", [64, 300])
def test_float16_attention_is_as_accurate_as_torch_float16(n, rng):
    # beta q.k reaches ~100: scores rounded in float16 (0.03-0.06 absolute) put 3-6% errors on
    # the softmax weights; before the fix the error was 2.7e-2 (n=64) and 2.1e-2 (n=300)
    torch = require("torch")
    q, k, v = (rng.standard_normal((n, 8)).astype(np.float16) for _ in range(3))
    beta = 30.0
    out = quadrature_attention(q, k, v, beta=beta)
    assert out.dtype == np.float16
    reference = _softmax_attention(q, k, v, beta)
    peer = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), scale=beta).numpy()
    assert _rel(peer, reference) < 1e-3
    assert _rel(out, reference) < 1e-3  # float16's own rounding of the result (2^-11 = 4.9e-4)


def test_float16_causal_weighted_attention_and_check_false(rng):
    n = 200  # 1.1e-2 and 1.4e-2 before the fix
    q, k, v = (rng.standard_normal((2, n, 8)).astype(np.float16) for _ in range(3))
    w = rng.uniform(0.1, 1.0, n)
    bias = np.where(np.tril(np.ones((n, n), bool)), np.log(w), -np.inf)
    reference = _softmax_attention(q, k, v, 30.0, bias)
    for check in (True, False):
        out = quadrature_attention(q, k, v, beta=30.0, weights=w, mask="causal", check=check)
        assert out.dtype == np.float16
        assert _rel(out, reference) < 1e-3, check


def test_float16_local_attention_with_alibi_and_window(rng):
    # 1.6e-2 (ALiBi) and 1.9e-2 (window) before the fix
    n, heads = 200, 2
    q, k, v = (rng.standard_normal((heads, n, 8)).astype(np.float16) for _ in range(3))
    p = np.arange(n, dtype=np.float64)
    slopes = np.array([0.25, 0.0625])
    causal = np.tril(np.ones((n, n), bool))
    alibi = np.where(causal, -slopes[:, None, None] * (p[:, None] - p[None, :]), -np.inf)
    out = local_attention(q, k, v, beta=30.0, slopes=slopes, positions=p, causal=True)
    assert out.dtype == np.float16 and _rel(out, _softmax_attention(q, k, v, 30.0, alibi)) < 1e-3
    window = causal & (p[:, None] - p[None, :] < 5)
    out = local_attention(q, k, v, beta=30.0, pattern=window_pattern(p, 5))
    reference = _softmax_attention(q, k, v, 30.0, np.where(window, 0.0, -np.inf))
    assert out.dtype == np.float16 and _rel(out, reference) < 1e-3


# -- local_attention refuses bad slopes and beta ------------------------------------------------
@pytest.mark.parametrize("slopes, match", [
    (np.array([0.5, np.nan, 0.1]), "slopes must be finite numbers >= 0"),
    (np.array([0.5, -0.1, 0.1]), "slopes must be finite numbers >= 0"),
    (np.array([0.5, 0.1]), r"slopes of shape \(2,\) do not broadcast .* shape \(3,\)"),
    (np.ones((3, 1, 1)), r"slopes of shape \(3, 1, 1\) do not broadcast"),
])
def test_local_attention_refuses_bad_slopes_by_name(slopes, match, rng):
    # NaN slopes gave NaN outputs, even with check=True; wrong shapes a bare NumPy broadcast error
    q, k, v = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))
    with pytest.raises(ValueError, match=match):
        local_attention(q, k, v, beta=1.0, slopes=slopes, positions=np.arange(6.0), check=True)


def test_local_attention_with_check_refuses_non_finite_beta(rng):
    q, k, v = (rng.standard_normal((3, 6, 4)) for _ in range(3))
    p = np.arange(6.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        local_attention(q, k, v, beta=np.nan, pattern=window_pattern(p, 3), check=True)
    with pytest.raises(ValueError, match="beta must be finite"):
        local_attention(q, k, v, beta=np.array([1.0, np.inf, 1.0])[:, None, None], slopes=np.ones(3),
                        positions=p, check=True)
    # valid slopes and beta: softmax with the distance bias, against the float64 formula
    slopes = np.array([0.5, 0.0, 2.0])
    out = local_attention(q, k, v, beta=0.7, slopes=slopes, positions=p, check=True)
    bias = -slopes[:, None, None] * np.abs(p[:, None] - p[None, :])
    assert _rel(out, _softmax_attention(q, k, v, 0.7, bias)) < 1e-14


# -- LayerNorm of a constant float32 token ------------------------------------------------------
@pytest.mark.parametrize("engine", ["numba", "numpy"])
@pytest.mark.parametrize("d", [7, 768])
def test_layernorm_of_constant_float32_tokens_is_the_shift(d, engine, rng, monkeypatch):
    # BERT's eps = 1e-12: float32 weights 1/d summing to 1 + 6e-8 left a mean off by one ulp,
    # normalized to +-0.28 (d=768) and +-0.41 (d=7), and to +-0.98 on the NumPy engine; torch
    # gives exactly the shift
    torch = require("torch")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", engine)
    c = rng.uniform(-10, 10, 50).astype(np.float32)
    u = np.repeat(c[:, None], d, axis=1)
    shift = rng.standard_normal(d)
    out = LayerNormProjection(shift=shift, eps=1e-12)(u, Grids(Midpoint(50), Midpoint(d)))
    peer = torch.nn.functional.layer_norm(torch.from_numpy(u), (d,), None,
                                          torch.from_numpy(shift.astype(np.float32)), 1e-12).numpy()
    assert out.dtype == np.float32
    assert np.abs(out.astype(np.float64) - peer).max() < 1e-6


@pytest.mark.parametrize("options", ["alibi", "window", "alibi-window", "none"])
def test_float16_attention_operator_with_alibi_and_windows(options):
    """The Attention operator on a float16 state against itself on that state in float64:
    the error is the float16 rounding of the projections (2.4e-2 here with scores near 100),
    the same with ALiBi and windows, whose heads were attended in float16 (0.10-0.17 before)."""
    import math

    from ctformer.kernels import PiecewiseConstant
    from ctformer.operators import ALiBi, Attention, Causal, SlidingWindow

    n, d, d_h, heads = 300, 16, 8, 2
    rng = np.random.default_rng(0)
    mats = {name: 2 * rng.standard_normal((heads, d_h, d)) for name in "QKV"}
    mats["O"] = rng.standard_normal((heads, d, d_h)) / math.sqrt(d_h * heads)
    kernels = [[PiecewiseConstant(m) for m in mats[name]] for name in "QKVO"]
    window = Causal() & SlidingWindow(16)
    chosen = {"alibi": dict(positions=ALiBi()), "window": dict(mask=window),
              "alibi-window": dict(mask=window, positions=ALiBi()), "none": {}}[options]
    attention = Attention(*kernels, beta=[8.0, 8.0], **chosen)
    grids = Grids(Midpoint(n), Midpoint(d), Midpoint(d_h), context_length=n)
    u = rng.standard_normal((n, d)).astype(np.float16)
    out = attention(u, grids)
    assert out.dtype == np.float16
    assert _rel(out, attention(u.astype(np.float64), grids)) < 0.03


# -- torch half precision: float32 arithmetic, one rounding, as torch's own kernels -------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_half_normalizations_are_as_accurate_as_torch(dtype):
    """Tokens near 1000: normalized in bfloat16 arithmetic they were 0.39 off (float16 0.11),
    where torch's layer_norm, which accumulates in float32, is 7e-3 (1e-3) off."""
    torch = require("torch")
    from ctformer.operators import RMSNorm

    half = getattr(torch, dtype)
    x = (3 * torch.randn(8, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 1000).to(half)
    grids = Grids(Midpoint(8), Midpoint(64))
    for ours, peer in ((LayerNormProjection(eps=1e-5), lambda a: torch.nn.functional.layer_norm(a, (64,), eps=1e-5)),
                       (RMSNorm(eps=1e-5), lambda a: torch.nn.functional.rms_norm(a, (64,), eps=1e-5))):
        out, exact = ours(x, grids), peer(x.double())
        assert out.dtype == half
        assert float((out.double() - exact).abs().max()) <= 1.01 * float((peer(x).double() - exact).abs().max()) + 1e-12


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_half_attention_is_as_accurate_as_sdpa(dtype):
    """Before: bfloat16 0.20 off a float64 softmax of the same inputs (SDPA 7.7e-3), float16 0.022 (9.6e-4)."""
    torch = require("torch")
    half = getattr(torch, dtype)
    q, k, v = (torch.randn(2, 300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(i)).to(half)
               for i in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    exact = sdpa(q.double(), k.double(), v.double(), scale=3.0)
    out = quadrature_attention(q, k, v, beta=3.0)
    assert out.dtype == half
    assert float((out.double() - exact).abs().max()) <= 1.5 * float((sdpa(q, k, v, scale=3.0).double() - exact).abs().max())
