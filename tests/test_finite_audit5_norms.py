"""LayerNorm with eps > 0 on feature-constant tokens (audit: finite inputs, finite outputs).

A constant token has zero variance, so with :math:`\\varepsilon > 0` LayerNorm gives exactly its
shift :math:`c(y)` (torch's float64 ``layer_norm`` gives 0 without a shift, for every d). The
library's mean of a constant token was off by its own rounding, which was then all of the
variance: ``(u - mean) / sqrt(var + eps)`` of rounding noise came out as +-1 (tokens of 1e30), or
0 / 0 = NaN where ``eps / s^2`` underflowed in the scale-safe path (float32 tokens of 1e30).
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import Grids, LayerNormProjection
from tests.conftest import require


def _shift(y):
    return 0.25 * np.cos(3.0 * y)


@pytest.mark.parametrize("value, dtype", [(v, t) for v in (1e30, 1e38, 1.0 / 3.0, 1e-30, 1e300)
                                           for t in ("float64", "float32") if t == "float64" or v < 3e38])
@pytest.mark.parametrize("features", ["midpoint", "gauss"])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_constant_tokens_give_the_shift(value, dtype, features, eps, loop_engine):
    """Constant float64 tokens of 1e30 on Midpoint(768) gave +-1 where the answer is the shift
    (NumPy engine); float32 ones gave NaN (general path, eps / s^2 underflowed to 0); now the
    shift exactly, on NumPy arrays and torch tensors alike."""
    torch = require("torch")
    d = 768 if features == "midpoint" else 37
    grid = Midpoint(d) if features == "midpoint" else GaussLegendre(d)
    grids = Grids(Midpoint(3), grid)
    shift = _shift(np.asarray(grid.nodes, dtype=np.float64)).astype(dtype)
    u = np.full((2, 3, d), value, dtype=dtype)
    norm = LayerNormProjection(1.0, _shift, eps)
    for state in (u, torch.from_numpy(u.copy())):
        got = np.asarray(norm(state, grids))
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got, np.broadcast_to(shift, got.shape))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_constant_token_matches_torch_layer_norm(dtype, loop_engine):
    """torch's own ``layer_norm`` (float64) gives 0 for a constant token of 0.1 over 768
    features; the library gave 8.8e-14 (eps=1e-5) and 2.8e-10 (eps=1e-12); now 0."""
    torch = require("torch")
    d = 768
    u = np.full((4, d), 0.1, dtype=dtype)
    expected = torch.nn.functional.layer_norm(torch.tensor(u, dtype=torch.float64), (d,), eps=1e-12).numpy()
    assert np.max(np.abs(expected)) == 0.0
    got = LayerNormProjection(1.0, 0.0, 1e-12)(u, Grids(Midpoint(4), Midpoint(d)))
    np.testing.assert_array_equal(got, expected.astype(dtype))


def test_constant_token_with_eps_zero_is_refused(loop_engine):
    """eps=0 on a constant token stays a named refusal (the projection onto S1 is undefined)."""
    u = np.full((2, 3, 768), 1e30)
    with pytest.raises(ValueError, match=r"eps=0: the token at index \(0, 0\).*Use eps > 0"):
        LayerNormProjection(1.0, 0.0, 0.0)(u, Grids(Midpoint(3), Midpoint(768)))


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_nearly_constant_tokens_stay_accurate(scale, loop_engine):
    """The corrected mean must not spoil a token with a variance: a float64 token
    scale * (1 + 1e-3 z) against the float64 two-pass formula in np.longdouble, to 1e-11
    (the conditioning |mean| / std = 1e3 times float64's precision)."""
    rng = np.random.default_rng(5)
    d = 96
    u = scale * (1.0 + 1e-3 * rng.standard_normal((3, d)))
    wide = u.astype(np.longdouble) / np.longdouble(scale)
    centred = wide - wide.mean(axis=-1, keepdims=True)
    expected = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + np.longdouble(1e-5) / scale ** 2)
    got = LayerNormProjection(1.0, 0.0, 1e-5)(u, Grids(Midpoint(3), Midpoint(d)))
    assert float(np.max(np.abs(got - expected.astype(np.float64)))) < 1e-11
