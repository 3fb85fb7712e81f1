"""Positions and token weights in attention against written-out references (audit of the
operators): RoPE against HuggingFace's own ``apply_rotary_pos_emb`` in float64, ALiBi and
sliding windows on Gauss-Legendre tokens against the softmax with log-weights, and no warning
from torch for ALiBi's slopes."""
from __future__ import annotations

import warnings

import numpy as np

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import ALiBi, Attention, Grids, RoPE
from tests.conftest import require

HEADS, D, D_H = 2, 8, 6


def _weights(seed):
    rng = np.random.default_rng(seed)
    return ([[rng.standard_normal((D_H, D)) / 3 for _ in range(HEADS)] for _ in range(3)]
            + [[rng.standard_normal((D, D_H)) / 3 for _ in range(HEADS)]])


def _attention(arrays, **options):
    return Attention(*[[PiecewiseConstant(a) for a in group] for group in arrays], **options)


def test_rope_is_huggingfaces_rotation():
    """Midpoint tokens with L = N and the table of Llama's inverse frequencies: the scores
    are those of transformers' apply_rotary_pos_emb (float64 cos/sin of positions 0..N-1)."""
    torch = require("torch")
    llama = require("transformers.models.llama.modeling_llama")
    n = 7
    arrays = _weights(0)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, D_H, 2) / D_H)
    u = np.random.default_rng(1).standard_normal((2, n, D))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor(inv_freq)[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    expected = 0.0
    for h in range(HEADS):
        q, k, v = (torch.tensor(u) @ torch.tensor(arrays[i][h]).T for i in range(3))
        q, k = llama.apply_rotary_pos_emb(q[:, None], k[:, None], emb.cos()[None], emb.sin()[None])
        p = torch.softmax(q[:, 0] @ k[:, 0].transpose(-1, -2) / np.sqrt(D_H), dim=-1)
        expected = expected + (p @ v) @ torch.tensor(arrays[3][h]).T
    expected = expected.numpy()
    grids = Grids(Midpoint(n), Midpoint(D), Midpoint(D_H), context_length=n)
    att = _attention(arrays, beta=np.sqrt(D_H), positions=RoPE(frequencies=inv_freq))
    for state in (u, torch.tensor(u)):
        got = np.asarray(att(state, grids))
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-13


def test_alibi_window_on_gauss_legendre_tokens_is_the_log_weight_softmax():
    """Gauss-Legendre tokens: softmax(beta q.k / d_h + log w_j - m_h (p_i - p_j)) over the keys
    with 0 <= p_i - p_j < 3, written out; torch gave it with a UserWarning about a read-only
    NumPy array (ALiBi's slopes), now without."""
    torch = require("torch")
    n, slopes = 9, np.array([0.5, 0.25])
    arrays = _weights(2)
    tokens = GaussLegendre(n)
    grids = Grids(tokens, Midpoint(D), Midpoint(D_H), context_length=n)
    w, p = np.asarray(tokens.quadrature_weights) / tokens.length, grids.positions()
    x = np.asarray(tokens.quadrature_nodes)
    u = np.cos(np.arange(2)[:, None, None] + 3.0 * x[None, :, None] + np.arange(D)[None, None, :])
    difference = p[:, None] - p[None, :]
    keep = (difference >= 0) & (difference < 3.0 - 1e-9)
    expected = 0.0
    for h in range(HEADS):
        q, k, v = (u @ arrays[i][h].T for i in range(3))
        s = 1.7 * q @ k.swapaxes(-1, -2) / D_H + np.log(w) - slopes[h] * difference
        s = np.where(keep, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        expected = expected + (e / e.sum(-1, keepdims=True)) @ v @ arrays[3][h].T
    att = _attention(arrays, beta=1.7, mask="causal", window=3, positions=ALiBi(slopes))
    assert np.max(np.abs(att(u, grids) - expected)) / np.max(np.abs(expected)) < 1e-13
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = att(torch.tensor(u), grids).numpy()
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-13
