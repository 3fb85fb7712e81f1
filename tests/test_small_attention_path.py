"""The small path of a discretized attention: a NumPy state whose products and scores are too
small for torch's call, row blocks or the streamed engine is evaluated in a few NumPy calls,
without the dispatch of the general path. It must give the general path's bits for every
mask, weight rule, head layout, position encoding, batch shape and dtype it takes, leave
the others to the general path, and agree with an evaluation of the formula from the
operator's own kernel matrices (longdouble)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model import ContinuousTransformer
from ctformer.operators import attention_flow

CASES = {  # name: random_smooth options, token rule
    "plain": (dict(), Midpoint),
    "causal": (dict(mask="causal"), Midpoint),
    "causal, half diagonal": (dict(mask="causal", diagonal="half"), Midpoint),
    "Gauss-Legendre weights": (dict(), GaussLegendre),
    "grouped query, causal": (dict(heads=4, kv_heads=2, mask="causal"), Midpoint),
    "RoPE, grouped query": (dict(heads=4, kv_heads=2, positions="rope", context_length=12.0), Midpoint),
}


def _attention(case, n=12, d=16):
    options, rule = CASES[case]
    options = {"heads": 2, **options}
    model = ContinuousTransformer.random_smooth(seed=3, layers=1, **options)
    grids = model.grids(rule(n), Midpoint(d))
    op = model.blocks[0].attention
    return op, grids, op.discretize(grids)


def _general(monkeypatch):
    """Make every discretized attention take the general path from now on."""
    monkeypatch.setattr(attention_flow._SmallPlan, "of", classmethod(lambda cls, attention, u: None))


def _state(rng, lead, n, d, dtype):
    return rng.standard_normal((*lead, n, d)).astype(dtype)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("lead, dtype", [((), np.float64), ((3,), np.float64), ((2, 2), np.float32)])
def test_small_path_gives_the_general_paths_bits(monkeypatch, case, lead, dtype):
    op, grids, flow = _attention(case)
    u = _state(np.random.default_rng(len(case)), lead, 12, 16, dtype)
    got = flow(u)
    assert (u.shape, np.dtype(dtype)) in flow._small and flow._small[(u.shape, np.dtype(dtype))] is not None
    _general(monkeypatch)
    general = op.discretize(grids)  # the same discretization, its remembered plans dropped
    general._small.clear()
    ref = general(u)
    assert got.dtype == ref.dtype == dtype and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def _formula(op, grids, u, causal, half):
    """The attention operator from its host kernel matrices, in longdouble (no RoPE)."""
    host = {k: (None if v is None else np.asarray(v, dtype=np.longdouble))
            for k, v in op.host_arrays(grids).items()}
    u = np.asarray(u, dtype=np.longdouble)
    heads, kv = host["Q"].shape[0], host["K"].shape[0]
    n = u.shape[-2]
    w = host["w_tokens"] if host["w_tokens"] is not None else np.full(n, 1.0 / n, dtype=np.longdouble)
    outs = []
    for h in range(heads):
        g = h // (heads // kv)
        q = (u @ host["Q"][h].T) * host["w_sigma"]
        k, v = u @ host["K"][g].T, u @ host["V"][g].T
        if host["b_Q"] is not None:
            q, k, v = q + host["b_Q"][h] * host["w_sigma"], k + host["b_K"][g], v + host["b_V"][g]
        s = host["beta"][h] * (q @ k.swapaxes(-1, -2)) + np.log(w)
        if causal:
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            if half:
                s = s + np.diag(np.full(n, math.log(0.5)))
        p = np.exp(s - s.max(-1, keepdims=True))
        outs.append((p / p.sum(-1, keepdims=True)) @ v)
    out = np.concatenate(outs, axis=-1) @ host["O"]
    return out if host["b_O"] is None else out + host["b_O"]


@pytest.mark.parametrize("case", [c for c in CASES if "RoPE" not in c])
def test_small_path_matches_the_formula(case):
    op, grids, flow = _attention(case)
    u = _state(np.random.default_rng(1), (2,), 12, 16, np.float64)
    got = flow(u)
    assert flow._small[(u.shape, u.dtype)] is not None
    options = CASES[case][0]
    ref = _formula(op, grids, u, options.get("mask") == "causal", options.get("diagonal") == "half").astype(np.float64)
    assert np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))


def test_general_path_keeps_large_products_padding_and_checked_calls(monkeypatch):
    op, grids, flow = _attention("plain", n=12, d=16)
    rng = np.random.default_rng(2)
    # 600 rows: row blocks (and torch's threaded products) belong to the general path
    big = _state(rng, (50,), 12, 16, np.float64)
    flow(big)
    assert flow._small[(big.shape, big.dtype)] is None
    # a padding mask composes a keep mask: the general path
    padded = flow.with_padding(np.array([[True] * 10 + [False] * 2]))
    u = _state(rng, (1,), 12, 16, np.float64)
    out = padded(u)
    assert padded._small[(u.shape, u.dtype)] is None
    assert np.all(np.isfinite(out))
    # check=True (what Attention.__call__ passes) never consults the small path
    flow._small.clear()
    flow(u, check=True)
    assert not flow._small
    # a non-contiguous state goes to the general path with the same values
    wide = _state(rng, (), 12, 32, np.float64)[:, ::2]
    np.testing.assert_array_equal(flow(wide), flow(np.ascontiguousarray(wide)))


def test_remembered_plans_are_bounded():
    _, _, flow = _attention("plain")
    rng = np.random.default_rng(4)
    leads = [(1,) * k + (b,) for k in range(5) for b in range(1, 15)]  # 70 shapes, each small
    assert len(leads) > attention_flow._SMALL_SHAPES
    for lead in leads:
        u = _state(rng, lead, 12, 16, np.float64)
        flow(u)
        assert flow._small[(u.shape, u.dtype)] is not None
    assert 0 < len(flow._small) <= attention_flow._SMALL_SHAPES


@pytest.mark.parametrize("case", ["causal", "RoPE, grouped query"])
@pytest.mark.parametrize("lead", [(0,), (2, 0)])
def test_an_empty_batch_gives_an_empty_result_on_both_paths(monkeypatch, case, lead):
    op, grids, flow = _attention(case)
    u = np.zeros((*lead, 12, 16))
    assert flow(u).shape == u.shape  # the small path (it failed to reshape the heads before)
    _general(monkeypatch)
    flow._small.clear()
    assert flow(u).shape == u.shape
    options, rule = CASES[case]
    model = ContinuousTransformer.random_smooth(seed=3, layers=2, heads=2 if "heads" not in options else 4,
                                                **{k: v for k, v in options.items() if k != "heads"})
    out = model.solve(u, tokens=rule(12), features=Midpoint(16), scheme="strang")
    assert out.shape == u.shape


@pytest.mark.parametrize("keep_shape", [(5, 7), (3, 5, 7), (1, 5, 7), (2, 3, 5, 7)])
def test_masked_scores_are_np_where_in_place_or_not(rng, keep_shape):
    """The batched pass masks its new scores in place where the mask broadcasts to them, and
    as np.where (a larger result) where the mask has more axes; either way np.where's values."""
    from ctformer._numerics import streamed

    s = rng.standard_normal((3, 5, 7))
    keep = rng.random(keep_shape) < 0.5
    expected = np.where(keep, s, -np.inf)
    got = streamed._masked(s.copy(), keep)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == expected.shape


@pytest.mark.parametrize("lead, most", [((8, 4, 3), 12), ((8, 12), 12), ((5, 7, 3), 4), ((6, 40), 7),
                                        ((2, 3, 4, 2), 5), ((13,), 4), ((3, 5), 1)])
def test_head_blocks_cover_every_problem_once(lead, most):
    """The tasks of many small problems: every problem in exactly one block of at most ``most``;
    whole runs of the last axis go together over the next one (grouped queries: 8 x 128 tokens
    of 4 key/value heads with 3 query heads each make 8 blocks of 12 heads, not 32 of 3)."""
    from ctformer._numerics import streamed

    blocks = streamed._head_blocks(lead, most)
    seen = np.zeros(lead, dtype=int)
    for block in blocks:
        assert 1 <= seen[block].size <= most
        seen[block] += 1
    np.testing.assert_array_equal(seen, 1)
    if lead == (8, 4, 3):
        assert len(blocks) == 8
    if most < lead[-1]:  # runs of the last axis: as many blocks as before the two-axis runs
        assert len(blocks) == math.prod(lead[:-1]) * -(-lead[-1] // most)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_many_heads_on_one_thread_take_fewer_tasks_with_the_same_bits(monkeypatch, dtype):
    """48 heads of 128 tokens inside a worker's task (a group of sequences) run in blocks of
    ``_ALONE_TASK_ELEMENTS`` scores, 2 blocks instead of 8, with the bits of the eight blocks
    of a two-thread pass; both agree with the formula in float64."""
    from ctformer._numerics import streamed, threads

    rng = np.random.default_rng(5)
    b, h, n, e = 4, 12, 128, 32
    qkv = rng.standard_normal((b, n, 3 * h * e)).astype(dtype)
    q, k, v = (qkv[..., i * h * e:(i + 1) * h * e].reshape(b, n, h, e).swapaxes(1, 2) for i in range(3))
    qs = q * dtype(0.2)
    calls = []
    small = streamed._small
    monkeypatch.setattr(streamed, "_small", lambda *a, **kw: calls.append(a[0].shape[:2]) or small(*a, **kw))
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    passes = streamed.small_blocks(qs, k, v, None, False, None, (b, h))
    assert len(calls) == 8
    calls.clear()
    alone = []
    # a group's task, as sequence groups run it: one BLAS thread (a threaded OpenBLAS product
    # rounds differently from a one-thread one on its Haswell kernel, AMD EPYC family 25 model 1)
    threads.run_blas_tasks(lambda next_task: [alone.append(streamed.small_blocks(qs, k, v, None, False, None, (b, h)))
                                              for _ in iter(next_task, None)], [0], True)
    assert calls == [(2, 12), (2, 12)]
    np.testing.assert_array_equal(alone[0], passes)
    s = qs.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    exact = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert np.abs(passes - exact).max() / np.abs(exact).max() < (2e-6 if dtype == np.float32 else 1e-14)


def test_rows_divided_in_the_outputs_memory_order(rng):
    """The weighted sums divided by their row sums in the memory order of a heads-interleaved
    output: NumPy's division of the same arrays, bit for bit."""
    from ctformer._numerics import streamed

    out = streamed.output_array((3, 4), 6, 5, np.float64)
    out[...] = rng.standard_normal(out.shape)
    sums = rng.uniform(0.5, 2.0, (3, 4, 6))
    expected = out / sums[..., None]
    streamed._divide_rows(out, sums)
    np.testing.assert_array_equal(out, expected)
