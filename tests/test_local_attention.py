"""Sliding-window attention as a banded integral operator (design notes, section 10): a sparse
pattern, block-by-block computation equal to the dense masked path, O(N W) storage."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import SmoothRandom
from ctformer.operators import Attention, Grids, RoPE, local_attention, quadrature_attention, window_pattern


def _dense_window(p, pk, w):
    diff = p[:, None] - pk[None, :]
    return (diff >= -1e-9) & (diff < w - 1e-9)  # positions that are exact up to rounding


@pytest.mark.parametrize("n, w", [(10, 3), (17, 1), (8, 20), (33, 4.5)])
def test_window_pattern_is_the_band(n, w):
    p = np.arange(n) + np.r_[0, np.full(n - 1, 1e-15)]  # integers up to rounding
    pattern = window_pattern(p, w)
    assert pattern.shape == (n, n) and pattern.dtype == bool
    expected = _dense_window(np.arange(n, dtype=float), np.arange(n, dtype=float), w)
    assert np.array_equal(pattern.todense(), expected)
    assert pattern.nnz == expected.sum() <= n * np.ceil(w)


@pytest.mark.parametrize("block", [None, 1, 3, 8])
def test_local_attention_equals_the_dense_masked_path(block, rng):
    n, w = 23, 5
    q, k = rng.standard_normal((2, 2, 3, n, 4))
    v = rng.standard_normal((2, 3, n, 6))
    p = np.arange(n, dtype=float)
    weights = GaussLegendre(n).quadrature_weights
    beta = np.array([0.5, 1.0, 2.0])[:, None, None][..., 0, 0]
    dense = _dense_window(p, p, w)
    ref = quadrature_attention(q, k, v, beta=beta, weights=weights, mask=dense)
    got = local_attention(q, k, v, beta=beta, weights=weights, pattern=window_pattern(p, w), block=block)
    assert np.abs(got - ref).max() < 1e-14


def test_local_attention_with_padding_and_leading_pattern_axes(rng):
    import sparse

    n = 12
    q, k, v = rng.standard_normal((3, 2, 2, n, 3))
    pad = np.ones((2, n), bool)
    pad[1, 7:] = False
    p = np.arange(n, dtype=float)
    keep = _dense_window(p, p, 4)
    # a (batch, head, N, N) pattern stored sparsely
    full = np.broadcast_to(keep, (2, 2, n, n)) & pad[:, None, None, :]
    full = full.copy()
    empty = ~full.any(-1)
    assert empty[1, :, 10:].all() and empty.sum() == 4  # windows holding only padding
    full[empty] = np.broadcast_to(np.eye(n, dtype=bool), full.shape)[empty]  # those attend to themselves
    ref = quadrature_attention(q, k, v, beta=1.3, mask=full)
    got = local_attention(q, k, v, beta=1.3, pattern=sparse.COO.from_numpy(full), block=5)
    assert np.abs(got - ref).max() < 1e-14
    # the same through a 2-D pattern, a key mask and the self fallback for empty rows
    got = local_attention(q, k, v, beta=1.3, pattern=window_pattern(p, 4), key_mask=pad[:, None, :],
                          block=5, fallback_to_self=True)
    assert np.abs(got - ref).max() < 1e-14
    # without the fallback a query that keeps no key gets output zero (an empty integral)
    got = local_attention(q, k, v, beta=1.3, pattern=window_pattern(p, 4), key_mask=pad[:, None, :])
    assert np.all(got[empty] == 0) and np.abs(got[~empty] - ref[~empty]).max() < 1e-14
    with pytest.raises(TypeError, match="pydata sparse"):
        local_attention(q, k, v, beta=1.3, pattern=keep)


def test_windowed_attention_operator_on_refined_tokens(rng):
    """At a fixed context length the window W is a length in positions: refined tokens see W n / L keys."""
    ks = [[SmoothRandom(4 * i + h, scale=1.0) for h in range(2)] for i in range(4)]
    att = Attention(*ks, beta=2.0, mask="causal", window=3.0, positions=RoPE(theta=100.0))
    grids = Grids(Midpoint(24), Midpoint(5), Midpoint(4), context_length=8)  # 3 tokens per position
    u = rng.standard_normal((24, 5))
    got = att(u, grids)
    p = grids.positions()
    dense = _dense_window(p, p, 3.0)  # the band as an explicit dense mask: 9 keys per row
    assert dense.sum(1).max() == 9
    ref = _masked(att, u, grids, dense)
    assert np.abs(got - ref).max() < 1e-13


def _masked(att, u, grids, keep):
    """Attention evaluated row by row with only the kept keys (a dense reference)."""
    out = np.empty_like(u)
    for i in range(u.shape[0]):
        out[i] = _one_row(att, u, grids, i, np.flatnonzero(keep[i]))
    return out


def _one_row(att, u, grids, i, rows):
    from ctformer.operators.positions import rotate

    sig, y = grids.head_features, grids.features
    cos, sin = att.positions.tables(grids)
    total = 0
    for h in range(att.heads):
        q = u @ att.W_Q[h].matrix(sig, y).T
        k = u @ att.W_K[h].matrix(sig, y).T
        v = u @ att.W_V[h].matrix(sig, y).T
        q, k = rotate(np, q, cos, sin), rotate(np, k, cos, sin)
        s = att.beta[h] * (q[i] * sig.quadrature_weights) @ k[rows].T
        e = np.exp(s - s.max())
        total = total + (e / e.sum()) @ v[rows] @ att.W_O[h].matrix(y, sig).T
    return total


def test_pattern_storage_is_linear_in_n():
    w = 16
    sizes = [window_pattern(np.arange(float(n)), w).nnz for n in (1000, 2000, 4000)]
    assert sizes == [n * w - w * (w - 1) // 2 for n in (1000, 2000, 4000)]
