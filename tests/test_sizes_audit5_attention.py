"""Degenerate sizes at the attention entries, and causal attention with padding keys computed
without a dense (..., N, N) mask (audit of sizes, fifth round).

References: a float64 NumPy softmax over the kept keys written here (masks, ALiBi, soft cap,
token weights, grouped heads), and the closed form of a softmax over one key (that key's value).
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import ctformer.operators.attention_flow as flow
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import (ALiBi, Attention, Causal, Grids, SlidingWindow, alibi_slopes, local_attention,
                                quadrature_attention)


def _attention(rng, heads, d, d_h, kv_heads=None, **options):
    kv = heads if kv_heads is None else kv_heads

    def kernels(count, rows, cols):
        return [PiecewiseConstant(rng.standard_normal((rows, cols)) / 2) for _ in range(count)]

    return Attention(kernels(heads, d_h, d), kernels(kv, d_h, d), kernels(kv, d_h, d), kernels(heads, d, d_h),
                     kv_heads=kv_heads, **options)


def _reference(att, u, grids, keep, slopes=None, cap=None):
    """Float64 softmax attention over the kept keys ``keep`` (..., N, N), head by head; a query
    without keys gives zero (the integral over an empty set)."""
    d, d_h = u.shape[-1], len(grids.head_features.quadrature_nodes)
    w = np.asarray(grids.tokens.quadrature_weights, dtype=np.float64)
    p = grids.positions()
    out = np.zeros(u.shape)
    for h in range(att.heads):
        g = h * att.kv_heads // att.heads

        def project(kernel, rows, cols):
            return u @ kernel.matrix(Midpoint(rows), Midpoint(cols)).T

        q, k, v = project(att.W_Q[h], d_h, d), project(att.W_K[g], d_h, d), project(att.W_V[g], d_h, d)
        s = att.beta[h] * q @ k.swapaxes(-1, -2) / d_h
        if cap is not None:
            s = cap * np.tanh(s / cap)
        s = s + np.log(w)
        if slopes is not None:
            s = s - slopes[h] * np.abs(p[:, None] - p[None, :])
        s = np.where(keep, s, -np.inf)
        top = s.max(-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
        den = e.sum(-1, keepdims=True)
        o = np.where(den > 0, (e @ v) / np.where(den > 0, den, 1.0), 0.0)
        out += o @ att.W_O[h].matrix(Midpoint(d), Midpoint(d_h)).T
    return out


# -- no keys: refused by name --------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"key_mask": np.zeros(0, dtype=bool)}, {"block": 1}, {"check": True}],
                         ids=["plain", "key_mask", "block", "check"])
def test_local_attention_without_keys_is_refused_by_name(options):
    """Three queries and no keys crashed inside NumPy ('zero-size array to reduction operation
    maximum which has no identity'); quadrature_attention refuses the same call by name."""
    q, k, v = np.ones((3, 2)), np.ones((0, 2)), np.ones((0, 2))
    with pytest.raises(ValueError, match=r"k and v must hold at least one key token, got 0: pass keys "
                                         r"of shape \(\.\.\., M, d\) with M >= 1"):
        local_attention(q, k, v, beta=1.0, **options)
    with pytest.raises(ValueError, match="k and v must hold at least one key token, got 0"):
        quadrature_attention(q, k, v, beta=1.0)


def test_one_key_gives_its_value_exactly_in_both_entries():
    """A softmax over one key is that key's value, for one query or three, every option."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((1, 2)), rng.standard_normal((1, 4))
    expected = np.broadcast_to(v, (3, 4))
    np.testing.assert_array_equal(quadrature_attention(q, k, v, beta=3.0), expected)
    np.testing.assert_array_equal(local_attention(q, k, v, beta=3.0, key_mask=np.ones(1, dtype=bool)), expected)
    np.testing.assert_array_equal(local_attention(q, k, v, beta=3.0, slopes=np.array(0.5),
                                                  positions=np.arange(3.0), key_positions=np.zeros(1)), expected)


# -- the operator at one token, one feature, one head, head dimension 1, empty batches ------------
MASKS = [None, "causal", Causal(diagonal="half"), SlidingWindow(0.5), Causal() & SlidingWindow(1.0),
         Causal() & SlidingWindow(2.0)]


@pytest.mark.parametrize("mask", MASKS, ids=["none", "causal", "half", "window 0.5", "causal window 1",
                                             "causal window N+1"])
@pytest.mark.parametrize("alibi", [False, True], ids=["", "alibi"])
def test_one_token_is_its_own_value_under_every_mask(mask, alibi):
    """One token (d = 1, one head, d_h = 1): the output is W_O W_V u exactly (one key)."""
    rng = np.random.default_rng(1)
    att = _attention(rng, 1, 1, 1, mask=mask, positions=ALiBi() if alibi else None)
    grids = Grids(Midpoint(1), Midpoint(1), Midpoint(1), context_length=1)
    u = rng.standard_normal((2, 1, 1))
    value = u @ att.W_V[0].matrix(Midpoint(1), Midpoint(1)).T
    expected = value @ att.W_O[0].matrix(Midpoint(1), Midpoint(1)).T
    np.testing.assert_allclose(att(u, grids), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mask", ["causal", SlidingWindow(2.0)], ids=["causal", "window"])
def test_an_empty_batch_gives_an_empty_array_of_its_shape_and_dtype(dtype, mask):
    rng = np.random.default_rng(2)
    att = _attention(rng, 2, 4, 2, mask=mask)
    grids = Grids(Midpoint(3), Midpoint(4), Midpoint(2), context_length=3)
    u = np.zeros((0, 3, 4), dtype=dtype)
    for out in (att(u, grids), att(u, grids, padding_mask=np.ones((0, 3), dtype=bool)),
                att.discretize(grids)(u)):
        assert out.shape == (0, 3, 4) and out.dtype == dtype


# -- causal attention with padding keys: the causal part by index ---------------------------------
CASES = {  # heads, kv heads, tokens, options of Attention, ALiBi slopes, soft cap
    "causal": (2, 2, Midpoint(7), {}, None, None),
    "alibi": (2, 2, Midpoint(7), {"positions": ALiBi()}, alibi_slopes(2), None),
    "softcap": (2, 2, Midpoint(7), {"softcap": 0.7}, None, 0.7),
    "grouped": (4, 2, Midpoint(7), {}, None, None),
    "gauss tokens": (2, 2, GaussLegendre(7), {}, None, None),
    "window N+1": (2, 2, Midpoint(7), {"window": 8.0}, None, None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_streamed_causal_padding_matches_the_softmax_over_kept_keys(monkeypatch, case, dtype):
    """With the threshold at zero every padded causal call takes the streamed route: left
    padding (queries before the first real token keep no key: output zero), right padding and a
    fully padded sequence, against the float64 reference."""
    heads, kv, tokens, options, slopes, cap = CASES[case]
    rng = np.random.default_rng(3)
    att = _attention(rng, heads, 6, 2, kv_heads=kv, mask="causal", **options)
    grids = Grids(tokens, Midpoint(6), Midpoint(2), context_length=7)
    u = rng.standard_normal((3, 7, 6))
    real = np.ones((3, 7), dtype=bool)
    real[0, :3], real[1, 5:], real[2] = False, False, False
    monkeypatch.setattr(flow, "_DENSE_KEEP_BYTES", 0)
    f = att.discretize(grids, padding_mask=real)
    assert type(f.engine).__name__ == "_BandedEngine"
    i, j = np.arange(7)[:, None], np.arange(7)[None, :]
    expected = _reference(att, u, grids, (j <= i) & real[:, None, :], slopes, cap)
    got = f(u.astype(dtype))
    assert got.dtype == dtype and got.shape == u.shape
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert np.max(np.abs(got - expected)) <= tol * np.max(np.abs(expected))
    np.testing.assert_array_equal(got[2], 0.0)   # no real token: no key for any query
    np.testing.assert_allclose(att(u, grids, padding_mask=real), expected, rtol=0, atol=1e-12)


def test_padded_causal_attention_at_4096_tokens_holds_no_dense_mask():
    """N = 4096, a batch of 2, left padding: the combined mask (2, 1, 4096, 4096) was 32 MiB
    held by the operator, and a call peaked at 56 MiB beside it; the causal part is now applied
    by index (a call peaks at about 17 MiB), to the dense route's numbers."""
    rng = np.random.default_rng(4)
    att = _attention(rng, 2, 16, 8, mask="causal")
    n = 4096
    grids = Grids(Midpoint(n), Midpoint(16), Midpoint(8), context_length=n)
    u = rng.standard_normal((2, n, 16))
    real = np.ones((2, n), dtype=bool)
    real[0, :1000] = False
    streamed = att.discretize(grids, padding_mask=real)
    assert type(streamed.engine).__name__ == "_BandedEngine"
    assert streamed.engine.keys.shape == (2, 1, n)   # the keys alone, no (N, N) mask
    streamed(u)
    tracemalloc.start()
    try:
        got = streamed(u)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * n * n   # below the bytes of the dense boolean mask alone
    dense_route = flow._DenseEngine(True, "full", None, streamed.layout).with_keys(real)
    dense = flow.DiscretizedAttention(streamed.constants, streamed.layout, False, dense_route)(u)
    assert np.max(np.abs(got - dense)) <= 1e-12 * np.max(np.abs(dense))
    np.testing.assert_array_equal(got[0, :1000], 0.0)


def test_small_padded_causal_calls_keep_the_dense_mask():
    """Below the threshold (here 64 tokens, a batch of 4: 16 KiB of mask) the one dense mask
    stays: it is the faster route there."""
    rng = np.random.default_rng(5)
    att = _attention(rng, 2, 4, 2, mask="causal")
    grids = Grids(Midpoint(64), Midpoint(4), Midpoint(2), context_length=64)
    f = att.discretize(grids, padding_mask=np.ones((4, 64), dtype=bool))
    assert type(f.engine).__name__ == "_DenseEngine" and f.engine.keep.shape == (4, 1, 64, 64)
