"""Memory audit: sizes beyond the memory budget are refused by name before anything large is
allocated, and streamed attention keeps its extra memory independent of N.

Each refusal is measured with ``tracemalloc`` (NumPy reports its allocations there) under a
small ``CTFORMER_MEMORY_BUDGET``, so that nothing large is really allocated.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ctformer.discretizations import SizeTooLargeError
from ctformer.operators import quadrature_attention
from ctformer.operators.local_attention import local_attention, window_pattern
from ctformer.particles import SelfAttentionDynamics

MiB = 2**20


def _traced(call):
    """``(result or exception, peak bytes traced)`` of ``call()``."""
    tracemalloc.start()
    try:
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - returned to the test, which checks its kind
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _reference(q, k, v, beta, keep=None):
    """float64 softmax attention of the rows of ``q``, formed densely (a few rows only)."""
    s = beta * (q @ k.T)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p @ v) / p.sum(axis=-1, keepdims=True)


def test_broadcast_leading_axes_are_refused_before_the_output(monkeypatch):
    """(200, 1) queries against (1, 200) keys broadcast to 40000 problems: their output,
    200 * 200 * 64 * 8 float64 = 156 MiB, was allocated and computed past a budget of 95 MiB."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    q, k = np.zeros((200, 1, 64, 8)), np.zeros((1, 200, 64, 8))
    result, peak = _traced(lambda: quadrature_attention(q, k, k, beta=1.0))
    assert isinstance(result, SizeTooLargeError), result
    assert str(result).startswith("the attention output of shape (200, 200, 64, 8) would need 156 MiB, more "
                                  "than the memory budget of 95.4 MiB")
    assert "leading axes" in str(result)
    assert peak < MiB
    result, peak = _traced(lambda: local_attention(q, k, k, beta=1.0, causal=True))
    assert isinstance(result, SizeTooLargeError) and "(200, 200, 64, 8) would need 156 MiB" in str(result)
    assert peak < MiB


def test_a_chunk_beyond_the_budget_is_refused(monkeypatch, rng):
    """chunk=4096 with a mask meets all 4096 keys at once: 128 MiB of float64 scores per
    worker, allocated past a budget of 95 MiB; a chunk within it gives the dense answer."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    n = 4096
    q, k, v = (rng.standard_normal((n, 8)) for _ in range(3))
    keep = rng.uniform(size=(n, n)) > 0.5
    with pytest.raises(SizeTooLargeError, match=r"^chunk=4096: a block of 4096 x 4096 scores would need 128 MiB, "
                       r"more than the memory budget of 95.4 MiB .*; pass a smaller chunk, or chunk=None"):
        quadrature_attention(q, k, v, beta=0.5, mask=keep, chunk=4096)
    out, peak = _traced(lambda: quadrature_attention(q, k, v, beta=0.5, mask=keep, chunk=512))
    rows = [0, 1234, n - 1]
    np.testing.assert_allclose(out[rows], _reference(q[rows], k, v, 0.5, keep[rows]), rtol=1e-12, atol=1e-14)
    assert peak - out.nbytes < 64 * MiB


def test_a_block_beyond_the_budget_is_refused(monkeypatch, rng):
    """local_attention(block=4096) over two heads: 4096 x 4096 x 2 float64 scores, 256 MiB,
    computed past a budget of 95 MiB; the default blocks still run under it."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    n = 8192
    q, k, v = (rng.standard_normal((2, n, 4)) for _ in range(3))
    for options in (dict(causal=True), dict(pattern=window_pattern(np.arange(n, dtype=float), 64))):
        with pytest.raises(SizeTooLargeError, match=r"^a block of 4096 query rows x 4096 keys of scores for 2 "
                           r"\(batch, head\) problems would need 256 MiB.*pass a smaller block"):
            local_attention(q, k, v, beta=0.5, block=4096, **options)
    out, peak = _traced(lambda: local_attention(q, k, v, beta=0.5, causal=True))
    np.testing.assert_allclose(out[1, -1], _reference(q[1, -1:], k[1], v[1], 0.5)[0], rtol=1e-12)
    assert peak - out.nbytes < 64 * MiB


def test_a_mask_copy_beyond_the_budget_is_refused(monkeypatch, rng):
    """A mask whose first row keeps no key is copied (that row given every key): 4096 x 4096
    booleans, 16 MiB, made past a budget of 9.5 MiB."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e7")
    n = 4096
    q, k, v = (rng.standard_normal((n, 4)) for _ in range(3))
    keep = np.tril(np.ones((n, n), dtype=bool), -1)  # query 0 keeps nothing
    with pytest.raises(SizeTooLargeError, match=r"^a copy of the mask of shape \(4096, 4096\) would need 16 MiB.*"
                       r"use fewer tokens a call, or a mask whose every query keeps a key"):
        quadrature_attention(q, k, v, beta=0.5, mask=keep)
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    out = quadrature_attention(q, k, v, beta=0.5, mask=keep)
    assert np.all(out[0] == 0)
    np.testing.assert_allclose(out[n - 1], _reference(q[-1:], k, v, 0.5, keep[-1:])[0], rtol=1e-12)


@pytest.mark.parametrize("options", [dict(), dict(mask="causal"), dict(weights="uniform-random"),
                                     dict(mask="random")])
def test_streamed_attention_extra_memory_at_8192_tokens(monkeypatch, rng, options):
    """The streamed engine at N = 8192, float64, keeps at most 64 MiB beside its output (it
    measured 3.7-18 MiB; an N x N float64 score matrix would be 512 MiB)."""
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")
    n = 8192
    q, k, v = (rng.standard_normal((n, 64)) for _ in range(3))
    if options.get("weights"):
        options = dict(weights=rng.uniform(0.5, 1.5, n))
    if options.get("mask") == "random":
        options = dict(mask=rng.uniform(size=(1, n)) > 0.2)
    quadrature_attention(q[:600], k[:600], v[:600], beta=0.125)  # imports and compiled kernels first
    out, peak = _traced(lambda: quadrature_attention(q, k, v, beta=0.125, **options))
    assert peak - out.nbytes < 64 * MiB
    mask = options.get("mask")
    keep = mask if isinstance(mask, np.ndarray) else \
        np.tril(np.ones((2, n), dtype=bool), n - 2) if mask == "causal" else None
    if "weights" in options:
        log_w = np.log(options["weights"])
        s = 0.125 * (q[-2:] @ k.T) + log_w
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        expected = (p @ v) / p.sum(axis=-1, keepdims=True)
    else:
        expected = _reference(q[-2:], k, v, 0.125, keep)
    np.testing.assert_allclose(out[-2:], expected, rtol=1e-11)


def test_particle_states_honour_the_memory_budget(monkeypatch, rng):
    """1000 particles in 3 dimensions, 100 steps: 101 states of 24000 bytes (2424000 in all)
    were kept past CTFORMER_MEMORY_BUDGET=1e6; the hint save_every=3 keeps 35 (840000)."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e6")
    x = rng.standard_normal((1000, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    dynamics = SelfAttentionDynamics(1.0)
    with pytest.raises(SizeTooLargeError, match=r"keeps 101 states of 24000 bytes: 2424000 bytes needed .*, "
                       r"1000000 bytes allowed by the memory budget .*raise save_every \(to at least 3\)"):
        dynamics.solve(x, 1.0, 0.01)
    assert len(dynamics.solve(x, 1.0, 0.01, save_every=3)) == 35


@pytest.mark.parametrize("gated", [False, True])
def test_feed_forward_memory_is_independent_of_the_tokens(gated):
    """A feed-forward map of 3072 hidden nodes over 32768 tokens (float64) had kept its
    hidden rows in eight blocks: 98 MiB beside a 16 MiB output (gated: 194 MiB); now chunks of rows,
    13-25 MiB at 8192 and at 32768 tokens alike, and each row as the map of that row alone."""
    from ctformer.discretizations import Midpoint
    from ctformer.kernels import SmoothRandom
    from ctformer.operators import FeedForward, GatedFeedForward, Grids

    extra = []
    for n in (8192, 32768):
        grids = Grids(Midpoint(n), Midpoint(64), hidden=Midpoint(3072))
        op = (GatedFeedForward(SmoothRandom(0), SmoothRandom(1), SmoothRandom(2)) if gated
              else FeedForward(SmoothRandom(0), SmoothRandom(1))).discretize(grids)
        u = np.random.default_rng(n).standard_normal((n, 64))
        op(u[:600])  # imports and compiled loops first
        out, peak = _traced(lambda: op(u))
        extra.append(peak - out.nbytes)
        for row in (0, 5000, n - 1):
            np.testing.assert_allclose(out[row], op(u[row:row + 1])[0], rtol=1e-12, atol=1e-12)
    assert max(extra) < 40 * MiB
    assert extra[1] < 1.25 * extra[0]
