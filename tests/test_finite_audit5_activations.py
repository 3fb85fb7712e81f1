"""Activations at large finite arguments (audit: finite inputs, finite outputs).

References: the limits of the closed forms (:math:`\\phi(z) = z` to rounding for
:math:`z \\ge 10^4`, :math:`-0` or 0 for :math:`z \\le -10^4`) and mpmath at 60 digits for the
documented ends of SiLU's and the tanh GELU's relative accuracy, on both loop engines, for
one block and for arrays that the threads share.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

from ctformer.operators import gelu, gelu_tanh, relu, silu

BIG = {"float32": (1e4, 1e20, 1e30, 3e38), "float64": (1e4, 1e30, 1e300, 1.7e308)}


@pytest.mark.parametrize("phi", [gelu, gelu_tanh, silu, relu])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", [1, 300_000])
def test_large_arguments_give_the_limits(phi, dtype, size, loop_engine):
    """phi(z) = z for z >= 1e4 and phi(z) = 0 (sign aside) for z <= -1e4, never NaN or inf."""
    big = np.array(BIG[dtype], dtype=dtype)
    z = np.tile(np.concatenate([big, -big]), size)
    out = phi(z)
    assert out.dtype == z.dtype and np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[:big.size], big)
    np.testing.assert_array_equal(out[big.size:2 * big.size], np.zeros_like(big))


def _silu(z):
    z = mpmath.mpf(float(z))
    return z / (1 + mpmath.exp(-z))


@pytest.mark.parametrize("dtype, inside, outside, bound", [("float32", -88.71, -88.73, 2.6073e-37),
                                                           ("float64", -709.77, -709.79, 3.9483e-306)])
def test_silu_tail_as_documented(dtype, inside, outside, bound, loop_engine):
    """SiLU is relatively accurate down to where e^{-z} overflows (float32: -88.72) and -0
    below, where the exact value is at most the documented 2.6e-37 (float64: 3.9e-306)."""
    mpmath.mp.dps = 60
    z = np.array([inside, outside], dtype=dtype)
    got = silu(z)
    exact = [_silu(v) for v in z]
    assert abs(float(got[0]) - float(exact[0])) <= 1e-5 * abs(float(exact[0]))
    assert got[1] == 0.0 and np.signbit(got[1])
    assert abs(float(exact[1])) <= bound

