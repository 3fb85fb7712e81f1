"""torch's fused attention kernel as a path of quadrature attention
(ctformer._numerics.fused.fused_attention): softmax attention to rounding against a longdouble
reference, for plain and causal masks, per-head beta, grouped key/value heads and any number
of leading axes; the same bits for 1, 2 and 3 threads; the other cases (weights, padding
masks, the half-weight diagonal, chunks, small problems) keep the library's own paths."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import dense, fused, torch_threads
from ctformer.operators.quadrature_attention import quadrature_attention

from .conftest import fused_path_on, require

torch = require("torch")


def _exact(q, k, v, beta, causal):
    q, k, v = (np.asarray(a, dtype=np.longdouble) for a in (q, k, v))
    s = np.asarray(beta, dtype=np.longdouble) * np.einsum("...id,...jd->...ij", q, k)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).astype(np.float64)


class _Calls(list):
    """The causal flags of the fused calls; ``forced``: the path was turned on for the test."""

    forced = False


@pytest.fixture
def fused_calls(monkeypatch):
    """The fused path on (where this machine's torch allows it), its calls counted."""
    forced = fused_path_on(monkeypatch)
    calls = _Calls()
    calls.forced = forced
    real = fused.fused_attention
    monkeypatch.setattr(fused, "fused_attention", lambda *a: calls.append(a[4]) or real(*a))  # a[4]: causal
    return calls


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-14), (np.float32, 3e-6)])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_equals_softmax_attention(fused_calls, dtype, tol, causal):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 200, 16)).astype(dtype) for _ in range(3))
    beta = np.array([0.2, 0.5, 1.0])[:, None, None]         # per head
    out = quadrature_attention(q, k, v, beta=beta.reshape(3), mask="causal" if causal else None)
    exact = _exact(q, k, v, beta, causal)
    assert fused_calls == [causal] and out.dtype == dtype and out.shape == (2, 3, 200, 16)
    assert np.max(np.abs(out - exact)) < tol * np.max(np.abs(exact))


@pytest.mark.parametrize("lead", [(), (5,), (2, 2, 3)])
def test_fused_takes_any_number_of_leading_axes(fused_calls, lead):
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((*lead, 300, 8)) for _ in range(3))
    out = quadrature_attention(q, k, v, beta=0.7, mask="causal")
    assert fused_calls == [True]
    exact = _exact(q, k, v, 0.7, True)
    assert np.max(np.abs(out - exact)) < 1e-14 * np.max(np.abs(exact))


def test_grouped_key_value_heads_are_not_repeated(fused_calls):
    """Queries (B, H_kv, G, N, d) against keys and values (B, H_kv, 1, M, d): the kernel's
    grouped-query form, equal to the repeated heads."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 2, 3, 150, 8))
    k, v = (rng.standard_normal((2, 2, 1, 150, 8)) for _ in range(2))
    out = quadrature_attention(q, k, v, beta=0.4, mask="causal")
    exact = _exact(q, np.broadcast_to(k, q.shape), np.broadcast_to(v, q.shape), 0.4, True)
    assert fused_calls == [True] and out.shape == q.shape
    assert np.max(np.abs(out - exact)) < 1e-14 * np.max(np.abs(exact))


def test_fused_bits_do_not_depend_on_threads(fused_calls, monkeypatch):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 4, 700, 32)).astype(np.float32) for _ in range(3))
    runs = []
    for count in ("1", "2", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(quadrature_attention(q, k, v, beta=0.2, mask="causal"))
    assert len(fused_calls) == 3
    if fused_calls.forced:  # off here, and for the reason the check gives: MKL's bits vary
        assert not torch_threads._thread_count_invariant(require("torch"))
    else:
        assert all(np.array_equal(r, runs[0]) for r in runs[1:])


def test_other_problems_keep_the_library_paths(fused_calls):
    """Weights, a padding mask, the half-weight diagonal, a chunk, or fewer scores than
    ``_FUSED_MIN_ENTRIES``: not the fused kernel, and still softmax attention to rounding."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 300, 8)) for _ in range(3))
    w = rng.uniform(0.5, 1.5, 300)
    keep = rng.uniform(size=(300, 300)) < 0.7
    keep[:, 0] = True
    cases = [dict(weights=w), dict(mask=keep), dict(mask="causal", diagonal="half"), dict(chunk=64)]
    for case in cases:
        quadrature_attention(q, k, v, beta=0.3, **case)
    small = rng.standard_normal((1, 100, 8))
    assert 100 * 100 < dense._FUSED_MIN_ENTRIES
    out = quadrature_attention(small, small, small, beta=0.3)
    assert fused_calls == []
    exact = _exact(small, small, small, 0.3, False)
    assert np.max(np.abs(out - exact)) < 1e-14 * np.max(np.abs(exact))
