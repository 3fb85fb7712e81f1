"""Positions in the continuum (design notes, section 10): RoPE and ALiBi as kernels of the token
variable, absolute encodings at any position, and token refinement at a fixed context length."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import SmoothRandom
from ctformer.model import ContinuousTransformer
from ctformer.operators import (ALiBi, Attention, Grids, RoPE, alibi_slopes, interpolate_table,
                                sinusoidal_encoding)
from ctformer.operators.positions import rotate

from .conftest import fitted_order, require


def _u0(x, y):
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


# -- RoPE ----------------------------------------------------------------------------------------
def test_grids_positions_are_integers_for_run():
    grids = Grids(Midpoint(7), Midpoint(4), context_length=7)
    assert np.abs(grids.positions() - np.arange(7)).max() < 1e-14
    refined = Grids(Midpoint(21), Midpoint(4), context_length=7)  # position interpolation
    assert np.allclose(refined.positions(), (np.arange(21) + 0.5) / 3 - 0.5, rtol=0, atol=1e-14)


def test_rope_rotation_is_the_huggingface_convention():
    torch = require("torch")
    require("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d_h, n, theta = 8, 6, 500.0
    grids = Grids(Midpoint(n), Midpoint(4), Midpoint(d_h), context_length=n)
    rope = RoPE(theta=theta, frequencies=1.0 / theta ** (np.arange(0, d_h, 2) / d_h))
    cos, sin = rope.tables(grids)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 2, n, d_h))
    angles = np.arange(n)[:, None] * (1.0 / theta ** (np.arange(0, d_h, 2) / d_h))[None, :]
    c = torch.from_numpy(np.cos(np.concatenate([angles, angles], 1)))[None]
    s = torch.from_numpy(np.sin(np.concatenate([angles, angles], 1)))[None]
    q_ref, k_ref = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k), c, s)
    assert np.abs(rotate(np, q, cos, sin) - q_ref.numpy()).max() < 1e-15
    assert np.abs(rotate(np, k, cos, sin) - k_ref.numpy()).max() < 1e-15


def test_rope_scores_depend_only_on_position_differences(rng):
    """sum_sigma R(p) q . R(p') k is a function of p - p' (continuous frequencies, any positions)."""
    grids = Grids(GaussLegendre(5), Midpoint(4), Midpoint(12), context_length=9.3)
    rope = RoPE(theta=50.0)
    cos, sin = rope.tables(grids)
    q, k = rng.standard_normal((2, 12))
    p = grids.positions()
    scores = np.array([[rotate(np, q[None], cos[i:i + 1], sin[i:i + 1])[0]
                        @ rotate(np, k[None], cos[j:j + 1], sin[j:j + 1])[0] for j in range(5)] for i in range(5)])
    # closed form: sum over pairs of (q1 k1 + q2 k2) cos(w dp) + (q1 k2 - q2 k1) sin(w dp)
    omega = rope.omega(2 * Midpoint(12).nodes[:6])
    dp = p[:, None, None] - p[None, :, None]
    q1, q2, k1, k2 = q[:6], q[6:], k[:6], k[6:]
    closed = ((q1 * k1 + q2 * k2) * np.cos(omega * dp) + (q1 * k2 - q2 * k1) * np.sin(omega * dp)).sum(-1)
    assert np.abs(scores - closed).max() < 1e-13


def test_rope_needs_paired_head_features_and_a_context_length():
    k = SmoothRandom(0)
    att = Attention([k], [k], [k], [k], positions=RoPE())
    u = np.ones((4, 3)) + np.arange(3.0)
    with pytest.raises(ValueError, match=r"head_features must have an even number .*Midpoint\(2 m\)"):
        att(u, Grids(Midpoint(4), Midpoint(3), GaussLegendre(6), context_length=4))
    with pytest.raises(ValueError, match="no context_length"):
        att(u, Grids(Midpoint(4), Midpoint(3), Midpoint(6)))
    model = ContinuousTransformer.random_smooth(positions="rope", context_length=8)
    assert model.head_features == Midpoint(8)            # a paired default rule
    with pytest.raises(ValueError, match="head_features"):
        model.solve(_u0, tokens=Midpoint(8), features=GaussLegendre(6), head_features=GaussLegendre(6))


# -- ALiBi ---------------------------------------------------------------------------------------
def test_alibi_slopes_closed_form():
    assert np.array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    assert np.array_equal(alibi_slopes(4), 2.0 ** -(2.0 * np.arange(1, 5)))
    # 6 heads: the 4-head slopes, then every other slope of 8 heads
    assert np.array_equal(alibi_slopes(6), np.array([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]))
    with pytest.raises(ValueError, match="ALiBi has 3 slopes; the attention has 2 heads"):
        k = SmoothRandom(0)
        Attention([k, k], [k, k], [k, k], [k, k], positions=ALiBi([0.1, 0.2, 0.3]))


# 9 tokens: one batched pass; 600: streamed query chunks on the threads, the term added by blocks
@pytest.mark.parametrize("n", [9, 600])
@pytest.mark.parametrize("mask, diagonal", [(None, "full"), ("causal", "full"), ("causal", "half")])
def test_alibi_attention_is_softmax_with_a_distance_bias(mask, diagonal, n, rng):
    heads, d, d_h, length = 2, 5, 4, 13.0
    ks = [[SmoothRandom(10 * i + h, scale=1.0) for h in range(heads)] for i in range(4)]
    slopes = [0.3, 0.05]
    att = Attention(*ks, beta=[2.0, 3.0], mask=mask, diagonal=diagonal, positions=ALiBi(slopes))
    grids = Grids(GaussLegendre(n), Midpoint(d), Midpoint(d_h), context_length=length)
    u = rng.standard_normal((2, n, d))
    p = grids.positions()
    w = grids.tokens.quadrature_weights
    out = 0
    for h in range(heads):
        q, k, v = (u @ ks[i][h].matrix(grids.head_features, grids.features).T for i in range(3))
        s = att.beta[h] * (q @ k.swapaxes(-1, -2)) / d_h + np.log(w) - slopes[h] * np.abs(p[:, None] - p[None, :])
        if mask == "causal":
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            if diagonal == "half":
                s = s + np.diag(np.full(n, math.log(0.5)))
        e = np.exp(s - s.max(-1, keepdims=True))
        out = out + (e / e.sum(-1, keepdims=True)) @ v @ ks[3][h].matrix(grids.features, grids.head_features).T
    assert np.abs(att(u, grids) - out).max() / np.abs(out).max() < 1e-13


# -- absolute encodings --------------------------------------------------------------------------
def test_sinusoidal_encoding_and_table_interpolation():
    p = np.arange(6.0)
    table = sinusoidal_encoding(p, 8)
    i = np.arange(4)
    assert np.allclose(table[:, 0::2], np.sin(p[:, None] / 10000 ** (2 * i / 8)), rtol=0, atol=1e-15)
    assert np.allclose(table[:, 1::2], np.cos(p[:, None] / 10000 ** (2 * i / 8)), rtol=0, atol=1e-15)
    # a learned table between integers: linear interpolation, exact for linear functions ...
    linear = np.stack([2.0 * np.arange(5) + 1, -np.arange(5.0)], 1)
    x = np.array([-0.5, 0.25, 1.5, 3.9, 4.5])
    assert np.allclose(interpolate_table(linear, x), np.stack([2 * x + 1, -x], 1), rtol=0, atol=1e-14)
    # ... and second order for a smooth encoding sampled on a refined grid
    errors = []
    hs = [1.0, 0.5, 0.25, 0.125]
    for h in hs:
        grid = np.arange(0, 8 + 1e-9, h)
        rows = sinusoidal_encoding(grid, 4, base=100.0)
        fine = np.linspace(0, 8, 97)
        errors.append(np.abs(interpolate_table(rows, fine / h) - sinusoidal_encoding(fine, 4, base=100.0)).max())
    assert abs(fitted_order(hs, errors) - 2.0) < 0.1
    with pytest.raises(ValueError, match=r"positions must lie in \[-1/2, 4.5\]"):
        interpolate_table(linear, [5.0])


# -- token refinement at a fixed context length ----------------------------------------------------
_FEATURES, _HEADS = GaussLegendre(8), Midpoint(8)


def _model(positions, mask, **options):
    return ContinuousTransformer.random_smooth(
        positions=positions, context_length=32, normalization="rmsnorm", feedforward="swiglu", kv_heads=1,
        heads=2, mask=mask, **options)


def _midpoint_errors(model, levels, finest):
    """Max error at the nodes of Midpoint(levels[0]) with x >= 1/4 (nested levels n, 3n, ...)."""
    coarse = levels[0]

    def at_coarse(n):
        u = model.solve(_u0, tokens=Midpoint(n), features=_FEATURES, head_features=_HEADS)
        return u[np.arange(coarse) * (n // coarse) + (n // coarse) // 2]

    keep = (np.arange(coarse) + 0.5) / coarse >= 0.25
    reference = at_coarse(finest)
    return [np.abs(at_coarse(n) - reference)[keep].max() for n in levels]


def _gauss_errors(model, levels, finest, points=np.linspace(0.3, 0.95, 9)):
    def at(n):
        tokens = GaussLegendre(n)
        u = model.solve(_u0, tokens=tokens, features=_FEATURES, head_features=_HEADS)
        return model.grids(tokens, _FEATURES, _HEADS).evaluate(u, tokens=points)

    reference = at(finest)
    return [np.abs(at(n) - reference).max() for n in levels]


def test_rope_token_refinement_midpoint_second_order_gauss_spectral():
    causal = _model("rope", "causal", diagonal="half")
    levels = [36, 108, 324, 972]
    order = fitted_order([1 / n for n in levels], _midpoint_errors(causal, levels, 2916))
    assert 1.75 < order < 2.2, order
    full = _model("rope", None)
    errors = _gauss_errors(full, [16, 32, 64, 96], 160)
    assert errors[-1] < 1e-9 and errors[0] > 1e-3
    # super-algebraic: the local slope keeps growing
    slopes = [math.log(errors[i] / errors[i + 1]) / math.log(n2 / n1)
              for i, (n1, n2) in enumerate(zip([16, 32, 64], [32, 64, 96]))]
    assert slopes[0] < slopes[1] < slopes[2] and slopes[2] > 10


def test_alibi_kink_limits_gauss_legendre_to_second_order():
    """exp(-m |p - p'|) has a kink on the diagonal: midpoint stays second order (the kink sits at
    the centre of a cell, where the midpoint rule is still exact to O(h^2)), Gauss-Legendre
    drops from spectral to second order."""
    model = _model("alibi", None)
    levels = [36, 108, 324]
    mid = fitted_order([1 / n for n in levels], _midpoint_errors(model, levels, 972))
    assert abs(mid - 2.0) < 0.15, mid
    gauss_levels = [48, 96, 192]
    errors = _gauss_errors(model, gauss_levels, 768)
    gl = fitted_order([1 / n for n in gauss_levels], errors)
    assert 1.7 < gl < 2.6 and errors[-1] > 1e-8, (gl, errors)
