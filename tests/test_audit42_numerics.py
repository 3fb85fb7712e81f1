"""Audit 42 of the numerics fast paths: layouts, engines, thread counts, FFT plan reuse.

Each test compares against an independent float64 reference (the formula written out in
NumPy, or ``numpy.fft``); none of these found a defect, they pin the contracts audited.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.fft import PlannedFFT
from ctformer.operators import Grids, LayerNormProjection, quadrature_attention

RNG = np.random.default_rng(42)


def _attention_reference(q, k, v, beta, w, causal):
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = beta * q @ np.swapaxes(k, -1, -2) + np.log(w)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p @ v) / p.sum(axis=-1, keepdims=True)


def _layouts(a):
    """The values of ``a`` as a C array, a Fortran array, a view with negative strides, a
    strided view and a read-only array."""
    read_only = a.copy()
    read_only.flags.writeable = False
    return {"c": a, "fortran": np.asfortranarray(a), "negative": a[..., ::-1, ::-1].copy()[..., ::-1, ::-1],
            "strided": np.repeat(a, 2, axis=-1)[..., ::2], "read-only": read_only}


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 3e-5)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_layouts_match_the_formula(dtype, tol, causal, loop_engine):
    q, k, v = (RNG.standard_normal((2, 300, d)).astype(dtype) for d in (16, 16, 8))
    w = RNG.uniform(0.5, 1.5, 300)
    expected = _attention_reference(q, k, v, 0.7, w, causal)
    for name, qq in _layouts(q).items():
        before = qq.copy()
        got = quadrature_attention(qq, k, v, beta=0.7, weights=w, mask="causal" if causal else None)
        assert got.dtype == np.dtype(dtype), name
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < tol, name
        np.testing.assert_array_equal(qq, before)  # the input is never written


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_layer_norm_layouts_match_the_formula(dtype, loop_engine):
    d = 37
    grid = GaussLegendre(d)
    w = np.asarray(grid.quadrature_weights, np.float64) / grid.length
    u = (RNG.standard_normal((2, 9, d)) * 3 + 0.5).astype(dtype)
    x = u.astype(np.float64)
    centred = x - (x @ w)[..., None]
    expected = centred / np.sqrt((centred * centred) @ w + 1e-5)[..., None]
    norm = LayerNormProjection(eps=1e-5)
    for name, uu in _layouts(u).items():
        got = norm(uu, Grids(Midpoint(9), grid))
        assert np.max(np.abs(got - expected)) < (1e-13 if dtype == "float64" else 2e-6), name


def test_planned_fft_strided_and_repeated_calls_match_numpy(monkeypatch):
    """The fast path of a repeated call (keyed by shape and dtype) with other layouts of the
    same shape: each is read correctly, never the first call's buffer."""
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "fftw")
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "FFTW_ESTIMATE")
    fft = PlannedFFT()
    base = RNG.standard_normal((6, 16))
    views = {"c": base, "fortran": np.asfortranarray(base), "negative": base[:, ::-1].copy()[:, ::-1],
             "misaligned": np.concatenate([[0.0], base.ravel()])[1:].reshape(6, 16)}
    for name, x in views.items():
        for _ in range(2):
            got = fft.rfft(x)
            np.testing.assert_allclose(got, np.fft.rfft(base), rtol=0, atol=1e-13, err_msg=name)
            spectrum = np.asfortranarray(got) if name == "fortran" else got
            kept = spectrum.copy()
            np.testing.assert_allclose(fft.irfft(spectrum, n=16), base, rtol=0, atol=1e-14, err_msg=name)
            np.testing.assert_array_equal(spectrum, kept)  # c2r destroys its input: a copy only


def _grouped_solve(monkeypatch, threads, u0):
    monkeypatch.setenv("CTFORMER_NUM_THREADS", str(threads))
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    return np.asarray(model.solve(u0, tokens="midpoint:64", features="midpoint:16"))


def test_grouped_solve_same_bits_on_one_and_three_threads(monkeypatch):
    """Eight sequences of 64 tokens advance in sequence groups: the thread count changes no
    bit, the input is not written, and each sequence matches its own solve to rounding."""
    u0 = RNG.standard_normal((8, 64, 16))
    before = u0.copy()
    one = _grouped_solve(monkeypatch, 1, u0)
    three = _grouped_solve(monkeypatch, 3, u0)
    np.testing.assert_array_equal(one, three)
    np.testing.assert_array_equal(u0, before)
    alone = _grouped_solve(monkeypatch, 1, u0[5:6])
    assert np.max(np.abs(one[5:6] - alone)) < 1e-12


def test_threaded_torch_products_take_a_reversed_weight_matrix(monkeypatch):
    # outside worker tasks the torch branch made a torch view of b without the strides check
    # of the branch inside them: a weight matrix with negative strides raised in from_numpy
    from ctformer._numerics import gemm

    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    monkeypatch.setattr(gemm, "threaded_products", lambda: True)
    gemm.forget_choices()
    try:
        rng = np.random.default_rng(3)
        a, b = rng.standard_normal((512, 384)), rng.standard_normal((384, 1024))[:, ::-1]
        bias = rng.standard_normal(1024)
        assert gemm.uses_torch(a.dtype)
        out = gemm.rows_product(a, b, bias)
        assert np.max(np.abs(out - (a @ np.ascontiguousarray(b) + bias))) < 1e-12
    finally:
        monkeypatch.undo()
        gemm.forget_choices()
