"""The choice of BLAS for the engines' products (ctformer._numerics.gemm): NumPy's or torch's,
measured once per machine and kept; every choice gives the product to rounding and the same
bits for every thread count."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from ctformer._numerics import blocks, gemm, gemm_measure, store, streamed, threads, torch_threads

from .conftest import require

torch = require("torch")


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("CTFORMER_GEMM", "mkl")
    with pytest.raises(ValueError, match="CTFORMER_GEMM must be one of auto, numpy, torch, got 'mkl'"):
        gemm.gemm_provider(np.float64)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
def test_torch_products_equal_numpy_to_rounding(monkeypatch, dtype, tol):
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((70, 33)).astype(dtype)
    b = rng.standard_normal((50, 33)).astype(dtype).T      # a transposed view, as K^T
    b.flags.writeable = False                               # read-only operands, as broadcasts
    out = np.empty((70, 50), dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # no "not writable" warning
        gemm.matmul(a, b, out)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(out - exact).max() / np.abs(exact).max() < tol


def test_one_torch_thread_is_restored():
    before = torch.get_num_threads()
    with gemm._one_torch_thread(torch):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_the_choice_is_measured_once_and_kept(fresh_store, monkeypatch):
    choice = gemm.gemm_provider(np.float32)
    files = list((fresh_store / "ctformer").glob("gemm-*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    entry = stored["products float32"]
    assert entry["provider"] == choice and entry["numpy_s"] > 0 and entry["torch_s"] > 0
    assert choice == ("torch" if entry["torch_s"] < gemm_measure._MARGIN * entry["numpy_s"] else "numpy")
    # a later process reads the stored choice instead of measuring: write the other one
    other = "numpy" if choice == "torch" else "torch"
    entry["provider"] = other
    files[0].write_text(json.dumps(stored))
    gemm.forget_choices()
    monkeypatch.setattr(gemm, "_measure_products", lambda dtype: pytest.fail("measured again"))
    assert gemm.gemm_provider(np.float32) == other
    # the softmax is measured only where torch does the products, into the same file
    softmax = gemm.softmax_provider(np.float32)
    stored = json.loads(files[0].read_text())
    if other == "torch":
        assert stored["softmax float32"]["provider"] == softmax
    else:
        assert softmax == "numpy" and "softmax float32" not in stored


def test_attention_products_follow_their_own_measurement(fresh_store, monkeypatch):
    """Scores and weighted sums each by the BLAS measured faster for their own shape (the
    entry of gemm_provider's measurement), or both by a pinned provider."""
    for dtype in (np.float32, np.float64):
        products = gemm.attention_products(dtype)
        path, = (fresh_store / "ctformer").glob("gemm-*.json")
        entry = json.loads(path.read_text())[f"products {np.dtype(dtype).name}"]
        for kind, product in zip(("scores", "weighted sums"), products):
            assert entry[kind] in ("numpy", "torch")
            assert product is (gemm.torch_matmul if entry[kind] == "torch" else np.matmul)
    monkeypatch.setattr(gemm, "_products_entry",
                        lambda name: {"provider": "numpy", "scores": "torch", "weighted sums": "numpy"})
    assert gemm.attention_products(np.float64) == (gemm.torch_matmul, np.matmul)
    assert gemm.attention_products(np.int64) == (np.matmul, np.matmul)   # not a measured dtype
    for pinned, product in (("numpy", np.matmul), ("torch", gemm.torch_matmul)):
        monkeypatch.setenv("CTFORMER_GEMM", pinned)
        assert gemm.attention_products(np.float64) == (product, product)


def test_a_damaged_file_is_measured_again(fresh_store):
    gemm.gemm_provider(np.float64)
    path, = (fresh_store / "ctformer").glob("gemm-*.json")
    path.write_text("{not json")
    gemm.forget_choices()
    with pytest.warns(UserWarning, match="cannot read the store of measured choices .* measured again"):
        assert gemm.gemm_provider(np.float64) in ("numpy", "torch")
    assert json.loads(path.read_text())["products float64"]["provider"] in ("numpy", "torch")


@pytest.mark.parametrize("provider", ["numpy", "torch", "torch scores", "torch sums"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal, weighted", [(False, False), (True, True)])
def test_streamed_attention_bits_do_not_depend_on_threads(monkeypatch, provider, dtype, causal, weighted):
    """Each provider (products and softmax), and each mixed choice of attention's products:
    the same bits with 1 and 3 worker threads, and the quadrature attention of a float64
    reference to rounding (causal with the half-weight diagonal, log w_j = log of non-uniform
    weights)."""
    if provider.startswith("torch "):
        scores = "torch" if provider == "torch scores" else "numpy"
        sums = "numpy" if scores == "torch" else "torch"
        monkeypatch.setattr(gemm, "_products_entry",
                            lambda name: {"provider": "numpy", "scores": scores, "weighted sums": sums})
        monkeypatch.setattr(gemm, "gemm_provider", lambda dtype: "numpy")
        monkeypatch.setenv("CTFORMER_GEMM", "auto")
        assert gemm.attention_products(dtype) == ((gemm.torch_matmul, np.matmul) if scores == "torch"
                                                  else (np.matmul, gemm.torch_matmul))
    else:
        monkeypatch.setenv("CTFORMER_GEMM", provider)
    rng = np.random.default_rng(7)
    n, d = 1500, 16
    q, k, v = (rng.standard_normal((2, n, d)).astype(dtype) for _ in range(3))
    w = rng.uniform(0.5, 2.0, n) if weighted else np.ones(n)
    log_w = np.log(w).astype(dtype) if weighted else None
    shift = np.log(0.5) if causal else None
    runs = []
    for count in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(streamed.stream(q, 0.25, k, v, log_w, None, causal, shift, (2,), 128))
    assert np.array_equal(runs[0], runs[1])
    s = 0.25 * np.einsum("bid,bjd->bij", q.astype(np.float64), k.astype(np.float64)) + np.log(w)
    if causal:
        s[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
        s[:, np.arange(n), np.arange(n)] += shift
    p = np.exp(s - s.max(-1, keepdims=True))
    exact = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    tol = 1e-13 if dtype == np.float64 else 2e-6
    assert np.abs(runs[0] - exact).max() / np.abs(exact).max() < tol
    if not causal:  # the keys in blocks of 512 (online softmax), where the kernels allow it
        geometry = blocks.Geometry(key_block=512, rows=128, chunk_bytes=8 << 20)
        in_blocks = []
        for count in ("1", "3"):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
            in_blocks.append(streamed.stream(q, 0.25, k, v, log_w, None, False, None, (2,), None, geometry))
        assert np.array_equal(*in_blocks)
        assert np.abs(in_blocks[0] - exact).max() / np.abs(exact).max() < tol


def test_feature_rows_use_the_choice_inside_workers_only(monkeypatch):
    """Without MKL's strict mode (tests/test_strict_mkl.py has it on), only worker tasks
    multiply by torch, a bias entering the product (one ``addmm``, no pass adding it after)."""
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    monkeypatch.setattr(torch_threads, "_STRICT_MKL", [False])
    calls = []
    mm, addmm = torch.mm, torch.addmm
    monkeypatch.setattr(torch, "mm", lambda *args, **kw: calls.append("mm") or mm(*args, **kw))
    monkeypatch.setattr(torch, "addmm", lambda *args, **kw: calls.append("addmm") or addmm(*args, **kw))
    rng = np.random.default_rng(3)
    a, b, bias = rng.standard_normal((4, 8, 3)), rng.standard_normal((3, 5)), rng.standard_normal(5)
    assert np.array_equal(gemm.rows_product(a, b), a @ b) and calls == []
    got = []

    def task(next_task):
        if next_task() is not None:
            monkeypatch.setattr(gemm, "plus_bias",
                                lambda out, bias: out if bias is None else pytest.fail("a bias pass"))
            got.extend([gemm.rows_product(a, b), gemm.rows_product(a, b, bias)])

    threads.run_workers(task, [1], 1)
    assert calls == ["mm", "addmm"]
    assert np.abs(got[0] - a @ b).max() < 1e-15 and np.abs(got[1] - (a @ b + bias)).max() < 1e-15


@pytest.mark.parametrize("provider", ["numpy", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_many_small_problems_by_either_provider(monkeypatch, provider, causal):
    """streamed.small_blocks (a batch of heads of 100 tokens): 1 vs 3 threads bit-identical,
    and the float64 reference to rounding, with non-uniform weights."""
    monkeypatch.setenv("CTFORMER_GEMM", provider)
    rng = np.random.default_rng(11)
    n, d = 100, 8
    q, k, v = (rng.standard_normal((3, 12, n, d)) for _ in range(3))
    w = rng.uniform(0.5, 2.0, n)
    shift = np.log(0.5) if causal else None
    runs = []
    for count in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(streamed.small_blocks(0.3 * q, k, v, np.log(w), causal, shift, (3, 12)))
    assert np.array_equal(runs[0], runs[1])
    s = 0.3 * q @ k.swapaxes(-1, -2) + np.log(w)
    if causal:
        s = np.where(np.tri(n, dtype=bool), s, -np.inf)
        s[..., np.arange(n), np.arange(n)] += shift
    p = np.exp(s - s.max(-1, keepdims=True))
    exact = (p / p.sum(-1, keepdims=True)) @ v
    assert np.abs(runs[0] - exact).max() / np.abs(exact).max() < 1e-14


def test_a_verdict_checked_on_other_shapes_is_measured_again(fresh_store):
    """A verdict stored by a version with other bounds (another bit-for-bit check) is not
    reused: the measurement runs again and the new record names what it checked."""
    calls = []

    def measure(dtype):
        calls.append(dtype)
        return {"provider": "compiled" if len(calls) > 1 else "numpy"}

    assert gemm._measured("test kind", "float64", measure, "shapes A") == "numpy"
    gemm.forget_choices()  # a later process
    assert gemm._measured("test kind", "float64", measure, "shapes A") == "numpy"
    assert len(calls) == 1  # read from the store
    gemm.forget_choices()
    assert gemm._measured("test kind", "float64", measure, "shapes B") == "compiled"
    assert len(calls) == 2
    stored = json.loads(store.cache_file().read_text())
    assert stored["test kind float64"] == {"provider": "compiled", "checked": "shapes B"}


@pytest.mark.parametrize("threaded", [True, False])
def test_the_rows_peer_is_the_product_the_rows_get_otherwise(monkeypatch, threaded):
    monkeypatch.setattr(gemm, "threaded_rows", lambda dtype: threaded)
    against, product = gemm.rows_peer(np.float64)
    assert against == ("torch" if threaded else "numpy")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((16, 96)), rng.standard_normal((40, 96)).T
    out = np.empty((16, 40))
    before = torch.get_num_threads()
    product(a, b, out)
    assert torch.get_num_threads() == before
    exact = a @ b
    if threaded:
        assert np.abs(out - exact).max() <= 1e-14 * np.abs(exact).max()
    else:
        assert np.array_equal(out, exact)


def test_prepared_products_are_timed_against_the_rows_peer(monkeypatch):
    """A prepared product must beat what the rows would get without it (torch's MKL where it
    multiplies them, as on an Intel Xeon), not NumPy's BLAS whatever the machine."""
    pytest.importorskip("numba")
    peer_calls = []

    def peer(a, b, out):
        peer_calls.append(a.shape)
        np.matmul(a, b, out=out)

    monkeypatch.setattr(gemm, "rows_peer", lambda dtype, threads=1: ("torch", peer))
    times = iter([1.0] * 9)  # each tile's kernel, then the peer, per timed shape: ratio 1 each
    monkeypatch.setattr(gemm, "_best", lambda call: (call(), next(times))[1])
    verdict = gemm._measure_few_rows(np.dtype(np.float64))
    assert verdict["against"] == "torch" and verdict["provider"] == "numpy" and verdict["ratio"] == 1.0
    assert len(peer_calls) == 3  # each timed shape once (the fake timer calls once)
