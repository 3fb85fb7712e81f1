"""quadrature_attention against independent references.

References: torch ``scaled_dot_product_attention`` / ``softmax`` run in float64 (an additive
float mask carries log-weights and the half diagonal), a hand-built dense NumPy formula, and the
hard-max limit beta -> infinity. Both code paths are checked: the batched array-API path and the
NumPy streaming path (selected by problem size; the fixture moves the threshold).
"""
from __future__ import annotations

import importlib
import math
import tracemalloc

import numpy as np
import pytest

from ctformer.operators import quadrature_attention

from .conftest import require

# the package re-exports the function under the module's name, so fetch the module itself
qa_module = importlib.import_module("ctformer._numerics.dense")  # the engine holds the path thresholds
numpy_paths = importlib.import_module("ctformer._numerics.streamed")
row_exponentials = importlib.import_module("ctformer._numerics.row_exponentials")
threads_module = importlib.import_module("ctformer._numerics.threads")


@pytest.fixture(params=["small", "small-numpy-loops", "stream", "stream-numpy-loops"])
def path(request, monkeypatch):
    """Force the batched path or the NumPy streaming path (threaded), each with the compiled
    row kernel (the default where Numba is installed) or with NumPy's loops."""
    if request.param.endswith("numpy-loops"):
        monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    if request.param.startswith("stream"):
        monkeypatch.setattr(qa_module, "_STREAM_MIN_ENTRIES", 0)
        monkeypatch.setattr(numpy_paths, "_PARALLEL_MIN_ENTRIES", 0)
        monkeypatch.setattr(row_exponentials, "_ELEMENTWISE_BLOCK_BYTES", 300)  # a few rows per block
        monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    else:
        monkeypatch.setattr(qa_module, "_STREAM_MIN_ENTRIES", 1 << 62)
    return request.param


def _torch_sdpa(q, k, v, *, scale, bias=None, is_causal=False):
    """float64 torch SDPA with an additive float mask ``bias``."""
    torch = require("torch")
    t = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (q, k, v)]
    bias = None if bias is None else torch.from_numpy(np.array(bias, dtype=np.float64))
    out = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=bias, is_causal=is_causal, scale=scale
    )
    return out.numpy()


def _qkv(rng, shape_q, shape_kv, d=8, e=5):
    q = rng.standard_normal((*shape_q, d))
    k = rng.standard_normal((*shape_kv, d))
    v = rng.standard_normal((*shape_kv[:-1], shape_kv[-1], e))
    return q, k, v


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def test_gauss_weights_equal_softmax_with_log_weight_bias(rng, path):
    # Gauss-Legendre nodes on [0, 1]: sum_j w_j e^{s_ij} v_j / sum_j w_j e^{s_ij} is
    # softmax(s + log w); torch gets log w as an additive float mask.
    n = 41
    nodes, w = np.polynomial.legendre.leggauss(n)
    w = w / 2
    q, k, v = _qkv(rng, (2, n), (2, n))
    beta = 0.9
    out = quadrature_attention(q, k, v, beta=beta, weights=w)
    ref = _torch_sdpa(q, k, v, scale=beta, bias=np.broadcast_to(np.log(w), (n, n)))
    assert _rel(out, ref) < 1e-13
    # uniform weights cancel: same as no weights at all
    plain = _torch_sdpa(q, k, v, scale=beta)
    assert _rel(quadrature_attention(q, k, v, beta=beta, weights=np.full(n, 1 / n)), plain) < 1e-13


@pytest.mark.parametrize("n", [5, 64, 97])
def test_chunked_equals_unchunked(rng, path, n):
    q, k, v = _qkv(rng, (3, n), (3, n))
    w = rng.uniform(0.2, 1.0, n)
    ref = _torch_sdpa(q, k, v, scale=1.3, bias=np.broadcast_to(np.log(w), (n, n)))
    whole = quadrature_attention(q, k, v, beta=1.3, weights=w, chunk=n)
    assert _rel(whole, ref) < 1e-13
    for chunk in (1, 3, 7, 32, n - 1, n + 5):
        for mask in (None, "causal"):
            out = quadrature_attention(q, k, v, beta=1.3, weights=w, chunk=max(1, chunk), mask=mask)
            base = whole if mask is None else quadrature_attention(q, k, v, beta=1.3, weights=w, mask=mask)
            assert _rel(out, base) < 1e-13, (chunk, mask)


def test_causal_equals_torch_is_causal(rng, path):
    q, k, v = _qkv(rng, (2, 3, 50), (2, 3, 50), d=6, e=4)
    out = quadrature_attention(q, k, v, beta=1 / math.sqrt(6), mask="causal", chunk=16)
    ref = _torch_sdpa(q, k, v, scale=1 / math.sqrt(6), is_causal=True)
    assert _rel(out, ref) < 1e-13


def test_half_diagonal_equals_hand_built_rule(rng, path):
    # out_i = sum_{j<i} w_j e^{s_ij} v_j + (w_i/2) e^{s_ii} v_i, normalized the same way;
    # dense and without max subtraction (scores are O(1) here).
    n = 33
    q, k, v = _qkv(rng, (n,), (n,))
    w = rng.uniform(0.5, 1.5, n)
    beta = 0.6
    weight = np.tril(np.exp(beta * q @ k.T) * w)
    weight[np.diag_indices(n)] /= 2
    ref = weight @ v / weight.sum(axis=1, keepdims=True)
    out = quadrature_attention(q, k, v, beta=beta, weights=w, mask="causal", diagonal="half", chunk=10)
    assert _rel(out, ref) < 1e-13
    full = quadrature_attention(q, k, v, beta=beta, weights=w, mask="causal")
    assert _rel(full, ref) > 1e-3  # the two diagonal rules really differ


def test_per_head_beta_with_batch_and_head_axes(rng, path):
    b, h, n = 2, 3, 40
    q, k, v = _qkv(rng, (b, h, n), (b, 1, n))  # keys and values shared by the heads
    beta = np.array([0.25, 1.0, 2.5])
    out = quadrature_attention(q, k, v, beta=beta)
    assert out.shape == (b, h, n, v.shape[-1])
    for head in range(h):
        ref = _torch_sdpa(q[:, head], k[:, 0], v[:, 0], scale=float(beta[head]))
        assert _rel(out[:, head], ref) < 1e-13


def test_boolean_and_key_masks_match_torch(rng, path):
    n = 30
    q, k, v = _qkv(rng, (2, n), (2, n))
    keep = rng.random((2, n, n)) < 0.4
    keep[..., 3] = True
    bias = np.where(keep, 0.0, -np.inf)
    out = quadrature_attention(q, k, v, beta=0.8, mask=keep, chunk=7)
    assert _rel(out, _torch_sdpa(q, k, v, scale=0.8, bias=bias)) < 1e-13
    key_keep = np.ones((2, 1, n), dtype=bool)
    key_keep[0, 0, 20:] = False  # a padded first sequence
    bias = np.where(key_keep, 0.0, -np.inf)
    out = quadrature_attention(q, k, v, beta=0.8, mask=key_keep)
    assert _rel(out, _torch_sdpa(q, k, v, scale=0.8, bias=bias)) < 1e-13


def test_float32_large_beta_is_finite_and_equals_hard_max(rng, path):
    n = 64
    q, k, v = (a.astype(np.float32) for a in _qkv(rng, (n,), (n,), d=4))
    beta = 1e4
    out = quadrature_attention(q, k, v, beta=beta)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    scores = q.astype(np.float64) @ k.astype(np.float64).T
    top2 = np.sort(scores, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-2  # exp(-beta * gap) < e^-100: the limit is exact
    assert clear.sum() > n // 2
    hard = v[np.argmax(scores, axis=1)]
    np.testing.assert_allclose(out[clear], hard[clear], rtol=0, atol=1e-6)
    # causal and weighted variants stay finite and pick the best allowed key
    out = quadrature_attention(q, k, v, beta=beta, mask="causal", weights=np.full(n, 1 / n, np.float32))
    masked = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    top2 = np.sort(masked, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] > 1e-2) | ~np.isfinite(top2[:, 0])
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[clear], v[np.argmax(masked, axis=1)][clear], rtol=0, atol=1e-6)


def test_float32_stays_float32_and_is_accurate(rng, path):
    q, k, v = _qkv(rng, (2, 45), (2, 45))
    ref = _torch_sdpa(q, k, v, scale=2.0, is_causal=True)
    out = quadrature_attention(*(a.astype(np.float32) for a in (q, k, v)), beta=2.0, mask="causal")
    assert out.dtype == np.float32
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize("blas_limit", ["threadpoolctl", "none available"])
def test_threads_do_not_change_the_result(rng, monkeypatch, blas_limit):
    monkeypatch.setattr(qa_module, "_STREAM_MIN_ENTRIES", 0)
    monkeypatch.setattr(numpy_paths, "_PARALLEL_MIN_ENTRIES", 0)
    if blas_limit != "threadpoolctl":  # without threadpoolctl: one worker, threaded BLAS
        monkeypatch.setattr(threads_module, "single_thread_blas", lambda: None)
    q, k, v = _qkv(rng, (2, 70), (2, 70))
    keep = rng.random((70, 70)) < 0.5
    keep[:, 0] = True
    results = []
    for threads in ("1", "2", "5"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", threads)
        results.append([quadrature_attention(q, k, v, beta=1.1, mask=m, chunk=23) for m in (None, "causal", keep)])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)
    ref = _torch_sdpa(q, k, v, scale=1.1, bias=np.where(keep, 0.0, -np.inf))
    assert _rel(results[-1][2], ref) < 1e-13


def test_default_chunks_are_bit_identical_for_1_and_2_threads(rng, monkeypatch):
    # the reproducer: 2 x 1100 tokens took different chunks (and roundings) for 1 and 2 threads
    n = 1100
    q, k, v = _qkv(rng, (2, n), (2, n), d=16, e=8)
    w = rng.uniform(0.5, 1.5, n)
    results = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", threads)
        results[threads] = [quadrature_attention(q, k, v, beta=0.7, weights=w, mask=m) for m in (None, "causal")]
    for a, b in zip(results["1"], results["2"]):
        assert np.array_equal(a, b)
    rows = [0, 555, n - 1]
    ref = _torch_sdpa(q[:, rows], k, v, scale=0.7, bias=np.broadcast_to(np.log(w), (3, n)))
    assert _rel(results["2"][0][:, rows], ref) < 1e-13


def test_thread_count_must_be_a_positive_integer(monkeypatch):
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="CTFORMER_NUM_THREADS must be a positive integer"):
            threads_module.num_threads()
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    assert threads_module.num_threads() == 3


def test_memory_is_chunk_times_n_not_n_squared(rng, monkeypatch):
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")  # one score buffer per worker thread
    n = 3000  # an N x N float64 score matrix would be 72 MB
    q, k, v = _qkv(rng, (n,), (n,), d=4, e=4)
    tracemalloc.start()
    try:
        out = quadrature_attention(q, k, v, beta=1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20e6
    idx = [0, 1234, n - 1]
    assert _rel(out[idx], _torch_sdpa(q[idx], k, v, scale=1.0)) < 1e-13


def test_array_api_strict_inputs(rng):
    xp = require("array_api_strict")
    n = 20
    q, k, v = _qkv(rng, (2, n), (2, n))
    w = rng.uniform(0.5, 1.0, n)
    out = quadrature_attention(*(xp.asarray(a) for a in (q, k, v)), beta=xp.asarray([0.5, 2.0]),
                               weights=xp.asarray(w), mask="causal", diagonal="half", chunk=6)
    assert type(out) is type(xp.asarray(q))
    bias = np.log(w) + np.log(0.5) * np.eye(n) + np.where(np.tril(np.ones((n, n))) > 0, 0.0, -np.inf)
    for b, beta in enumerate((0.5, 2.0)):
        assert _rel(np.asarray(out[b, ...]), _torch_sdpa(q[b], k[b], v[b], scale=beta, bias=bias)) < 1e-13


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda q, k, v: dict(k=k[..., :-1]), "feature size"),
        (lambda q, k, v: dict(v=v[..., :-1, :]), "same number of tokens"),
        (lambda q, k, v: dict(k=np.stack([k[0]] * 3)), "do not broadcast"),
        (lambda q, k, v: dict(weights=np.ones(9)), r"weights must have shape \(10,\)"),
        (lambda q, k, v: dict(weights=np.r_[0.0, np.ones(9)]), "positive"),
        (lambda q, k, v: dict(weights=-np.ones(10)), "positive"),
        (lambda q, k, v: dict(beta=math.inf), "beta must be finite"),
        (lambda q, k, v: dict(beta=math.nan), "beta must be finite"),
        (lambda q, k, v: dict(beta=np.array([1.0, np.nan])), "beta must be finite"),
        (lambda q, k, v: dict(beta=np.ones(3)), "do not broadcast"),
        (lambda q, k, v: dict(mask=np.ones((10, 9), bool)), "mask array must have shape"),
        (lambda q, k, v: dict(mask=np.ones((3, 10, 10), bool)), "do not broadcast"),
        (lambda q, k, v: dict(mask="anticausal"), "mask must be None, 'causal'"),
        (lambda q, k, v: dict(diagonal="half"), "only applies with mask='causal'"),
        (lambda q, k, v: dict(diagonal="third", mask="causal"), "diagonal must be"),
        (lambda q, k, v: dict(chunk=0), "chunk must be a positive integer"),
        (lambda q, k, v: dict(q=q[..., :0, :], k=k[..., :0, :], v=v[..., :0, :]), "at least one key"),
    ],
)
def test_bad_input_raises_clear_error(rng, change, match):
    q, k, v = _qkv(rng, (2, 10), (2, 10))
    args = dict(q=q, k=k, v=v, beta=1.0)
    args.update(change(q, k, v))
    with pytest.raises(ValueError, match=match):
        quadrature_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_bad_types_raise_type_error(rng):
    q, k, v = _qkv(rng, (10,), (10,))
    with pytest.raises(TypeError, match="real floating"):
        quadrature_attention(q.astype(int), k.astype(int), v.astype(int), beta=1.0)
    with pytest.raises(TypeError, match="boolean"):
        quadrature_attention(q, k, v, beta=1.0, mask=np.ones((10, 10)))
    with pytest.raises(TypeError, match="chunk must be a positive integer, got 2.5"):
        quadrature_attention(q, k, v, beta=1.0, chunk=2.5)
    with pytest.raises(ValueError, match="as many queries as keys"):
        quadrature_attention(q[:5], k, v, beta=1.0, mask="causal")


@pytest.mark.cupy
def test_cupy_matches_numpy(rng):
    cupy = require("cupy")
    n = 300
    q, k, v = _qkv(rng, (2, 2, n), (2, 2, n), d=16, e=16)
    w = rng.uniform(0.5, 1.0, n)
    for kwargs in (dict(), dict(weights=w), dict(mask="causal", diagonal="half"), dict(mask="causal")):
        host = quadrature_attention(q, k, v, beta=np.array([0.5, 2.0]), **kwargs)
        dev_kwargs = {key: cupy.asarray(val) if isinstance(val, np.ndarray) else val for key, val in kwargs.items()}
        dev = quadrature_attention(*(cupy.asarray(a) for a in (q, k, v)), beta=cupy.asarray([0.5, 2.0]),
                                   chunk=64, **dev_kwargs)
        assert isinstance(dev, cupy.ndarray)
        assert _rel(cupy.asnumpy(dev), host) < 1e-12


# -- validation at the public entry (issue: nothing silently wrong) --------------------------------
@pytest.mark.parametrize("name", ["q", "k", "v", "weights"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused_naming_the_argument(rng, name, bad):
    q, k, v = _qkv(rng, (6,), (6,))
    args = dict(q=q, k=k, v=v, weights=np.full(6, 1 / 6))
    args[name] = args[name].copy()
    args[name][..., 2] = bad
    with pytest.raises(ValueError, match=rf"^{name} must be finite"):
        quadrature_attention(args.pop("q"), args.pop("k"), args.pop("v"), beta=1.0, **args)


@pytest.mark.parametrize("same, reductions", [("qkv", 1), ("qk", 2), ("kv", 2), ("qv", 2), ("", 3)])
def test_one_array_given_as_several_arguments_is_reduced_once(rng, monkeypatch, same, reductions):
    """The scale check takes max |a| once per distinct array (self-attention of a state, q is k
    is v, once); the maxima are those of each argument, and a NaN in a shared array is still
    refused under the first argument's name."""
    from ctformer._numerics import scale_safety

    x, y, z = (rng.standard_normal((5, 7, 3)) for _ in range(3))
    args = {"q": x, "k": x if "k" in same and "q" in same else y,
            "v": x if "v" in same and "q" in same else (y if same == "kv" else z)}
    calls = []
    real = scale_safety.global_abs_max
    monkeypatch.setattr(scale_safety, "global_abs_max", lambda xp, a: calls.append(a) or real(xp, a))
    amax = scale_safety.finite_abs_max(np, args["q"], args["k"], args["v"])
    assert len(calls) == reductions
    assert amax == tuple(float(np.abs(args[name]).max()) for name in "qkv")
    out = quadrature_attention(args["q"], args["k"], args["v"], beta=0.7)
    assert _rel(out, _torch_sdpa(args["q"], args["k"], args["v"], scale=0.7)) < 1e-13
    x[2, 3, 1] = np.nan  # x is always q
    with pytest.raises(ValueError, match="^q must be finite"):
        quadrature_attention(args["q"], args["k"], args["v"], beta=0.7)


def test_nan_value_with_causal_mask_is_refused_not_spread(rng, path):
    # the reproducer: v[5] = NaN with a causal mask made all six rows NaN without a word
    q, k, v = _qkv(rng, (6,), (6,))
    v[5] = np.nan
    with pytest.raises(ValueError, match="^v must be finite"):
        quadrature_attention(q, k, v, beta=1.0, mask="causal")
    # the five rows that do not see key 5 are what torch gives on the clean prefix
    out = quadrature_attention(q[:5], k[:5], v[:5], beta=1.0, mask="causal")
    assert _rel(out, _torch_sdpa(q[:5], k[:5], v[:5], scale=1.0, is_causal=True)) < 1e-13


def test_lists_are_accepted_as_array_likes(rng):
    q, k, v = _qkv(rng, (2, 7), (2, 7))
    w = rng.uniform(0.5, 1.5, 7)
    out = quadrature_attention(q.tolist(), k.tolist(), v.tolist(), beta=[0.5, 2.0], weights=w.tolist(),
                               mask="causal")
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    bias = np.log(w) + np.where(np.tril(np.ones((7, 7))) > 0, 0.0, -np.inf)
    for b, beta in enumerate((0.5, 2.0)):
        assert _rel(out[b], _torch_sdpa(q[b], k[b], v[b], scale=beta, bias=bias)) < 1e-13
    # integer lists are real numbers too
    ints = [[1, 0], [0, 1], [1, 1]]
    out = quadrature_attention(ints, ints, ints, beta=1.0)
    ref = _torch_sdpa(np.array(ints), np.array(ints), np.array(ints), scale=1.0)
    assert _rel(out, ref) < 1e-15


@pytest.mark.parametrize("beta", [True, "1", 1 + 0j, np.array([1j, 1.0])])
def test_beta_must_be_a_real_number(rng, beta):
    q, k, v = _qkv(rng, (2, 5), (2, 5))
    with pytest.raises(TypeError, match="beta must be a real number"):
        quadrature_attention(q, k, v, beta=beta)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_complex_input_is_refused(rng, name):
    q, k, v = _qkv(rng, (5,), (5,))
    args = dict(q=q, k=k, v=v)
    args[name] = args[name] + 1j
    with pytest.raises(TypeError, match=f"{name} must be real; complex"):
        quadrature_attention(args["q"], args["k"], args["v"], beta=1.0)
    args[name] = args[name].tolist()  # a list of complex numbers too
    with pytest.raises(TypeError, match=f"{name} must be real; complex"):
        quadrature_attention(args["q"], args["k"], args["v"], beta=1.0)


def test_unchecked_call_equals_checked_call(rng, path):
    # the solve's internal calls skip validation with check=False: same numbers, bit for bit
    q, k, v = _qkv(rng, (2, 3, 40), (2, 3, 40))
    w = rng.uniform(0.5, 1.5, 40)
    beta = np.array([0.5, 1.0, 2.0])
    keep = np.broadcast_to(rng.random((2, 1, 1, 40)) < 0.7, (2, 1, 40, 40)).copy()
    keep[..., 0] = True
    for kwargs in (dict(), dict(weights=w), dict(mask="causal", diagonal="half", weights=w), dict(mask=keep)):
        checked = quadrature_attention(q, k, v, beta=beta, **kwargs)
        unchecked = quadrature_attention(q, k, v, beta=beta, check=False, **kwargs)
        assert np.array_equal(checked, unchecked)
    bias = np.where(keep, 0.0, -np.inf)
    ref = _torch_sdpa(q, k, v, scale=1.0, bias=bias[:, 0:1])
    assert _rel(quadrature_attention(q, k, v, beta=1.0, mask=keep, check=False), ref) < 1e-13


# -- scale safety -------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["numpy", "torch"])
def test_unchecked_float32_call_stays_float32_with_float64_beta_and_weights(rng, path, namespace):
    # 1 / np.sqrt(d) is a NumPy float64: unchecked, it had turned float32 queries into
    # float64 ones in the batched path (a float64 result, at half the speed)
    q, k, v = (a.astype(np.float32) for a in _qkv(rng, (2, 3, 40), (2, 3, 40)))
    w = rng.uniform(0.5, 1.5, 40)
    betas = (np.float64(1 / np.sqrt(8)), np.array([0.5, 1.0, 2.0]), np.array(0.7))
    if namespace == "torch":
        torch = require("torch")
        q, k, v, w = (torch.from_numpy(a) for a in (q, k, v, w))
        betas = (betas[0], torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64))
    for beta in betas:
        for kwargs in (dict(), dict(weights=w), dict(mask="causal", weights=w)):
            checked = quadrature_attention(q, k, v, beta=beta, **kwargs)
            unchecked = quadrature_attention(q, k, v, beta=beta, check=False, **kwargs)
            assert unchecked.dtype == checked.dtype == q.dtype
            scale = np.asarray(beta, dtype=np.float64).reshape(-1, 1, 1)
            bias = np.zeros((40, 40)) if "weights" not in kwargs else np.broadcast_to(np.log(np.asarray(w)), (40, 40))
            if "mask" in kwargs:
                bias = bias + np.where(np.tril(np.ones((40, 40))) > 0, 0.0, -np.inf)
            ref = _torch_sdpa(np.asarray(q) * scale, k, v, scale=1.0, bias=bias)
            assert _rel(np.asarray(unchecked), ref) < 1e-5
def _hard_max(q, k, v, mask=None):
    """The beta -> infinity limit: the value of the best allowed key (float64)."""
    s = q.astype(np.float64) @ k.astype(np.float64).T
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    return v[np.argmax(s, axis=1)], np.sort(s, axis=1)


@pytest.mark.parametrize("causal", [False, True])
def test_huge_inputs_give_the_hard_max_not_nan(rng, path, causal):
    # 1e160: the scores (1e320) overflow float64; the exact answer is the hard-max limit
    n = 40
    q0, k0, v0 = _qkv(rng, (n,), (n,))
    mask = np.tril(np.ones((n, n), bool)) if causal else None
    out = quadrature_attention(1e160 * q0, 1e160 * k0, 1e160 * v0, beta=0.5, mask="causal" if causal else None)
    assert np.all(np.isfinite(out))
    hard, sorted_scores = _hard_max(q0, k0, v0, mask)
    clear = (sorted_scores[:, -1] - sorted_scores[:, -2] > 1e-12) | ~np.isfinite(sorted_scores[:, -2])
    assert clear.sum() > n // 2
    np.testing.assert_allclose(out[clear], 1e160 * hard[clear], rtol=1e-15, atol=0)


def test_tiny_inputs_keep_full_relative_accuracy(rng, path):
    # 1e-160: the scores (1e-320) vanish; the answer is the weighted mean of v, of size 1e-160
    n = 30
    q0, k0, v0 = _qkv(rng, (n,), (n,))
    w = rng.uniform(0.5, 1.5, n)
    out = quadrature_attention(1e-160 * q0, 1e-160 * k0, 1e-160 * v0, beta=2.0, weights=w)
    ref = (w @ v0) / w.sum()
    np.testing.assert_allclose(out / 1e-160, np.broadcast_to(ref, out.shape), rtol=1e-14)


def test_power_of_two_scaled_inputs_give_the_rescaled_answer(rng, path):
    # q 2^1000 and k 2^-1000 give exactly the scores of q, k (but q * beta alone would overflow);
    # v of size 2^1020 (~1e307) would overflow the sum over 50 keys without rescaling
    n = 50
    q, k, v = _qkv(rng, (2, n), (2, n))
    ref = _torch_sdpa(q, k, v, scale=1.7, is_causal=True)
    big_q, small_k, big_v = np.ldexp(q, 1000), np.ldexp(k, -1000), np.ldexp(v, 1020)
    out = quadrature_attention(big_q, small_k, big_v, beta=1.7, mask="causal")
    assert np.all(np.isfinite(out))
    assert _rel(np.ldexp(out, -1020), ref) < 1e-13
    # per-head scales far apart: each (batch, head) problem is scaled on its own
    q2 = np.stack([np.ldexp(q[0], 900), np.ldexp(q[1], -900)])
    k2 = np.stack([np.ldexp(k[0], -900), np.ldexp(k[1], 900)])
    out = quadrature_attention(q2, k2, v, beta=1.7, mask="causal")
    assert _rel(out, ref) < 1e-13


def test_float32_huge_inputs_are_finite(rng, path):
    n = 32
    q0, k0, v0 = _qkv(rng, (n,), (n,))
    q, k, v = (np.float32(1e30) * a.astype(np.float32) for a in (q0, k0, v0))
    out = quadrature_attention(q, k, v, beta=1.0)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    hard, sorted_scores = _hard_max(q.astype(np.float64) / 1e30, k.astype(np.float64) / 1e30, v0)
    clear = sorted_scores[:, -1] - sorted_scores[:, -2] > 1e-4
    np.testing.assert_allclose(out[clear] / np.float32(1e30), hard[clear], rtol=1e-6)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 3e-6)])
def test_masked_problems_of_many_heads_take_the_threaded_engine(monkeypatch, dtype, tol):
    # 4 x 12 (batch, head) problems of 128 queries against 255 keys under a sliding window of
    # 128 (a banded engine's slab): too many scores for one batched pass (1.6 M > 2^20), too
    # few per problem for the streamed engine's size rule; once left to array operations
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, (4, 12, 128), (4, 12, 255), d=16, e=16)
    rows, cols = np.arange(127, 255)[:, None], np.arange(255)[None, :]
    keep = (cols <= rows) & (cols > rows - 128)
    monkeypatch.setattr(qa_module, "_stream_generic", lambda *a: pytest.fail("the generic path"))
    calls, stream = [], numpy_paths.stream
    monkeypatch.setattr(numpy_paths, "stream", lambda *a, **kw: calls.append(1) or stream(*a, **kw))
    outs = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", threads)
        outs[threads] = quadrature_attention(*(a.astype(dtype) for a in (q, k, v)), beta=0.25, mask=keep)
    reference = _torch_sdpa(q, k, v, scale=0.25, bias=np.where(keep, 0.0, -np.inf))
    assert len(calls) == 2 and outs["1"].dtype == dtype
    assert np.abs(outs["1"] - reference).max() / np.abs(reference).max() < tol
    assert np.array_equal(outs["1"], outs["3"])
