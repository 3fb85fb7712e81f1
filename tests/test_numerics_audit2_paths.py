"""The fast attention paths against a written-out float64 reference.

Every path of the NumPy engine (the batched pass, blocks of heads, streamed query chunks with
all keys at once, key blocks with an online softmax, grouped queries, the banded engine) is
reached with small arrays by shrinking its thresholds, and compared with
``softmax_j(beta q_i . k_j + log w_j)`` over the kept keys (scipy), zero for a row without keys.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

from ctformer._numerics import blocks, dense, grouped, streamed
from ctformer.operators.local_attention import local_attention, window_pattern
from ctformer.operators.quadrature_attention import quadrature_attention

_TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _reference(q, k, v, beta, weights=None, keep=None, causal=False, half=False):
    """Softmax attention in float64 from its definition; rows without keys give zero."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = np.asarray(beta, dtype=np.float64) * np.einsum("...nd,...md->...nm", q, k)
    n, m = s.shape[-2:]
    if weights is not None:
        s = s + np.log(np.asarray(weights, dtype=np.float64))
    kept = np.ones(s.shape, dtype=bool)
    if causal:
        kept &= np.tril(np.ones((n, m), dtype=bool))
        if half:
            s = s + np.where(np.eye(n, m, dtype=bool), np.log(0.5), 0.0)
    if keep is not None:
        kept &= keep
    s = np.where(kept, s, -np.inf)
    empty = ~kept.any(axis=-1, keepdims=True)
    s = np.where(empty, 0.0, s)
    p = np.exp(s - logsumexp(s, axis=-1, keepdims=True))
    return np.where(empty, 0.0, p @ v)


def _relative(got, expected):
    return float(np.abs(got - expected).max() / max(np.abs(expected).max(), np.finfo(np.float64).tiny))


@pytest.fixture
def paths(monkeypatch):
    """The engine with thresholds small enough for arrays of a few tokens (key blocks of 8,
    rows of 4, chunks of 256 bytes; streamed from 4 scores), and a count of the paths taken."""
    taken = []
    geometry = blocks.Geometry(key_block=8, rows=4, chunk_bytes=256)
    monkeypatch.setattr(dense._measured_blocks, "geometry", lambda dtype: geometry)
    monkeypatch.setattr(dense, "_STREAM_MIN_ENTRIES", 4)
    for module, name in ((streamed, "_blocked_worker"), (streamed, "_chunk_worker"), (streamed, "_small"),
                         (grouped, "stream_groups")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name, **kw: taken.append(name) or real(*a, **kw))
    return taken


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, m", [(1, 1), (2, 7), (3, 8), (5, 9), (9, 17), (17, 17), (16, 33)])
@pytest.mark.parametrize("lead", [(), (3,), (2, 12)])
def test_streamed_paths_match_the_reference(paths, dtype, n, m, lead):
    rng = np.random.default_rng(n * 100 + m)
    q = rng.standard_normal((*lead, n, 5)).astype(dtype)
    k = rng.standard_normal((*lead, m, 5)).astype(dtype)
    v = rng.standard_normal((*lead, m, 3)).astype(dtype)
    weights = np.exp(rng.uniform(-40, 40, m))  # log-weights far apart: the row maxima matter
    keep = rng.random((*lead, n, m)) < 0.6
    keep[..., 0, :] = False  # a query without keys
    if m > 8:
        keep[..., :, :8] = False  # a whole key block out
    cases = [dict(), dict(weights=weights), dict(mask=keep, weights=weights)]
    if n == m:
        cases += [dict(mask="causal", weights=weights), dict(mask="causal", diagonal="half")]
    for case in cases:
        got = quadrature_attention(q, k, v, beta=0.7, **case)
        mask = case.get("mask")
        expected = _reference(q, k, v, 0.7, case.get("weights"), None if isinstance(mask, str) else mask,
                              isinstance(mask, str), case.get("diagonal") == "half")
        assert got.dtype == dtype and _relative(got, expected) <= _TOL[dtype], case.keys()
    big = quadrature_attention(30 * q, 30 * k, v, beta=10.0)  # scores of about 1e4
    assert np.isfinite(big).all() and _relative(big, _reference(30 * q, 30 * k, v, 10.0)) <= 1e3 * _TOL[dtype]
    if m >= 16 and n > 1:  # two key blocks: not whole rows of 4 queries in the 256-byte chunks
        assert "_blocked_worker" in paths and "_chunk_worker" in paths


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keys_lead", [(2, 1), (3,)])
def test_fortran_queries_against_broadcast_keys_in_the_batched_pass(dtype, keys_lead):
    """A product of 4-d Fortran-ordered queries and broadcast keys came out of NumPy in another
    layout than C; the row kernel then wrote its exponentials into a flattened copy, and the
    output was the raw scores times the values (absolute error 9.3 in float64)."""
    rng = np.random.default_rng(4)
    q = np.asfortranarray(rng.standard_normal((2, 3, 9, 6)).astype(dtype))
    k = rng.standard_normal((*keys_lead, 9, 6)).astype(dtype)
    v = rng.standard_normal((*keys_lead, 9, 4)).astype(dtype)
    for mask in (None, "causal"):
        got = quadrature_attention(q, k, v, beta=0.5, mask=mask)
        assert _relative(got, _reference(q, k, v, 0.5, causal=mask is not None)) <= _TOL[dtype]


@pytest.mark.parametrize("n", [9, 300])  # the batched pass and the streamed chunks
@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_mixed_dtypes_give_the_promoted_dtype_at_every_size(n, check, mask):
    """float32 queries on float64 keys and values: float64 from the batched pass, but float32
    from the streamed one (relative error 3.6e-7 at 300 tokens); float64 from both now."""
    rng = np.random.default_rng(n)
    q = rng.standard_normal((3, n, 6)).astype(np.float32)
    k, v = rng.standard_normal((3, n, 6)), rng.standard_normal((3, n, 4))
    got = quadrature_attention(q, k, v, beta=0.5, mask=mask, check=check)
    assert got.dtype == np.float64
    assert _relative(got, _reference(q, k, v, 0.5, causal=mask is not None)) <= 1e-12


def test_unchecked_mixed_dtypes_take_the_log_weights_in_the_promoted_dtype():
    """With ``check=False`` the log-weights were taken in the queries' float32 (3e-8 off)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 9, 6)).astype(np.float32)
    k, v, w = rng.standard_normal((3, 9, 6)), rng.standard_normal((3, 9, 4)), rng.uniform(0.5, 2.0, 9)
    got = quadrature_attention(q, k, v, beta=0.5, weights=w, check=False)
    assert got.dtype == np.float64 and _relative(got, _reference(q, k, v, 0.5, w)) <= 1e-12


@pytest.mark.parametrize("options", [dict(check=False), dict(causal=True), dict(causal=True, diagonal="half"),
                                     dict(pattern=True), dict(causal=True, slopes=0.1, block=4)])
def test_float64_weights_beyond_float32_range_stay_finite(options):
    """float64 weights of 1e-50 are 0 in float32: their log was -inf on every key, and float32
    attention gave NaN rows; the log is now taken in float64 (-115.1) and then rounded."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 9, d)).astype(np.float32) for d in (6, 6, 4))
    w = np.exp(rng.uniform(-1.0, 1.0, 9)) * 1e-50
    options = dict(options)
    keep = None
    if options.pop("check", True) is False:
        got = quadrature_attention(q, k, v, beta=0.5, weights=w, check=False)
    else:
        if options.pop("pattern", False):
            options["pattern"] = window_pattern(np.arange(9.0), 3)
            keep = options["pattern"].todense()
        slopes = options.get("slopes")
        if slopes is not None:
            options["positions"] = np.arange(9.0)
        got = local_attention(q, k, v, beta=0.5, weights=w, check=True, **options)
        if slopes is not None:  # the ALiBi term enters as log-weights of each query
            distance = np.abs(np.arange(9.0)[:, None] - np.arange(9.0)[None, :])
            w = w * np.exp(-slopes * distance)
    expected = _reference(q, k, v, 0.5, w, keep, options.get("causal", False), options.get("diagonal") == "half")
    assert np.isfinite(got).all() and _relative(got, expected) <= 1e-5


def test_readonly_strided_and_half_inputs(paths):
    """Read-only, strided and Fortran inputs are read as they are; float16 is computed in
    float32 and rounded once; integer inputs are refused by name."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((3, 17, d)) for d in (6, 6, 4))
    expected = _reference(q, k, v, 0.5, causal=True)
    strided = np.repeat(q, 2, axis=-1)[..., ::2]
    readonly = v.copy()
    readonly.setflags(write=False)
    got = quadrature_attention(strided, np.asfortranarray(k), readonly, beta=0.5, mask="causal")
    assert _relative(got, expected) <= 1e-12
    half = [a.astype(np.float16) for a in (q, k, v)]
    got = quadrature_attention(*half, beta=0.5, mask="causal")
    assert got.dtype == np.float16
    assert _relative(got, _reference(*half, 0.5, causal=True)) <= 1e-3  # one rounding to float16
    with pytest.raises(TypeError, match="real floating arrays, got dtype int64 for q"):
        quadrature_attention(q.astype(np.int64), k, v, beta=0.5)


@pytest.mark.parametrize("options", [dict(causal=True), dict(pattern=True), dict(causal=True, slopes=0.1)])
@pytest.mark.parametrize("dtype", [np.int64, np.complex128])
def test_checked_local_attention_refuses_non_floating_inputs_by_name(options, dtype):
    """``check=True`` had failed inside array_api_compat's ``finfo`` with an AttributeError
    ('Int64DType' object has no attribute 'dtype')."""
    q = np.arange(24).reshape(4, 6).astype(dtype)
    options = dict(options)
    if options.pop("pattern", False):
        options["pattern"] = window_pattern(np.arange(4.0), 2)
    if "slopes" in options:
        options["positions"] = np.arange(4.0)
    with pytest.raises(TypeError, match=f"real floating arrays, got dtype {np.dtype(dtype)} for q: convert"):
        local_attention(q, q, q, beta=0.1, check=True, **options)
