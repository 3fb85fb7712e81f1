"""Causal attention of grouped queries in chunks of all the query heads of a key/value head
(ctformer._numerics.grouped): the values of the operator's formula (longdouble, the key/value
heads repeated over their groups) and of the streamed engine's chunks of one head each, with
quadrature weights, the half-weight diagonal and one inverse temperature per head; the path
taken only where it applies."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import dense, grouped, streamed
from ctformer.operators import quadrature_attention

from .conftest import require


def _formula(q, k, v, beta, weights=None, half=False):
    """Causal quadrature attention in longdouble, ``k`` and ``v`` repeated over the groups."""
    q, k, v = (np.asarray(a, dtype=np.longdouble) for a in (q, k, v))
    k, v = np.broadcast_to(k, q.shape[:-1] + k.shape[-1:]), np.broadcast_to(v, q.shape[:-1] + v.shape[-1:])
    beta = np.asarray(beta, dtype=np.longdouble)  # a number, or one a head: against the leading axes
    s = beta[..., None, None] * np.einsum("...id,...jd->...ij", q, k)
    n = s.shape[-1]
    if weights is not None:
        s = s + np.log(np.asarray(weights, dtype=np.longdouble))
    if half:
        s = s + np.diag(np.full(n, np.log(np.longdouble(0.5))))
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _problem(shape, d=16, dtype=np.float64, seed=0):
    batch, kv_heads, groups, n = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, kv_heads, groups, n, d)).astype(dtype)
    k, v = (rng.standard_normal((batch, kv_heads, 1, n, d)).astype(dtype) for _ in range(2))
    return q, k, v


@pytest.fixture
def compiled(monkeypatch):
    """The compiled row kernel normalizing the scores (the path's condition)."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")


@pytest.mark.parametrize("groups, chunk", [(2, 192), (3, 128), (4, 96), (7, 64), (8, 64)])
def test_chunks_stack_about_384_rows(groups, chunk):
    assert grouped.chunk_rows(groups, 512, 8) == chunk


@pytest.mark.parametrize("groups, n, itemsize, chunk", [(3, 4096, 4, 128), (3, 8192, 4, 85), (3, 8192, 8, 0),
                                                        (8, 2048, 8, 64), (8, 4096, 8, 0)])
def test_chunks_hold_no_more_scores_than_the_streamed_engine(groups, n, itemsize, chunk):
    # 8 MiB of scores at most (the default chunk bytes), else the streamed engine's chunks
    assert grouped.chunk_rows(groups, n, itemsize) == chunk
    assert groups * chunk * n * itemsize <= 8 << 20


# at least 2^16 scores a head (N >= 256): the streamed branch, where the path sits
CASES = {  # name: (shape (batch, H_kv, G, N), quadrature_attention options, formula options)
    "three groups, a ragged last chunk": ((2, 2, 3, 300), {}, {}),
    "weights, half diagonal": ((1, 2, 4, 260), {"diagonal": "half"}, {"half": True}),
    "a beta per head": ((2, 1, 2, 400), {}, {}),
    "seven groups": ((1, 1, 7, 300), {}, {}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_grouped_chunks_give_the_formula_and_the_streamed_engine(compiled, monkeypatch, case, dtype):
    shape, options, formula = CASES[case]
    q, k, v = _problem(shape, dtype=dtype, seed=len(case))
    n = shape[-1]
    beta = np.float64(0.3)
    if case == "a beta per head":
        beta = np.linspace(0.2, 0.5, shape[2])  # one a query head of the group
    weights = np.random.default_rng(1).uniform(0.5, 1.5, n) if "weights" in case else None
    calls = []
    real = grouped.stream_groups
    monkeypatch.setattr(grouped, "stream_groups", lambda *a: calls.append(1) or real(*a))
    got = quadrature_attention(q, k, v, beta=beta, mask="causal", weights=weights, **options)
    assert calls == [1] and got.shape == q.shape and got.dtype == dtype
    # the heads' concatenation along the features stays a view of the output
    heads = shape[1] * shape[2]
    concat = got.reshape(shape[0], heads, n, 16).swapaxes(-3, -2).reshape(shape[0], n, heads * 16)
    assert np.shares_memory(concat, got)
    ref = _formula(q, k, v, beta, weights, **formula).astype(np.float64)
    tol = 1e-13 if dtype == np.float64 else 2e-6
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))
    # the streamed engine's chunks of one head each: the same values to rounding
    monkeypatch.setattr(grouped, "applies", lambda *a: False)
    one_head = quadrature_attention(q, k, v, beta=beta, mask="causal", weights=weights, **options)
    assert np.max(np.abs(got - one_head)) <= tol * np.max(np.abs(ref))


def test_the_path_applies_only_to_long_causal_grouped_problems(compiled):
    q, k, v = _problem((1, 2, 3, 300))
    lead = q.shape[:-2]
    assert grouped.applies(q, k, v, lead, None, True, None, None)
    assert not grouped.applies(q, k, v, lead, None, False, None, None)            # no causal mask
    assert not grouped.applies(q, k, v, lead, np.ones((300, 300), bool), True, None, None)  # a mask array
    assert not grouped.applies(q, k, v, lead, None, True, 64, None)               # a chunk asked for
    assert not grouped.applies(q, k, v, lead, None, True, None, object())         # score terms
    short = _problem((1, 2, 3, 255))                                               # fewer than 2 chunks of 128
    assert not grouped.applies(*short, short[0].shape[:-2], None, True, None, None)
    repeated = np.broadcast_to(k, q.shape).copy()                                  # one key head per query head
    assert not grouped.applies(q, repeated, repeated, lead, None, True, None, None)
    assert not grouped.applies(q, k[..., :299, :], v[..., :299, :], lead, None, True, None, None)  # N != M
    assert not grouped.applies(q.astype(np.float16), k, v, lead, None, True, None, None)


def test_without_the_compiled_kernels_the_streamed_engine_takes_the_problem(monkeypatch):
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    q, k, v = _problem((1, 2, 3, 300))
    assert not grouped.applies(q, k, v, q.shape[:-2], None, True, None, None)
    calls = []
    real = streamed.stream
    monkeypatch.setattr(streamed, "stream", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = dense.attend_trusted(q, k, v, 0.3, None, "causal", "full")
    ref = _formula(q, k, v, 0.3).astype(np.float64)
    assert calls and np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))
