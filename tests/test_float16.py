"""Float16 states stay float16: every activation, every normalization, a whole solve.

The user's report: a float16 ``u0`` came back float64 (the GELU upcast). Each function is
checked against a float64 reference evaluated on the same float16 inputs; float16 keeps 11
significant bits, so a float32 evaluation rounded once is within one float16 ulp.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import Grids, LayerNormProjection, RMSNorm, SphereProjection, activations

from .conftest import require

REFERENCE = {  # float64 closed forms, independent of the library's paths
    "relu": lambda z: np.maximum(z, 0.0),
    "gelu": lambda z: z * special.ndtr(z),
    "gelu_tanh": lambda z: 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3))),
    "silu": lambda z: z * special.expit(z),
}


def _every_finite_float16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    return values[np.isfinite(values)]


def _within_one_ulp(out, reference):
    """|out - reference| <= the float16 spacing at the reference (subnormal spacing near 0)."""
    return np.abs(out.astype(np.float64) - reference) <= _ulp16(reference)


def _ulp16(x):
    """The float16 spacing at |x| (32 at the largest binade, whose spacing NumPy overflows)."""
    with np.errstate(over="ignore"):
        ulp = np.spacing(np.abs(x).astype(np.float16)).astype(np.float64)
    return np.where(np.isinf(ulp), 32.0, ulp)


@pytest.mark.parametrize("engine", ["numba", "numpy"])
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_activation_keeps_float16_within_an_ulp_on_every_float16(name, engine, monkeypatch):
    """All 63488 finite float16 numbers: the result is float16 and within one float16 ulp of
    the float64 formula (gelu: z ndtr(z) from SciPy) on the same inputs."""
    if engine == "numba":
        require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", engine)
    z = _every_finite_float16()
    phi = activations.ACTIVATIONS[name]
    out = phi(z)
    assert out.dtype == np.float16 and out.shape == z.shape
    reference = REFERENCE[name](z.astype(np.float64))
    good = _within_one_ulp(out, reference)
    worst = int(np.argmin(good))
    assert good.all(), f"{name}({z[worst]!r}) = {out[worst]!r}, float64 reference {reference[worst]!r}"
    # the reporter's case: a 2-D float16 state, large enough to take the threaded blocks
    block = np.resize(z[np.abs(z) < 8], (300, 700))
    assert phi(block).dtype == np.float16
    np.testing.assert_array_equal(phi(block), phi(block.astype(np.float32)).astype(np.float16))


def _grids(d=12):
    return Grids(Midpoint(5), Midpoint(d), Midpoint(4), Midpoint(6))


def _layer_norm_reference(u, gain, shift, eps):
    mean = u.mean(axis=-1, keepdims=True)
    var = ((u - mean) ** 2).mean(axis=-1, keepdims=True)
    return gain * (u - mean) / np.sqrt(var + eps) + shift


def _rms_reference(u, gain, eps):
    return gain * u / np.sqrt((u * u).mean(axis=-1, keepdims=True) + eps)


NORMALIZATIONS = {
    "layernorm": (lambda g, c: LayerNormProjection(gain=g, shift=c, eps=1e-5),
                  lambda u, g, c: _layer_norm_reference(u, g, c, 1e-5)),
    "layernorm-projection": (lambda g, c: LayerNormProjection(),
                             lambda u, g, c: _layer_norm_reference(u, 1.0, 0.0, 0.0)),
    "rmsnorm": (lambda g, c: RMSNorm(gain=g, eps=1e-6), lambda u, g, c: _rms_reference(u, g, 1e-6)),
    "sphere": (lambda g, c: SphereProjection(), lambda u, g, c: _rms_reference(u, 1.0, 0.0)),
}


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_every_normalization_keeps_float16_within_an_ulp(name):
    """LayerNorm (with and without gain, shift, eps), RMSNorm and the sphere projection on a
    float16 state on Midpoint(12) features: float16 results within one float16 ulp (plus
    float32 rounding, 2^-20 of the largest value) of the float64 formulas on the same inputs."""
    rng = np.random.default_rng(0)
    d = 12
    gain, shift = np.linspace(0.5, 1.5, d), np.linspace(-0.3, 0.3, d)
    make, formula = NORMALIZATIONS[name]
    u = (3 * rng.standard_normal((2, 5, d)) + 1).astype(np.float16)
    out = make(gain, shift)(u, _grids(d))
    assert out.dtype == np.float16 and out.shape == u.shape
    reference = formula(u.astype(np.float64), gain, shift)
    error = np.abs(out.astype(np.float64) - reference)
    assert np.all(error <= _ulp16(reference) + 2.0 ** -20 * np.abs(reference).max())


def test_a_float16_result_beyond_65504_raises_instead_of_becoming_inf():
    u = np.array([[1.0, -1.0, 2.0, -2.0]], dtype=np.float16)
    norm = LayerNormProjection(gain=1e5)
    grids = Grids(Midpoint(1), Midpoint(4), Midpoint(4), Midpoint(4))
    with pytest.raises(OverflowError, match="LayerNormProjection of a float16 state reaches .* 65504"):
        norm(u, grids)
    assert norm(u.astype(np.float32), grids).dtype == np.float32   # float32 is the remedy


@pytest.mark.parametrize("options", [{}, {"normalization": "rmsnorm", "feedforward": "swiglu"},
                                     {"activation": "gelu_tanh", "feedforward": "geglu"}])
def test_a_solve_with_a_float16_u0_returns_float16(options):
    """``solve`` and ``run`` with a float16 ``u0`` return float16, equal to the float64 solve
    of the same (float16) initial state to a few float16 ulps over two layers."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2, heads=2, **options)
    u0 = np.random.default_rng(0).standard_normal((2, 6, 8)).astype(np.float16)
    for compute in (lambda u: model.run(u),
                    lambda u: model.solve(u, tokens=Midpoint(6), features=GaussLegendre(8))):
        out, reference = compute(u0), compute(u0.astype(np.float64))
        assert out.dtype == np.float16 and reference.dtype == np.float64
        assert np.max(np.abs(out - reference)) < 4 * np.finfo(np.float16).eps * np.max(np.abs(reference))
