"""The block geometry of streamed attention (ctformer._numerics.blocks, measured_blocks):
measured once per machine and dtype, kept only where a candidate wins clearly, stored and reused, refused when
damaged; every candidate gives softmax attention (against scipy's softmax in float64) with
the same bits for every thread count."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from scipy.special import softmax

from ctformer._numerics import blocks, chunking, gemm, measured_blocks, store, streamed

from .conftest import require, stored_choices

G = blocks.Geometry


def test_the_verdict_keeps_the_default_unless_a_candidate_wins_clearly():
    a, b, c = G(1024, 256, 1), G(512, 512, 1), G(2048, 128, 1)
    rounds = blocks.ROUNDS
    default = [1.0] * rounds
    # within the margin in every round: the default stays
    assert blocks.verdict({a: default, b: [0.95] * rounds}, a) == a
    # faster by far in a few rounds, slower in most: the default stays
    few = [0.5] * (blocks.WINS - 1) + [1.1] * (rounds - blocks.WINS + 1)
    assert blocks.verdict({a: default, b: few}, a) == a
    # two clear winners: the faster
    assert blocks.verdict({a: default, b: [0.85] * rounds, c: [0.7] * rounds}, a) == c
    # the ratio is per round: a machine that slows down in later rounds changes nothing
    drift = [1.0 + 0.2 * i for i in range(rounds)]
    assert blocks.verdict({a: drift, b: [0.8 * t for t in drift]}, a) == b
    # the key blocks' wider margin keeps a steady 7% gain that the default margin does not
    steady = [0.93] * rounds
    assert blocks.MARGIN < 0.93 < blocks.KEY_BLOCK_MARGIN
    assert blocks.verdict({a: default, b: steady}, a) == a
    assert blocks.verdict({a: default, b: steady}, a, blocks.KEY_BLOCK_MARGIN) == b
    assert blocks.verdict({a: default, b: [0.96] * rounds}, a, blocks.KEY_BLOCK_MARGIN) == a


def test_a_pinned_product_choice_uses_the_default_and_measures_nothing(monkeypatch):
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    monkeypatch.setattr(store, "entry", lambda *a, **k: pytest.fail("a pinned choice measures nothing"))
    assert measured_blocks.geometry(np.float32) == measured_blocks.geometry(np.float64) == blocks.DEFAULT
    monkeypatch.delenv("CTFORMER_GEMM")
    assert measured_blocks.geometry(np.float16) == blocks.DEFAULT  # no measured geometry for other dtypes
    monkeypatch.setenv("CTFORMER_GEMM", "mkl")
    with pytest.raises(ValueError, match="CTFORMER_GEMM"):
        measured_blocks.geometry(np.float64)


@pytest.fixture
def key_blocks_here(monkeypatch):
    """Streamed attention blocks its keys: the compiled kernels, and their row kernel."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")


def test_the_geometry_is_measured_once_stored_and_reused(fresh_store, key_blocks_here, monkeypatch):
    chosen = measured_blocks.geometry(np.float64)
    assert chosen.key_block in blocks.KEY_BLOCKS and chosen.rows in blocks.ROWS
    assert chosen.chunk_bytes in blocks.CHUNK_BYTES
    _, stored = stored_choices(fresh_store)
    chunks, keys = stored["attention chunks float64"], stored["attention key blocks float64"]
    assert chunks["checked"] == measured_blocks.CHUNKS_CHECKED and keys["checked"] == measured_blocks.KEY_BLOCKS_CHECKED
    assert (keys["key_block"], keys["rows"], chunks["chunk_bytes"]) == \
        (chosen.key_block, chosen.rows, chosen.chunk_bytes)
    # every candidate was timed against its default, which is 1 against itself
    assert keys["ratios"]["1024x256"] == chunks["ratios"]["8 MiB"] == 1.0
    assert len(keys["ratios"]) == 9 and len(chunks["ratios"]) == 4
    assert all(0.2 < r < 5.0 for r in [*keys["ratios"].values(), *chunks["ratios"].values()])
    # a later process reads the stored geometry
    measured_blocks._measured.cache_clear()
    for name in ("_measure_chunks", "_measure_key_blocks"):
        monkeypatch.setattr(measured_blocks, name, lambda dtype: pytest.fail("measured again"))
    assert measured_blocks.geometry(np.float64) == chosen


def test_key_blocks_are_timed_only_where_they_are_used(fresh_store, monkeypatch):
    """Without the compiled kernels only the chunks are measured; the key blocks are timed
    when the kernels are there, not taken from a measurement that could not time them."""
    require("numba")
    monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")
    timed = []
    monkeypatch.setattr(measured_blocks, "_measure_chunks", lambda dtype: timed.append("chunks") or
                        {"provider": "numpy", "chunk_bytes": 4 << 20})
    monkeypatch.setattr(measured_blocks, "_measure_key_blocks", lambda dtype: timed.append("key blocks") or
                        {"provider": "numpy", "key_block": 2048, "rows": 512})
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    assert measured_blocks.geometry(np.float32) == G(1024, 256, 4 << 20)
    assert timed == ["chunks"] and "attention key blocks float32" not in stored_choices(fresh_store)[1]
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    # the loop engine is part of the store's key: the compiled loops' store measures its own chunks
    assert measured_blocks.geometry(np.float32) == G(2048, 512, 4 << 20)
    assert timed == ["chunks", "chunks", "key blocks"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_chunk_measurement_times_chunks_that_meet_all_keys_at_once(monkeypatch, dtype):
    """The chunk budget is measured on the path masked and causal problems take (all keys at
    once, in chunks of about the budget's bytes), never on key blocks: every candidate's task
    runs the unblocked worker, with as many query rows as the budget holds."""
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")
    monkeypatch.setattr(measured_blocks, "ROUNDS", 1)
    monkeypatch.setattr(streamed, "_blocked_worker", lambda *a, **kw: pytest.fail("key blocks were timed"))
    chunks = []
    real = streamed.stream

    def stream(q, *args):
        chunks.append(len(q))
        return real(q, *args)

    monkeypatch.setattr(streamed, "stream", stream)
    times = measured_blocks._times(np.dtype(dtype), {G(measured_blocks._UNBLOCKED.key_block, 256, size):
                                                     size // (measured_blocks._KEYS * np.dtype(dtype).itemsize)
                                                     for size in blocks.CHUNK_BYTES})
    assert len(times) == len(blocks.CHUNK_BYTES) and all(len(t) == 1 and t[0] > 0 for t in times.values())
    assert sorted(set(chunks)) == sorted(size // (4096 * np.dtype(dtype).itemsize) for size in blocks.CHUNK_BYTES)


@pytest.mark.parametrize("kind, field", [("attention chunks", "chunk_bytes"), ("attention key blocks", "key_block")])
def test_a_damaged_geometry_is_measured_again(fresh_store, key_blocks_here, monkeypatch, kind, field):
    first = measured_blocks.geometry(np.float32)
    path, stored = stored_choices(fresh_store)
    stored[f"{kind} float32"][field] = 3  # not a candidate: never used
    path.write_text(json.dumps(stored))
    measured_blocks._measured.cache_clear()
    # the stand-in measurements choose candidates the first measurement did not, so each
    # field of the answer shows whether it was measured again or read back
    chunk = next(c for c in blocks.CHUNK_BYTES if c != first.chunk_bytes)
    key_block = next(k for k in blocks.KEY_BLOCKS if k != first.key_block)
    measured = []
    monkeypatch.setattr(measured_blocks, "_measure_chunks", lambda dtype: measured.append("attention chunks") or
                        {"provider": "numpy", "chunk_bytes": chunk})
    monkeypatch.setattr(measured_blocks, "_measure_key_blocks", lambda dtype: measured.append(
        "attention key blocks") or {"provider": "numpy", "key_block": key_block, "rows": 128})
    again = measured_blocks.geometry(np.float32)
    assert measured == [kind]
    assert again.chunk_bytes == (chunk if kind == "attention chunks" else first.chunk_bytes)
    assert (again.key_block, again.rows) == ((key_block, 128) if kind == "attention key blocks" else
                                             (first.key_block, first.rows))


def reference(q, k, v, beta, log_w):
    s = beta * q.astype(np.float64) @ k.astype(np.float64).T + log_w
    return softmax(s, axis=-1) @ v.astype(np.float64)


CANDIDATES = [G(kb, rows, 8 << 20) for kb in blocks.KEY_BLOCKS for rows in blocks.ROWS] + \
    [G(1 << 30, 256, size) for size in blocks.CHUNK_BYTES]  # key blocks of all keys: unblocked


@pytest.mark.parametrize("geometry", CANDIDATES, ids=lambda g: f"{g.key_block}x{g.rows}-{g.chunk_bytes >> 20}MiB")
def test_every_candidate_gives_softmax_attention_and_the_same_bits_on_any_threads(monkeypatch, geometry):
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    rng = np.random.default_rng(11)
    m = 2 * max(blocks.KEY_BLOCKS) + 77  # two blocks of the largest size and a short one
    q = rng.standard_normal((1100, 16))
    k, v = (rng.standard_normal((m, 16)) for _ in range(2))
    log_w = np.log(rng.uniform(0.5, 2.0, m))
    assert streamed.key_blocked(m, None, q.dtype, False, geometry.key_block) is (geometry.key_block < m)
    runs = []
    for count in ("1", "2"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(streamed.stream(q, 0.3, k, v, log_w, None, False, None, (), None, geometry))
    assert np.array_equal(runs[0], runs[1])
    ref = reference(q, k, v, 0.3, log_w)
    assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < 1e-13
    # the chunk: the geometry's query rows where blocked, its bytes of scores where not
    blocked = geometry.key_block < m
    expected = geometry.rows if blocked else max(64, geometry.chunk_bytes // (m * 8))
    assert streamed.stream_chunk(10**6, m, 8, 1, blocked, geometry) == expected


def test_attention_streams_in_the_stored_geometry(fresh_store, monkeypatch):
    """``quadrature_attention`` on a large NumPy problem runs in this machine's geometry: the
    bits of a streamed call given that geometry, softmax attention to rounding."""
    require("numba")
    from ctformer.operators import quadrature_attention

    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")
    monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")
    stored = G(512, 128, 2 << 20)
    monkeypatch.setattr(measured_blocks, "_measure_chunks", lambda dtype: {"provider": "numpy", "chunk_bytes": 2 << 20})
    monkeypatch.setattr(measured_blocks, "_measure_key_blocks", lambda dtype: {"provider": "numpy", "key_block": 512,
                                                                               "rows": 128})
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((1500, 16)) for _ in range(3))
    ours = quadrature_attention(q, k, v, beta=0.25)
    assert measured_blocks.geometry(np.float64) == stored
    assert np.array_equal(ours, streamed.stream(q, 0.25, k, v, None, None, False, None, (), None, stored))
    ref = reference(q, k, v, 0.25, 0.0)
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-13


def test_a_fresh_machine_measures_the_causal_engine_without_waiting_on_itself(fresh_store, monkeypatch):
    """The causal engine's measurement runs the streamed path under the store's lock: the
    geometry it needs is stored first (else the lock would wait on itself forever)."""
    require("torch")
    from ctformer._numerics import fused

    monkeypatch.delenv("CTFORMER_ATTENTION_ENGINE", raising=False)
    done = []
    worker = threading.Thread(target=lambda: done.append(
        fused.fused_chosen(np.float32, True, fused._CALIBRATED_MIN_SCORES)), daemon=True)
    worker.start()
    worker.join(120)
    assert done, "the causal measurement did not finish in 120 s"
    (path,) = (fresh_store / "ctformer").glob("gemm-*.json")
    stored = json.loads(path.read_text())
    assert done[0] is (stored["causal attention float32"]["provider"] == "torch")
    assert stored["attention chunks float32"]["checked"] == measured_blocks.CHUNKS_CHECKED


def test_a_measurement_asking_for_a_choice_not_stored_is_refused_not_hung(fresh_store):
    def measure(dtype):
        return {"provider": gemm._measured("another kind", "float64", lambda d: {"provider": "numpy"})}

    with pytest.raises(RuntimeError, match="measuring 'outer float64' asked for 'another kind float64'"):
        gemm._measured("outer", "float64", measure)
    gemm.forget_choices()
    assert gemm._measured("another kind", "float64", lambda d: {"provider": "compiled"}) == "compiled"


@pytest.mark.parametrize("n, problems, itemsize", [(512, 48, 4), (2048, 12, 4), (384, 24, 8), (8192, 1, 8)])
def test_causal_chunks_meet_fewer_keys(monkeypatch, n, problems, itemsize):
    """A causal problem of many queries is streamed in chunks of at most
    ``_CAUSAL_CHUNK_ROWS`` (each chunk meets the keys up to its last query only); smaller
    problems keep their chunk; the output is causal softmax attention (scipy) on 1 and 2 threads."""
    cap = chunking._CAUSAL_CHUNK_ROWS
    plain = streamed.stream_chunk(n, n, itemsize, problems, False)
    causal = streamed.stream_chunk(n, n, itemsize, problems, False, causal=True)
    assert causal == min(plain, cap)
    small = 2 * cap - 1
    assert streamed.stream_chunk(small, small, itemsize, problems, False, causal=True) == \
        streamed.stream_chunk(small, small, itemsize, problems, False)
    if n > 2048:
        return
    rng = np.random.default_rng(n)
    dtype = np.float32 if itemsize == 4 else np.float64
    heads = max(1, problems // 12)
    q, k, v = (rng.standard_normal((heads, n, 16)).astype(dtype) for _ in range(3))
    _check_streamed(monkeypatch, q, k, v, 0.25, True, None, ("1", "2"))


def _check_streamed(monkeypatch, q, k, v, beta, causal, chunk, thread_counts):
    """``streamed.stream`` gives the same bits on each of ``thread_counts`` and softmax
    attention (scipy, float64) to 1e-5 (float32) or 1e-13 (float64) relative."""
    runs = []
    for count in thread_counts:
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(streamed.stream(q, beta, k, v, None, None, causal, None, q.shape[:1], chunk))
    assert all(np.array_equal(runs[0], run) for run in runs[1:])
    s = beta * np.einsum("hid,hjd->hij", q.astype(np.float64), k.astype(np.float64))
    if causal:
        s[:, np.triu_indices(q.shape[1], 1)[0], np.triu_indices(q.shape[1], 1)[1]] = -np.inf
    ref = softmax(s, axis=-1) @ v.astype(np.float64)
    tolerance = 1e-5 if q.dtype == np.float32 else 1e-13
    assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < tolerance


@pytest.mark.parametrize("n, problems, dtype", [(1000, 1, np.float32), (700, 3, np.float64)])
def test_few_heads_stream_in_at_least_four_chunks(monkeypatch, n, problems, dtype):
    """A call of few heads is split into at least ``_MIN_CHUNKS`` = 4 query chunks in all, as
    few rows as that takes: a single head of 1000 queries in chunks of ceil(1000 / 4) = 250
    rows (four tasks), three heads of 700 in two chunks of 350 each; the output is softmax
    attention (scipy, float64) with the same bits on 1 and 3 threads."""
    itemsize = np.dtype(dtype).itemsize
    chunk = streamed.stream_chunk(n, n, itemsize, problems, False)
    per_problem = -(-chunking._MIN_CHUNKS // problems)
    assert chunk == -(-n // per_problem)
    assert problems * -(-n // chunk) >= 4
    rng = np.random.default_rng(problems)
    q, k, v = (rng.standard_normal((problems, n, 32)).astype(dtype) for _ in range(3))
    _check_streamed(monkeypatch, q, k, v, 0.2, False, chunk, ("1", "3"))


@pytest.mark.parametrize("n, problems, blocked, expected", [
    (2300, 1, True, 230),   # 9 chunks of 256 -> 10 of 230
    (3300, 1, True, 236),   # 13 -> 14
    (2048, 1, True, 256),   # 8: even already
    (4500, 1, True, 256),   # 18: even already
    (1500, 3, False, 750),  # 3 heads x 2 chunks of 750: 6, even already
    (10**6, 1, True, 256),  # 3907 chunks: many, left as they are
])
def test_few_chunks_come_in_an_even_number(monkeypatch, n, problems, blocked, expected):
    """Under ``_BALANCED_TASKS`` chunks in all, a non-causal call makes an even number of them
    (no thread left alone with a last chunk on two threads): the closed-form chunk sizes
    above; streamed attention of 2300 queries in its 10 chunks is softmax attention (scipy)
    with the same bits on 1, 2 and 3 threads."""
    chunk = streamed.stream_chunk(n, n, 4, problems, blocked)
    assert chunk == expected
    count = problems * -(-n // chunk)
    assert count % 2 == 0 or count >= chunking._BALANCED_TASKS
    if n == 2300:
        rng = np.random.default_rng(7)
        q, k, v = (rng.standard_normal((1, n, 16)).astype(np.float32) for _ in range(3))
        _check_streamed(monkeypatch, q, k, v, 0.25, False, chunk, ("1", "2", "3"))
