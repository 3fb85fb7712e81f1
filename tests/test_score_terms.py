"""Score terms on every path of the dense engine: the soft cap (Gemma 2's
``attn_logit_softcapping``) and an additive term (ALiBi's slopes times distances).

The score :math:`s = \\beta q \\cdot k` is capped, :math:`s \\mapsto c \\tanh(s / c)`, and the
term :math:`b` added, before the log-weights and the masks. Each path (one batched pass,
batched blocks on the threads, streamed query chunks with and without key blocks, many masked
problems, the array-API chunks, the banded engine's slabs) is checked against the formula
evaluated in float64 by NumPy, and the threaded paths for the same bits on one and three
threads. ALiBi's term is given both as an array and as a :class:`DistanceTerm` (evaluated
block by block from the slopes and positions).
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import dense, streamed
from ctformer._numerics.banded import BandedAttention
from ctformer._numerics.score_terms import DistanceTerm, ScoreTerms

CAP = 0.9


def _reference(q, k, v, beta, cap, log_w=None, keep=None, bias=None):
    """softmax(c tanh(beta q k^T / c) + b + log w, masked) v in float64 (``cap`` None: no cap)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = beta * q @ np.swapaxes(k, -1, -2)
    if cap is not None:
        s = cap * np.tanh(s / cap)
    if bias is not None:
        s = s + bias
    if log_w is not None:
        s = s + log_w
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    s = np.exp(s - np.where(np.isinf(top), 0.0, top))  # a query without keys: output zero
    return (s / np.maximum(s.sum(axis=-1, keepdims=True), 1e-300)) @ v


def _inputs(lead, n, m, dtype, seed=0, d=16):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((*lead, rows, d)).astype(dtype) for rows in (n, m, m))
    return q, k, v


def _rel(a, b):
    return float(np.abs(np.asarray(a, dtype=np.float64) - b).max() / np.abs(b).max())


def _tol(dtype):
    return 1e-13 if dtype == np.float64 else 3e-6


# (name, leading axes, queries, keys, mask, the path's function in the engine)
PATHS = [
    ("one batched pass", (2, 3), 24, 24, None, "small"),
    ("batched blocks on the threads", (4, 80), 128, 128, "causal", "small_blocks"),
    ("blocks over two leading axes", (16, 4, 2), 128, 128, "causal", "small_blocks"),
    ("causal query chunks", (2,), 512, 512, "causal", "stream"),
    ("query chunks in key blocks", (1,), 1024, 4096, None, "stream"),
    ("many masked problems", (4, 12), 128, 255, "band", "stream"),
]


def _alibi(lead, n, m, dtype):
    """-slope_h |i - j| per head (the last leading axis), broadcasting over the others."""
    slopes = 2.0 ** -np.arange(1, lead[-1] + 1)
    distance = np.abs(np.arange(m - n, m)[:, None] - np.arange(m)[None, :])
    return (-slopes[:, None, None] * distance).astype(dtype)


def _distance(lead, n, m):
    """:func:`_alibi`'s term as a :class:`DistanceTerm`: slopes per head, query positions m - n .. m - 1."""
    slopes = (2.0 ** -np.arange(1, lead[-1] + 1))[:, None, None]
    return DistanceTerm(slopes, np.arange(m - n, m, dtype=np.float64), np.arange(m, dtype=np.float64))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, lead, n, m, mask, function", PATHS, ids=[p[0] for p in PATHS])
@pytest.mark.parametrize("kind", ["cap", "bias", "both", "distance", "cap and distance"])
def test_every_numpy_path_applies_the_terms_before_weights_and_masks(monkeypatch, dtype, name, lead, n, m, mask,
                                                                    function, kind):
    q, k, v = _inputs(lead, n, m, dtype)
    cap = None if kind in ("bias", "distance") else CAP
    bias = None if kind == "cap" else _alibi(lead, n, m, dtype)
    # the same term evaluated block by block from the slopes and positions (float64 arithmetic
    # would give other bits than the array in float32: the reference takes the term in float64)
    term = _distance(lead, n, m) if "distance" in kind else bias
    beta = 0.7
    weights = np.linspace(0.5, 1.5, m)
    keep = None
    if mask == "causal":
        keep = np.tril(np.ones((n, m), dtype=bool))
    elif mask == "band":
        rows, cols = np.arange(m - n, m)[:, None], np.arange(m)[None, :]
        keep = (cols <= rows) & (cols > rows - 128)
    calls, original = [], getattr(streamed, function)
    monkeypatch.setattr(streamed, function, lambda *a, **kw: calls.append(1) or original(*a, **kw))
    monkeypatch.setattr(dense, "_stream_generic", lambda *a: pytest.fail("the generic path"))
    outs = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", threads)
        given = "causal" if mask == "causal" else keep
        outs[threads] = dense.attend_trusted(q, k, v, beta, weights.astype(dtype), given, "full",
                                             terms=ScoreTerms(cap, term))
    reference = _reference(q, k, v, beta, cap, np.log(weights), keep, bias)
    assert calls and outs["1"].dtype == dtype
    assert _rel(outs["1"], reference) < _tol(dtype)
    assert np.array_equal(outs["1"], outs["3"])


def test_the_cap_bends_the_scores_it_is_given():
    # a cap far above the scores changes nothing measurable; a small one changes the output
    q, k, v = _inputs((2,), 24, 24, np.float64, seed=1)
    plain = dense.attend_trusted(q, k, v, 0.5, None, None, "full")
    assert _rel(dense.attention_with_terms(q, k, v, 0.5, None, None, "full", False, ScoreTerms(1e6)), plain) < 1e-10
    assert _rel(dense.attention_with_terms(q, k, v, 0.5, None, None, "full", False, ScoreTerms(0.3)), plain) > 1e-2


def test_array_api_chunks_apply_the_terms():
    torch = pytest.importorskip("torch")
    q, k, v = _inputs((3,), 40, 40, np.float64, seed=2)
    keep = np.tril(np.ones((40, 40), dtype=bool))
    tensors = [torch.from_numpy(a) for a in (q, k, v)]
    got = dense.attention_with_terms(*tensors, 0.8, None, "causal", "full", False, ScoreTerms(CAP))
    assert _rel(got.numpy(), _reference(q, k, v, 0.8, CAP, keep=keep)) < 1e-13
    bias = _alibi((3,), 40, 40, np.float64)
    got = dense.attend_trusted(*tensors, 0.8, None, "causal", "full",
                               terms=ScoreTerms(CAP, torch.from_numpy(bias)))
    assert _rel(got.numpy(), _reference(q, k, v, 0.8, CAP, keep=keep, bias=bias)) < 1e-13
    got = dense.attend_trusted(*tensors, 0.8, None, "causal", "full", chunk=7,
                               terms=ScoreTerms(CAP, _distance((3,), 40, 40)))
    assert isinstance(got, torch.Tensor)
    assert _rel(got.numpy(), _reference(q, k, v, 0.8, CAP, keep=keep, bias=bias)) < 1e-13


def test_scale_safe_inputs_keep_the_cap():
    # queries of size 1e200: rescaled by powers of two, the capped scores stay what they are
    q, k, v = _inputs((2,), 16, 16, np.float64, seed=3)
    big = q * 2.0 ** 660
    got = dense.attention_with_terms(big, k, v, 2.0 ** -660, None, "causal", "full", True, ScoreTerms(CAP))
    keep = np.tril(np.ones((16, 16), dtype=bool))
    assert _rel(got, _reference(q, k, v, 1.0, CAP, keep=keep)) < 1e-13
    with pytest.raises(ValueError, match="q must be finite"):
        dense.attention_with_terms(np.full_like(q, np.nan), k, v, 1.0, None, None, "full", True, ScoreTerms(CAP))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_banded_slabs_apply_the_terms_with_padding_and_causality(dtype):
    # a window of 5 keys and a causal engine without a pattern, both with padding keys, capped
    # and with ALiBi's term: the slabs go to the dense engine with their masks, the terms inside
    import sparse

    from ctformer._numerics.banded import slopes_bias

    n = 40
    q, k, v = _inputs((2, 3), n, n, dtype, seed=4)
    real = np.ones((2, n), dtype=bool)
    real[1, -7:] = False
    pad = real[:, None, None, :]  # against (batch, head, query, key)
    rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
    window = (cols <= rows) & (cols > rows - 5)
    slopes = np.array([0.5, 0.25, 0.125])[:, None, None]
    positions = np.arange(n, dtype=np.float64)
    for pattern, keep in ((sparse.COO(window), window), (None, cols <= rows)):
        for bias in (None, slopes_bias(np.array([0.5, 0.25, 0.125]))):
            engine = BandedAttention(n, n, pattern=pattern, causal=pattern is None, block=16, cap=CAP, bias=bias,
                                     positions=(positions, positions))
            got = engine(q, k, v, 0.6, key_mask=real[:, None, :])
            term = None if bias is None else -slopes * np.abs(rows - cols)
            reference = _reference(q, k, v, 0.6, CAP, keep=keep & pad, bias=term)
            assert _rel(got, reference) < _tol(dtype)


def test_gemma2_layers_without_a_window_take_the_dense_engine(monkeypatch):
    # layer 0 slides (window 3 < 12 tokens): the banded engine; layer 1 attends to every earlier
    # token: the dense engine's batched pass, the cap inside, once the banded engine's own path
    torch = pytest.importorskip("torch")
    t = pytest.importorskip("transformers")
    from ctformer.bridges import float64_reference, from_hf

    config = t.Gemma2Config(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=4, query_pre_attn_scalar=4, sliding_window=3,
                            attn_logit_softcapping=0.7, vocab_size=32, max_position_embeddings=64,
                            bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = float64_reference(t.Gemma2Model(config))
    x = np.random.default_rng(5).standard_normal((2, 12, 16))
    with torch.no_grad():
        reference = model(inputs_embeds=torch.from_numpy(x)).last_hidden_state.numpy()
    ct = from_hf(model)
    caps, banded, small, call = [], [], streamed.small, BandedAttention.__call__
    monkeypatch.setattr(streamed, "small",
                        lambda *a, **kw: caps.append(getattr(kw.get("terms"), "cap", None)) or small(*a, **kw))
    monkeypatch.setattr(BandedAttention, "__call__", lambda self, *a, **kw: banded.append(1) or call(self, *a, **kw))
    assert _rel(ct.run(x), reference) < 1e-12
    assert len(banded) == 1 and caps[-1] == 0.7
    assert _rel(ct.run(x.astype(np.float32)), reference) < 1e-5


@pytest.mark.parametrize("engine", ["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_distance_term_blocks_equal_the_formula(monkeypatch, engine, dtype):
    # -m |p_i - p'_j| on a block of rows and columns, positions not on the integers: the compiled
    # pass (one slope, one block) and NumPy's passes (slopes per problem) agree with float64
    # arithmetic to the rounding of the distance and of the product
    if engine == "numba":
        pytest.importorskip("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", engine)
    rng = np.random.default_rng(6)
    p, pk = np.sort(rng.uniform(0, 50, 30)), np.sort(rng.uniform(0, 50, 40))
    slopes = np.array([0.5, 0.0625, 0.3])[:, None, None]
    term = DistanceTerm(slopes, p, pk).spread((2, 3))
    s = rng.standard_normal((2, 3, 30, 40)).astype(dtype)
    exact = s.astype(np.float64) - slopes * np.abs(p[:, None] - pk[None, :])
    rows, cols = slice(4, 17), slice(9, 33)
    one = s[1, 2, rows, cols].copy()
    term[1, 2].add_to(one, rows, cols)                 # one slope, one block
    many = s[:, :, rows, cols].copy()
    term.add_to(many, rows, cols)                      # every problem's slope
    ulps = 4 * np.finfo(dtype).eps * np.abs(exact[..., rows, cols]).max()
    assert np.abs(one - exact[1, 2, rows, cols]).max() < ulps
    assert np.abs(many - exact[..., rows, cols]).max() < ulps
    assert np.abs(one - many[1, 2]).max() <= 2 * np.finfo(dtype).eps * np.abs(one).max()
