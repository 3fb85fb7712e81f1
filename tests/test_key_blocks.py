"""Streamed attention with the keys in blocks (online softmax, ctformer._numerics.streamed):
every block updates the running row maxima, sums and weighted sums; the result is softmax
attention, checked against the float64 formula (scipy's softmax) with weights, causal masks,
a diagonal shift, chunks that do not divide the blocks, and scores far outside exp's range."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from ctformer._numerics import chunking, compiled, streamed
from ctformer._numerics.blocks import DEFAULT
from tests.conftest import require

TOL = {np.float32: 2e-6, np.float64: 1e-13}


def reference(q, k, v, beta, log_w=None, causal=False, shift=None):
    s = beta * np.einsum("bnd,bmd->bnm", q.astype(np.float64), k.astype(np.float64))
    if log_w is not None:
        s = s + log_w.astype(np.float64)
    if causal:
        n = s.shape[-1]
        if shift is not None:
            s[:, np.arange(n), np.arange(n)] += shift
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    return softmax(s, axis=-1) @ v.astype(np.float64)


@pytest.fixture
def blocks(monkeypatch):
    """The compiled kernels, and key blocks for every problem streamed (causal ones too)."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    original = streamed.key_blocked
    monkeypatch.setattr(streamed, "key_blocked", lambda m, keep=None, dtype=None, causal=False, key_block=None,
                        chunk_bytes=None: original(m, keep, dtype, False, key_block))
    monkeypatch.setattr(streamed, "whole_rows", lambda m, itemsize, geometry: False)


def test_the_rule_asks_for_one_block_and_no_mask(monkeypatch):
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    b = DEFAULT.key_block  # CTFORMER_GEMM pinned: the default geometry
    assert streamed.key_blocked(b, None, np.float64) and not streamed.key_blocked(b - 1, None, np.float64)
    assert not streamed.key_blocked(4 * b, np.ones((4, 4 * b), bool), np.float64)
    assert not streamed.key_blocked(4 * b, None, np.float64, causal=True)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    assert not streamed.key_blocked(4 * b, None, np.float64)
    # the chunk: the geometry's query rows where blocked, ~8 MiB of scores where not
    assert streamed.stream_chunk(8192, 8192, 8, 1, True) == DEFAULT.rows == 256
    assert streamed.stream_chunk(8192, 8192, 8, 1, False) == (8 << 20) // (8192 * 8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal, shift, weights, chunk", [
    (False, None, False, None), (False, None, True, 100), (True, None, False, None),
    (True, 0.7, True, 100), (True, -2.0, False, 300)])
def test_key_blocks_give_softmax_attention(blocks, dtype, causal, shift, weights, chunk):
    rng = np.random.default_rng(4)
    n = 2 * DEFAULT.key_block + 77  # a last block of 77 keys
    q, k, v = (rng.standard_normal((2, n, 16)).astype(dtype) for _ in range(3))
    log_w = np.log(rng.uniform(0.5, 2.0, n)).astype(dtype) if weights else None
    assert streamed.key_blocked(n, None, np.dtype(dtype), causal)
    out = streamed.stream(q, 0.3, k, v, log_w, None, causal, shift, (2,), chunk)
    ref = reference(q, k, v, 0.3, log_w, causal, shift)
    assert out.dtype == dtype
    assert np.abs(out - ref).max() / np.abs(ref).max() < TOL[dtype]


def test_scores_beyond_the_exponential_range_are_rescaled_not_overflowed(blocks):
    # row maxima grow from block to block by far more than exp's range (e^710 overflows)
    rng = np.random.default_rng(5)
    n = 3 * DEFAULT.key_block
    q = rng.standard_normal((1, 64, 8))
    k = rng.standard_normal((1, n, 8)) * np.linspace(1.0, 400.0, n)[:, None]
    v = rng.standard_normal((1, n, 3))
    out = streamed.stream(q, 1.0, k, v, None, None, False, None, (1,), None)
    ref = reference(q, k, v, 1.0)
    assert np.all(np.isfinite(out)) and np.abs(out - ref).max() / np.abs(ref).max() < 1e-13


def test_a_row_without_keys_in_a_block_keeps_its_running_values():
    require("numba")
    made = compiled._build()
    s = np.full((2, 4), 7.0)
    top, sums, alpha = np.array([1.0, -np.inf]), np.array([3.0, 0.0]), np.empty(2)
    # causal rows at positions 0, 1 against keys 4..7: no key for either
    made.exp_rows_online(s, np.empty(0), 4, 0, 0.0, top, sums, alpha)
    assert np.array_equal(s, np.zeros((2, 4))) and list(alpha) == [1.0, 1.0]
    assert list(top) == [1.0, -np.inf] and list(sums) == [3.0, 0.0]
    # and a block that raises the maximum: alpha = e^(old - new), sums rescaled (closed form)
    s = np.array([[0.0, 2.0, 1.0, 2.0]])
    top, sums, alpha = np.array([1.0]), np.array([3.0]), np.empty(1)
    made.exp_rows_online(s, np.empty(0), 0, -1, 0.0, top, sums, alpha)
    assert top[0] == 2.0 and abs(alpha[0] - np.exp(-1.0)) < 1e-16
    assert np.allclose(s[0], np.exp([-2.0, 0.0, -1.0, 0.0]), rtol=1e-15, atol=0)
    assert abs(sums[0] - (3.0 * np.exp(-1.0) + np.exp(-2.0) + 2.0 + np.exp(-1.0))) < 1e-15



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keys_that_fit_a_chunk_twice_over_come_in_whole_rows(monkeypatch, dtype):
    """Key blocks only where a chunk of the geometry's query rows cannot hold the scores of
    all keys in half its bytes: 512 rows x 2048 keys of float32 (4 MiB of an 8 MiB budget)
    take whole rows, without the online softmax, and 4096 keys stay in blocks (float64: 1024
    and 2048); both give softmax attention (float64 reference) with the same bits on one and
    two threads."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    from ctformer._numerics.blocks import Geometry

    geometry = Geometry(512, 512, 8 << 20)
    size = np.dtype(dtype).itemsize
    fits = 4096 // size * 2  # 2 x 512 rows x fits x itemsize = 8 MiB
    assert streamed.whole_rows(fits, size, geometry) and not streamed.whole_rows(fits + 1, size, geometry)
    made = compiled._build()
    original, online = made.exp_rows_online, []
    monkeypatch.setattr(made, "exp_rows_online", lambda *args: (online.append(1), original(*args))[1])
    rng = np.random.default_rng(8)
    for m, whole in ((fits, True), (2 * fits, False)):
        q, k, v = (rng.standard_normal((1, n, 16)).astype(dtype) for n in (700, m, m))
        online.clear()
        runs = []
        for count in ("1", "2"):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
            runs.append(streamed.stream(q[0], 0.3, k[0], v[0], None, None, False, None, (), None, geometry))
        assert (not online) is whole, (m, len(online))
        assert np.array_equal(runs[0], runs[1])
        ref = reference(q, k, v, 0.3)[0]
        assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_causal_problems_meet_their_keys_in_blocks_where_the_budget_would_cut_their_chunks(monkeypatch, dtype):
    """A causal problem takes key blocks exactly where a chunk of ``_CAUSAL_CHUNK_ROWS``
    queries cannot hold all its keys' scores in the chunk budget (it would otherwise be cut to
    fewer rows); below, whole causal chunks. Both give causal softmax attention (float64
    reference, with weights and a half diagonal), with the same bits on one and three threads."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    from ctformer._numerics.blocks import Geometry

    size, rows = np.dtype(dtype).itemsize, chunking._CAUSAL_CHUNK_ROWS
    m = 1000
    budget = rows * m * size  # exactly 192 rows of 1000 keys
    assert not streamed.key_blocked(m, None, dtype, True, 256, budget)
    assert streamed.key_blocked(m, None, dtype, True, 256, budget - 1)
    assert not streamed.key_blocked(m, None, dtype, True, 256)  # no budget given: chunks
    assert not streamed.key_blocked(m, np.ones((m, m), bool), dtype, True, 256, 1)  # a mask array: never
    assert not streamed.key_blocked(m, None, dtype, True, 512, 1)  # fewer than two blocks
    made = compiled._build()
    original, online = made.exp_rows_online, []
    monkeypatch.setattr(made, "exp_rows_online", lambda *args: (online.append(1), original(*args))[1])
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, m, 16)).astype(dtype) for _ in range(3))
    log_w = np.log(rng.uniform(0.5, 2.0, m)).astype(dtype)
    shift = float(np.log(0.5))
    ref = reference(q, k, v, 0.3, log_w, True, shift)
    for chunk_bytes, blocked in ((budget, False), (budget - 1, True)):
        geometry = Geometry(256, 512, chunk_bytes)
        online.clear()
        runs = []
        for count in ("1", "3"):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
            runs.append(streamed.stream(q, 0.3, k, v, log_w, None, True, shift, (2,), None, geometry))
        assert bool(online) is blocked, (chunk_bytes, len(online))
        assert np.array_equal(runs[0], runs[1])
        assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extra", [0, 300])
def test_from_one_block_of_keys_the_chunks_keep_the_geometrys_rows(monkeypatch, dtype, extra):
    """Between one and two blocks' worth of keys, streamed attention takes the geometry's query
    rows (whole rows, or a full block and a short one where whole rows would not fit half the
    budget), not the chunks the budget allows (1024 rows of 1024 float64 keys): the result is
    softmax attention (float64 reference, with weights) with the same bits on 1 and 3 threads."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    from ctformer._numerics.blocks import Geometry

    size, m = np.dtype(dtype).itemsize, DEFAULT.key_block + extra
    assert streamed.key_blocked(m, None, np.dtype(dtype), False, DEFAULT.key_block)
    assert not streamed.key_blocked(DEFAULT.key_block - 1, None, np.dtype(dtype), False, DEFAULT.key_block)
    assert streamed.stream_chunk(m, m, size, 4, True, DEFAULT) == DEFAULT.rows
    assert streamed.stream_chunk(m, m, size, 4, False, DEFAULT) > DEFAULT.rows  # the budget's chunks
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((4, m, 16)).astype(dtype) for _ in range(3))
    log_w = np.log(rng.uniform(0.5, 2.0, m)).astype(dtype)
    ref = reference(q, k, v, 0.3, log_w)
    tight = Geometry(DEFAULT.key_block, DEFAULT.rows, 1 << 20)  # whole rows do not fit: blocks
    for geometry, whole in ((DEFAULT, True), (tight, False)):
        assert streamed.whole_rows(m, size, geometry) is whole
        runs = []
        for count in ("1", "3"):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
            runs.append(streamed.stream(q, 0.3, k, v, log_w, None, False, None, (4,), None, geometry))
        assert runs[0].dtype == dtype and np.array_equal(runs[0], runs[1])
        assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < TOL[dtype]
