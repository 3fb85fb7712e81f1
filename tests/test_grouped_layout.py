"""Grouped-query attention writes its output in the layout of the heads' concatenation: the
query heads ``(H_kv, G)`` of a key/value head lie next to each other in memory, after the
token axis, so that the caller's ``(..., N, H_kv G e)`` concatenation is a view (no copy),
on every NumPy path (small batched, small blocks, streamed, chunks of grouped heads, torch's
fused kernel). The values
are checked against a float64 (longdouble) evaluation of the formula with the key/value heads
repeated."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import dense, grouped, streamed

from .conftest import fused_path_on, require


def _exact(q, k, v, beta, causal):
    """softmax(beta q k^T) v in longdouble, k and v repeated over the groups."""
    q, k, v = (np.asarray(a, dtype=np.longdouble) for a in (q, k, v))
    s = beta * np.einsum("...id,...jd->...ij", q, k)
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).astype(np.float64)


def _grouped(rng, batch, kv_heads, groups, n, d):
    q = rng.standard_normal((batch, kv_heads, groups, n, d))
    k, v = (rng.standard_normal((batch, kv_heads, 1, n, d)) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("lead, head_axes", [((3, 4, 2), 2), ((4, 2), 2), ((5,), 1), ((3, 6), 1), ((2, 3, 1), 1)])
def test_output_array_concatenates_heads_as_a_view(lead, head_axes):
    out = streamed.output_array(lead, 7, 5, np.float64, head_axes)
    assert out.shape == (*lead, 7, 5)
    heads = int(np.prod(lead[-head_axes:]))
    merged = out.reshape(*lead[:len(lead) - head_axes], heads, 7, 5)
    concat = merged.swapaxes(-3, -2).reshape(*merged.shape[:-3], 7, heads * 5)
    assert np.shares_memory(concat, out)
    # the view reads what was written: head h's entry (i, j) at concat[..., i, h e + j]
    out[...] = np.arange(out.size).reshape(out.shape)
    h = heads - 1
    np.testing.assert_array_equal(concat[..., 2, 5 * h:5 * h + 5], merged[..., h, 2, :])


# (batch, H_kv, G, N): one batched pass; blocks of problems (more than 2^20 scores in all,
# fewer than 2^16 each); streamed query chunks (at least 2^16 scores per problem)
@pytest.mark.parametrize("shape, path", [((2, 2, 3, 12), "small"), ((4, 2, 4, 200), "small_blocks"),
                                         ((2, 2, 3, 300), "stream")])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_paths_match_the_formula_with_repeated_heads(monkeypatch, shape, path, causal):
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")  # the library's own paths, not torch's kernel
    batch, kv_heads, groups, n = shape
    rng = np.random.default_rng(n)
    q, k, v = _grouped(rng, batch, kv_heads, groups, n, 8)
    beta = 0.4
    mask = "causal" if causal else None
    called = []
    # long causal grouped problems take chunks of all the heads of a group (test_grouped_chunks)
    module = grouped if path == "stream" and grouped.applies(q, k, v, shape[:3], None, causal, None, None) \
        else streamed
    path = "stream_groups" if module is grouped else path
    real = getattr(module, path)
    monkeypatch.setattr(module, path, lambda *a, **kw: called.append(path) or real(*a, **kw))
    got = dense.attend_trusted(q, k, v, beta, None, mask, "full")
    assert called and got.shape == q.shape
    assert streamed.head_axes(q, k, shape[:3]) == 2
    # the concatenation of the heads along the features is a view of the output
    heads = kv_heads * groups
    concat = got.reshape(batch, heads, n, 8).swapaxes(-3, -2).reshape(batch, n, heads * 8)
    assert np.shares_memory(concat, got)
    ref = _exact(q, np.broadcast_to(k, q.shape), np.broadcast_to(v, q.shape), beta, causal)
    assert np.max(np.abs(got - ref)) <= 1e-14 * np.max(np.abs(ref))
    # ungrouped heads (k as many as q) keep the one-axis layout and the same values
    flat = dense.attend_trusted(q, np.broadcast_to(k, q.shape).copy(), np.broadcast_to(v, q.shape).copy(),
                                beta, None, mask, "full")
    assert np.max(np.abs(flat - ref)) <= 1e-14 * np.max(np.abs(ref))


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_fused_kernel_writes_the_concatenation_layout(monkeypatch, causal):
    require("torch")
    from ctformer._numerics import fused

    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    fused_path_on(monkeypatch)
    rng = np.random.default_rng(7)
    q, k, v = _grouped(rng, 2, 2, 3, 40, 8)
    got = dense.attend_trusted(q, k, v, 0.3, None, "causal" if causal else None, "full")
    concat = got.reshape(2, 6, 40, 8).swapaxes(-3, -2).reshape(2, 40, 48)
    assert np.shares_memory(concat, got)
    ref = _exact(q, np.broadcast_to(k, q.shape), np.broadcast_to(v, q.shape), 0.3, causal)
    assert np.max(np.abs(got - ref)) <= 1e-14 * np.max(np.abs(ref))
