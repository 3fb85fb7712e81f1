"""Half-precision values keep their dtype through the spectral transforms and the Galerkin
maps: computed in float32 and rounded once, checked against float64 on the same rounded inputs
(float16 keeps 11 significant bits, bfloat16 8, so the result is within one ulp of its dtype)."""
import numpy as np
import pytest
import torch

import ctformer.discretizations as d
from ctformer import ContinuousTransformer

POINTS = [0.05, 0.4, 0.77, 1.0]
HALVES = {
    "numpy-float16": (lambda v: v.astype(np.float16), 2.0 ** -11),
    "torch-float16": (lambda v: torch.tensor(v, dtype=torch.float16), 2.0 ** -11),
    "torch-bfloat16": (lambda v: torch.tensor(v, dtype=torch.bfloat16), 2.0 ** -8),
}
CALLS = {
    "fourier.interpolate": (d.Fourier(8), lambda disc, v: disc.interpolate(v, POINTS)),
    "chebyshev.interpolate": (d.Chebyshev(9), lambda disc, v: disc.interpolate(v, POINTS)),
    "chebyshev.coefficients": (d.Chebyshev(9), lambda disc, v: disc.coefficients(v)),
    "p1.interpolate": (d.P1(9), lambda disc, v: disc.interpolate(v, POINTS)),
    "p2.interpolate": (d.P2(9), lambda disc, v: disc.interpolate(v, POINTS)),
    "p1.to_quadrature": (d.P1(9), lambda disc, v: disc.to_quadrature(v)),
    "p2.to_quadrature": (d.P2(9), lambda disc, v: disc.to_quadrature(v)),
}


def _host64(a):
    return (a.float().numpy() if isinstance(a, torch.Tensor) else a).astype(np.float64)


@pytest.mark.parametrize("half", list(HALVES))
@pytest.mark.parametrize("call", list(CALLS))
def test_half_precision_keeps_its_dtype_and_one_ulp(call, half):
    # before: NumPy float16 came back float64 (Fourier, Chebyshev) or raised scipy.sparse's
    # "does not support dtype float16" (P1, P2); torch bfloat16 raised in the FFT
    disc, method = CALLS[call]
    make, ulp = HALVES[half]
    values = make(np.sin(np.arange(2 * disc.n).reshape(2, disc.n) + 0.3))
    out = method(disc, values)
    assert type(out) is type(values) and out.dtype == values.dtype
    reference = method(disc, _host64(values))      # float64 on the same rounded inputs
    np.testing.assert_allclose(_host64(out), reference, rtol=0, atol=ulp * np.abs(reference).max())


@pytest.mark.parametrize("disc", [d.P1(9), d.P2(9)], ids=repr)
def test_half_precision_galerkin_projection(disc):
    g = np.cos(3.0 * disc.quadrature_nodes)[None, :] * np.array([[1.0], [-0.5]])
    half = g.astype(np.float16)
    out = disc.from_quadrature(half)
    assert out.dtype == np.float16
    reference = disc.from_quadrature(half.astype(np.float64))
    np.testing.assert_allclose(out.astype(np.float64), reference, rtol=0, atol=2.0 ** -11 * np.abs(reference).max())


def test_float16_solve_on_galerkin_tokens_stays_float16():
    # before: ValueError from scipy.sparse (no float16) at the first projection
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    u0 = np.sin(np.add.outer(np.arange(5.0), 0.5 * np.arange(6.0))).astype(np.float16)
    grids = dict(tokens=d.P1(5), features=d.Midpoint(6))
    out = model.solve(u0, **grids)
    assert out.dtype == np.float16
    reference = model.solve(u0.astype(np.float64), **grids)
    # float16 arithmetic along a whole layer: a few ulps of the state's scale
    np.testing.assert_allclose(out.astype(np.float64), reference, rtol=0, atol=8 * 2.0 ** -11 * np.abs(reference).max())
